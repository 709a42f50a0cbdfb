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
- every result carries the `task_id` of the episode.
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
from typing import Any

import httpx

from rlfactory.envs.types import EnvError, StepResult

logger = logging.getLogger(__name__)

VARIANTS: dict[str, dict[str, str]] = {
    "webshop": {"id_key": "env_idx", "reset_key": "session_id"},
    "webarena": {"id_key": "env_idx", "reset_key": "idx"},
}
OVER = "The episode is over: call reset(task_id) to start a new task."


class EnvServerError(EnvError):
    """The environment server could not be reached or answered with an error."""


class EnvUnreachable(EnvServerError):
    """The server could not be reached (connection refused, timeout): an infrastructure failure."""

    infra = True


class EnvReplyError(EnvServerError):
    """The server answered, with an error: `{"error": ...}` (AgentGym's way, HTTP 200) or a non-200 status.
    `message` is the server's own text."""

    def __init__(self, text: str, message: str):
        super().__init__(text)
        self.message = message


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


class EnvClient:
    """One environment instance on an AgentGym-protocol server. Created on the server at the first `reset`."""

    def __init__(self, env: str, base_url: str, *, id_key: str | None = None, reset_key: str | None = None,
                 timeout_s: float = 60.0, create_body: dict[str, Any] | None = None):
        variant = VARIANTS.get(env.lower(), {})
        self.env = env
        self.base_url = base_url.rstrip("/")
        self.id_key = id_key or variant.get("id_key", "id")
        self.reset_key = reset_key or variant.get("reset_key", "data_idx")
        self.create_body = create_body or {}  # TextCraft's /create needs a body ({} will do): no body is a 422
        self.env_id: Any = None
        self.task_id: int | None = None
        self.done = False
        self.score = 0.0
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def __enter__(self) -> "EnvClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        where = f"{self.env} server at {self.base_url}: {method} {path}"
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
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
        data = self._request("POST", "/create", json=self.create_body)
        self.env_id = data.get("id", data.get(self.id_key)) if isinstance(data, dict) else data
        if self.env_id is None or isinstance(self.env_id, (dict, list)):
            raise EnvServerError(f"{self.env} server at {self.base_url}: /create returned no id: {data!r}")
        return self.env_id

    def _parse(self, data: Any, what: str) -> StepResult:
        if isinstance(data, str):  # a server that answers with the observation alone
            return StepResult(observation=data, score=self.score, info={"task_id": self.task_id})
        if not isinstance(data, dict):
            raise EnvServerError(f"{self.env} server at {self.base_url}: {what} answered {data!r}, not an object "
                                 "with an observation")
        observation = data.get("observation", data.get("state", ""))
        reward = float(data.get("reward", 0.0) or 0.0)
        done = bool(data.get("done", False))
        # Servers without a `score` (TextCraft) signal success by reward: the best reward so far is the score.
        score = float(data["score"] or 0.0) if "score" in data else max(self.score, reward)
        extra = {k: v for k, v in data.items() if k not in ("observation", "state", "reward", "done", "score")}
        extra["task_id"] = self.task_id
        return StepResult(observation=str(observation), reward=reward, score=score, done=done, info=extra)

    def _reset_request(self, task_id: int) -> Any:
        return self._request("POST", "/reset", json={self.id_key: self.env_id, self.reset_key: int(task_id)})

    def reset(self, task_id: int = 0) -> StepResult:
        fresh = self.env_id is None
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
            self.env_id = None
            self.create()
            data = self._reset_request(task_id)
        self.task_id, self.score, self.done = int(task_id), 0.0, False
        result = self._parse(data, "/reset")
        if not result.observation:  # some servers answer reset with ids only; ask for the observation
            result.observation = self.observe()
        self.score, self.done = result.score, result.done
        return result

    def step(self, action: str) -> StepResult:
        if self.env_id is None:
            raise EnvServerError(f"{self.env}: call reset(task_id) before step")
        if self.done:
            return StepResult(observation=OVER, score=self.score, done=True, info={"task_id": self.task_id})
        try:
            data = self._request("POST", "/step", json={self.id_key: self.env_id, "action": action})
        except EnvReplyError as e:
            if "has finished" not in e.message:  # BabyAI's answer to a step after done
                raise
            self.done = True
            return StepResult(observation=OVER, score=self.score, done=True, info={"task_id": self.task_id})
        result = self._parse(data, "/step")
        self.score, self.done = result.score, result.done
        return result

    def observe(self) -> str:
        if self.env_id is None:
            return "No task yet: call reset(task_id) first."
        data = self._request("GET", "/observation", params={self.id_key: self.env_id})
        if isinstance(data, dict):
            if "observation" not in data:
                raise EnvServerError(f"{self.env} server at {self.base_url}: GET /observation answered {data!r}, "
                                     "with no observation")
            return str(data["observation"])
        return str(data)

    def close(self) -> None:
        """Close the instance on the server (best effort) and the HTTP connection."""
        if self.env_id is not None:
            try:
                self._request("POST", "/close", json={self.id_key: self.env_id})
            except EnvServerError as e:
                logger.warning("closing %s env %s failed: %s", self.env, self.env_id, e)
            self.env_id = None
        self._http.close()
