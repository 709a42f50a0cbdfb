"""`EnvClient`: a client for AgentGym's HTTP environment protocol, usable on its own or behind the MCP bridge.

The protocol as AgentGym's own servers speak it (one server per environment family; the shapes seen from the real
TextCraft and BabyAI servers are in docs/environments.md):
    POST /create               -> {"id": N, ...}  (TextCraft: already reset to task N; some servers answer a bare N)
    POST /reset  {id, data_idx} -> {"observation", "reward", "done", ...}
    POST /step   {id, action}   -> {"observation" | "state", "reward", "done", "score"?}
    GET  /observation?id=N      -> a bare string, or {"observation": ...}
    POST /close  {id}           -> true / false
    GET  /                      -> a greeting (the health check)
Errors come back as HTTP 200 with `{"error": "..."}` (e.g. "The id 7 is not valid." once the server dropped the
instance, "The task with environment 1 has finished." when stepping after done); `EnvClient` raises them as
`EnvReplyError` with the server's message. It also keeps AgentGym's episode rules the servers do not all keep:
- a `reset` whose instance the server no longer knows creates a new instance and resets that (once);
- a `step` after `done` is answered as done (reward 0, the score so far) without asking the server: TextCraft's
  `done` is not sticky and BabyAI answers an error there;
- a `step` or `observe` after a failed `reset` is refused without asking the server (`EnvResetFailed`): the
  episode has no task there (TextCraft's instance still plays its previous task, BabyAI's answers a bare KeyError);
- every result carries the `task_id` of the episode.

A restarted server reuses instance ids (from 0 again, and it says nothing about who it is), so before acting on its
instance a client makes sure the instance is still its own:
- its epoch (`rlfactory/envs/restarts.py`) is still the server's: no `create` of this host showed a restart since,
  and no request failed at the connection;
- `sentinel` (the bridge's default; TextCraft, BabyAI): the process's sentinel instance, which a restarted server
  gives away before any of its episodes' ids, still shows its own observation (`rlfactory/envs/sentinel.py`): this
  sees restarts no request of this host saw. One request per call;
- `verify_owner` (default on): the instance's `GET /observation` is still what this episode last saw. AgentGym's
  servers show there the last observation they sent (BabyAI with its goal in front): one request per step (plus
  one after the reset and the first step, to learn that); a server that does not costs a second read after each
  step, and one whose observation changes between two reads gets no such check.
An instance that fails a check is never acted on again: the call fails with `EnvInstanceLost`, an infrastructure
failure (kept out of the loss), and `reset` starts over on a new instance; it is closed only when a mere suspicion
(a failed connection) moved the epoch and it still shows what the episode last saw. What is left: a restart landing
between the checks and the action (one round trip); without a sentinel, a restart no process of this host saw whose
new instance at the same id shows exactly what this episode last saw (same task, same last answer: likely within a
GRPO group).
Per-environment variants differ in names only: the id key (`id`, or `env_idx` for WebShop / WebArena-style
servers) and the reset key (`data_idx`, or `session_id` for WebShop). `VARIANTS` holds the known ones;
`id_key` / `reset_key` override them.

`EnvClient` follows the `Env` protocol (`reset(task_id) -> StepResult`, `step`, `observe`, `close`), so the MCP
bridge (`envs/tools/agentgym_bridge.py`) serves it like any local environment; its errors are `EnvError`s, which
the env MCP servers answer as error results (a failed reset makes the trajectory an error, never an observation).
Left out: retries of transport failures and async calls (the bridge runs each call on a worker thread).
"""
from __future__ import annotations

import logging
import os
from typing import Any

import httpx

from rlfactory.envs.restarts import RestartWatch, watch_for
from rlfactory.envs.sentinel import SENTINELS
from rlfactory.envs.types import (  # noqa: F401 - the server errors are part of this module's API
    EnvError,
    EnvInstanceLost,
    EnvReplyError,
    EnvResetFailed,
    EnvServerError,
    EnvUnreachable,
    StepResult,
)

logger = logging.getLogger(__name__)

VARIANTS: dict[str, dict[str, str]] = {
    "webshop": {"id_key": "env_idx", "reset_key": "session_id"},
    "webarena": {"id_key": "env_idx", "reset_key": "idx"},
}
OVER = "The episode is over: call reset(task_id) to start a new task."
CONNECTION_LOST = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
"""Transport failures that mean the server process went away (refused, or dropped under a request); a timeout
does not count (the server may only be slow)."""
KEEPALIVE_S = 1.0
"""Idle connections are not reused past this: below uvicorn's 5 s, so the server never closes one as it is reused
(which would read as a lost connection)."""


def check_upstream(base_url: str, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Whether an AgentGym-protocol server answers at `base_url` (`GET /`, which AgentGym's servers answer with a
    greeting): (ok, what it said or why not). Any answer below 500 counts: the server is up, even without `/`."""
    url = base_url.rstrip("/") + "/"
    try:
        response = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as e:
        return False, f"{url} is unreachable ({type(e).__name__}: {e}); is the AgentGym server running there?"
    if response.status_code >= 500:
        return False, f"{url} answered {response.status_code}: {response.text[:200]}"
    return True, f"{url} answered {response.status_code}: {response.text[:200]}"


def _repeats(current: str, seen: str) -> bool:
    """Whether the server's current observation is `seen` (or ends with it: BabyAI puts the goal in front)."""
    return bool(seen.strip()) and current.rstrip().endswith(seen.rstrip())


class EnvClient:
    """One environment instance on an AgentGym-protocol server. Created on the server at the first `reset`.
    `verify_owner`: check the instance's observation before acting; `sentinel`: keep the process's sentinel instance
    and check it before acting (see the module docstring); `state_dir`: where the host's restart record lives
    (default: the system temp folder)."""

    def __init__(self, env: str, base_url: str, *, id_key: str | None = None, reset_key: str | None = None,
                 timeout_s: float = 60.0, create_body: dict[str, Any] | None = None, verify_owner: bool = True,
                 sentinel: bool = False, state_dir: str | os.PathLike | None = None):
        variant = VARIANTS.get(env.lower(), {})
        self.env = env
        self.base_url = base_url.rstrip("/")
        self.id_key = id_key or variant.get("id_key", "id")
        self.reset_key = reset_key or variant.get("reset_key", "data_idx")
        self.create_body = create_body or {}  # TextCraft's /create needs a body ({} will do): no body is a 422
        self.verify_owner = verify_owner
        self.sentinel = sentinel
        self.env_id: Any = None
        self.task_id: int | None = None
        self.done = False
        self.score = 0.0
        self.watch: RestartWatch = watch_for(self.base_url, state_dir)
        self._epoch: str | None = None  # the server epoch the instance was created in
        self._seen: tuple[str, bool] | None = None  # what the episode last saw there: (text, exact) or suffix
        self._lost: str | None = None  # why the instance is not this episode's any more
        self._reset_failed: tuple[int, str] | None = None
        self._echoes: dict[str, bool] = {}  # "reset" / "step": whether GET /observation repeats what it answered
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s,
                                  limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S))

    def __enter__(self) -> "EnvClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def where(self) -> str:
        return f"{self.env} server at {self.base_url}"

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        where = f"{self.where}: {method} {path}"
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            if isinstance(e, CONNECTION_LOST):
                self.watch.connection_lost(f"{method} {path} failed ({type(e).__name__}: {e})")
            raise EnvUnreachable(f"{where} failed ({type(e).__name__}: {e}); is the server running and is the URL "
                                 "right?") from e
        if response.status_code != 200:
            raise EnvReplyError(f"{where} answered {response.status_code}: {response.text[:300]}",
                                response.text[:300])
        try:
            data = response.json()
        except ValueError:
            return response.text
        if isinstance(data, dict) and "error" in data:
            message = str(data["error"])
            raise EnvReplyError(f"{where} answered with an error: {message}", message)
        return data

    def create(self) -> Any:
        """Create the environment instance on the server; returns its id."""
        if self.sentinel:
            SENTINELS.ensure(self)  # first, so that its id is below this instance's
        before = self.watch.before_create()
        data = self._request("POST", "/create", json=self.create_body)
        env_id = data.get("id", data.get(self.id_key)) if isinstance(data, dict) else data
        if env_id is None or isinstance(env_id, (dict, list)):
            raise EnvServerError(f"{self.where}: /create returned no id: {data!r}")
        placed = self.watch.created(before, env_id)
        if placed.epoch is None:
            raise EnvInstanceLost(f"{self.where}: {placed.why}; its instance {env_id} is left alone (the id may be "
                                  "another episode's). Call reset(task_id) again.")
        self.env_id, self._epoch, self._seen, self._lost = env_id, placed.epoch, None, None
        return env_id

    def _forget(self) -> None:
        """Let go of the instance without closing it (it is gone, or another episode's)."""
        self.env_id, self._epoch, self._seen, self._lost = None, None, None, None

    # ---- is the instance still this episode's? --------------------------------------------------------------
    def _observation(self) -> str:
        data = self._request("GET", "/observation", params={self.id_key: self.env_id})
        if isinstance(data, dict):
            if "observation" not in data:
                raise EnvServerError(f"{self.where}: GET /observation answered {data!r}, with no observation")
            return str(data["observation"])
        return str(data)

    def _lose(self, why: str) -> EnvInstanceLost:
        if self._lost is None:
            logger.warning("%s: instance %s (task %s) is not this episode's any more: %s", self.where, self.env_id,
                           self.task_id, why)
        self._lost = why
        return EnvInstanceLost(
            f"{self.where}: instance {self.env_id} of this episode (task {self.task_id}) is not this episode's any "
            f"more: {why}. Nothing was sent to it; the episode cannot go on (an infrastructure failure, kept out of "
            "training); reset(task_id) starts again on a new instance.")

    def _gone(self) -> str | None:
        """Why the instance may not be acted on (lost, an older epoch, or the process's sentinel shows a restart),
        or None."""
        if self._lost is not None:
            return self._lost
        if self._epoch is None:
            return None
        if self.sentinel:  # first: after a mere suspicion, the sentinel tells whether the server really restarted
            why = SENTINELS.check(self, self._epoch, self.env_id)
            if why is not None:
                return why
        if self._epoch != self.watch.epoch():
            return self.watch.why_gone(self._epoch)
        return None

    def _owned(self) -> str:
        """The instance's current observation, checked against what this episode last saw (raises
        `EnvInstanceLost` when it differs)."""
        current = self._observation()
        if self._seen is not None:
            text, exact = self._seen
            if not (current == text if exact else _repeats(current, text)):
                raise self._lose("its observation changed without an action of this episode (the server restarted "
                                 "and gave its id to another episode, or another client acts on it)")
        return current

    def _usable(self, what: str) -> None:
        """Raise unless `what` (step, observe) may be sent for this episode."""
        if self._reset_failed is not None:
            task_id, error = self._reset_failed
            raise EnvResetFailed(f"{self.where}: this episode's reset(task_id={task_id}) failed ({error}), so it has "
                                 f"no task on the server; the {what} was not sent: call reset(task_id) again.")
        if self.env_id is None:
            raise EnvServerError(f"{self.env}: call reset(task_id) before {what}")
        why = self._gone()
        if why is not None:
            raise self._lose(why)

    def _blocker(self, reuse: bool = False) -> str | None:
        """Why the instance must not be closed (`reuse`: reset for a new episode), or None: it is gone, or cannot
        be shown to be this episode's."""
        if self._lost is not None:
            return self._lost
        why = self._gone()
        if why is not None and reuse:
            return why
        if why is not None:  # an older epoch: closed only if it was merely suspect and still shows our observation
            if self.watch.gone_for_sure(self._epoch or "") or self._seen is None or not self.verify_owner:
                return why
        elif self._seen is None or not self.verify_owner:
            return None  # nothing to compare (the reset failed, or checks are off): the epoch is all there is
        try:
            self._owned()
        except EnvInstanceLost:
            return self._lost
        except EnvReplyError as e:
            if "has finished" in e.message and self.done:  # BabyAI's observation after done
                return None
            return f"the server did not show it ({e.message})"
        except EnvServerError as e:
            return f"the server did not show it ({e})"
        return None

    def _release(self) -> None:
        """Close the instance on the server if it is still this episode's, and let go of it either way."""
        try:
            why = self._blocker()
            if why is not None:
                logger.info("%s: not closing instance %s: %s", self.where, self.env_id, why)
            else:
                self._request("POST", "/close", json={self.id_key: self.env_id})
        except EnvServerError as e:
            logger.warning("closing %s env %s failed: %s", self.env, self.env_id, e)
        self._forget()

    def _saw(self, call: str, observation: str) -> None:
        """Remember what the episode saw after `call` (reset, step): the baseline of the next check."""
        if not self.verify_owner:
            return
        if self._echoes.get(call):
            self._seen = (observation, False)
            return
        try:
            current = self._observation()
        except EnvReplyError:
            if not self.done:
                raise
            self._seen = None  # BabyAI shows nothing after done; nothing more is sent but the close
            return
        if call not in self._echoes:  # learnt once per client, on the instance it just acted on
            self._echoes[call] = _repeats(current, observation)
            if not self._echoes[call] and self._observation() != current:
                # The observation changes by itself (a live page, a clock): nothing stable to compare.
                logger.warning("%s: GET /observation changes between two reads; the ownership check is off for "
                               "this episode", self.where)
                self.verify_owner, self._seen = False, None
                return
        self._seen = (current, True)

    # ---- the Env protocol -----------------------------------------------------------------------------------
    def _reset_request(self, task_id: int) -> Any:
        return self._request("POST", "/reset", json={self.id_key: self.env_id, self.reset_key: int(task_id)})

    def reset(self, task_id: int = 0) -> StepResult:
        self._reset_failed = None
        if self.env_id is not None and self._blocker(reuse=True) is not None:
            self._release()  # a new instance for the new episode; the old one is closed if it is still ours
        fresh = self.env_id is None
        try:
            if fresh:
                self.create()
            try:
                data = self._reset_request(task_id)
            except EnvReplyError as e:
                if fresh:
                    raise
                # The server no longer knows the instance (it drops idle or surplus ones: "The id 7 is not valid."):
                # make a new one and reset that, once. A second failure is the server's answer to this task.
                logger.info("%s: reset of instance %s failed (%s); creating a new instance", self.env, self.env_id,
                            e.message)
                self._forget()
                self.create()
                data = self._reset_request(task_id)
            self.task_id, self.score, self.done = int(task_id), 0.0, False
            result = self._parse(data, "/reset")
            if not result.observation:  # some servers answer reset with ids only; ask for the observation
                result.observation = self._observation()
            self._saw("reset", result.observation)
        except EnvError as e:
            self.task_id, self.score, self.done = int(task_id), 0.0, False
            self._reset_failed = (int(task_id), e.message if isinstance(e, EnvReplyError)
                                  else str(e).removeprefix(f"{self.where}: "))
            raise
        self.score, self.done = result.score, result.done
        return result

    def step(self, action: str) -> StepResult:
        if self.done and self._reset_failed is None and self.env_id is not None:
            return StepResult(observation=OVER, score=self.score, done=True, info={"task_id": self.task_id})
        self._usable("step")
        if self.verify_owner and self._seen is not None:
            self._owned()
        try:
            data = self._request("POST", "/step", json={self.id_key: self.env_id, "action": action})
        except EnvReplyError as e:
            if "has finished" not in e.message:  # BabyAI's answer to a step after done
                raise
            self.done = True
            return StepResult(observation=OVER, score=self.score, done=True, info={"task_id": self.task_id})
        result = self._parse(data, "/step")
        self.score, self.done = result.score, result.done
        self._saw("step", result.observation)
        return result

    def observe(self) -> str:
        if self.env_id is None and self._reset_failed is None:
            return "No task yet: call reset(task_id) first."
        self._usable("observe")
        return self._owned() if self.verify_owner else self._observation()

    def close(self, timeout_s: float | None = None) -> None:
        """Close the instance on the server (best effort; `timeout_s` bounds the requests) and the HTTP connection.
        An instance that is gone or not shown to be this episode's is left alone: its id may be another's."""
        if self.env_id is not None:
            if timeout_s is not None:
                self._http.timeout = httpx.Timeout(timeout_s)
            self._release()
        self._http.close()

    def _parse(self, data: Any, what: str) -> StepResult:
        if isinstance(data, str):  # a server that answers with the observation alone
            return StepResult(observation=data, score=self.score, info={"task_id": self.task_id})
        if not isinstance(data, dict):
            raise EnvServerError(f"{self.where}: {what} answered {data!r}, not an object with an observation")
        observation = data.get("observation", data.get("state", ""))
        reward = float(data.get("reward", 0.0) or 0.0)
        done = bool(data.get("done", False))
        # Servers without a `score` (TextCraft) signal success by reward: the best reward so far is the score.
        score = float(data["score"] or 0.0) if "score" in data else max(self.score, reward)
        extra = {k: v for k, v in data.items() if k not in ("observation", "state", "reward", "done", "score")}
        extra["task_id"] = self.task_id
        return StepResult(observation=str(observation), reward=reward, score=score, done=done, info=extra)
