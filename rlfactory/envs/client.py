"""`EnvClient`: a client for AgentGym's HTTP environment protocol, usable on its own or behind the MCP bridge.

The protocol (one server per environment family):
    POST /create               -> {"id": N, "observation": ...}   (some servers answer a bare N)
    POST /reset  {id, data_idx} -> {"observation", "reward", "done", ...}
    POST /step   {id, action}   -> {"observation" | "state", "reward", "done", "score"?}
    GET  /observation?id=N      -> str (or {"observation": ...})
    POST /close  {id}
Per-environment variants differ in names only: the id key (`id`, or `env_idx` for WebShop / WebArena-style
servers) and the reset key (`data_idx`, or `session_id` for WebShop). `VARIANTS` holds the known ones;
`id_key` / `reset_key` override them.

`EnvClient` follows the `Env` protocol (`reset(task_id) -> StepResult`, `step`, `observe`, `close`), so the MCP
bridge (`envs/tools/agentgym_bridge.py`) serves it like any local environment. Transport failures raise
`EnvServerError` from the plain methods; the bridge turns them into observations.
Left out: retries and async calls (the bridge runs each call on a worker thread).
"""
from __future__ import annotations

import logging
from typing import Any

import httpx

from rlfactory.envs.types import StepResult
from rlfactory.errors import RLFactoryError

logger = logging.getLogger(__name__)

VARIANTS: dict[str, dict[str, str]] = {
    "webshop": {"id_key": "env_idx", "reset_key": "session_id"},
    "webarena": {"id_key": "env_idx", "reset_key": "idx"},
}


class EnvServerError(RLFactoryError):
    """The environment server could not be reached or answered with an error."""


class EnvClient:
    """One environment instance on an AgentGym-protocol server. Created on the server at the first `reset`."""

    def __init__(self, env: str, base_url: str, *, id_key: str | None = None, reset_key: str | None = None,
                 timeout_s: float = 60.0, create_body: dict[str, Any] | None = None):
        variant = VARIANTS.get(env.lower(), {})
        self.env = env
        self.base_url = base_url.rstrip("/")
        self.id_key = id_key or variant.get("id_key", "id")
        self.reset_key = reset_key or variant.get("reset_key", "data_idx")
        self.create_body = create_body or {}
        self.env_id: Any = None
        self.done = False
        self.score = 0.0
        self._last_observation = ""
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def __enter__(self) -> "EnvClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise EnvServerError(f"{self.env} server at {self.base_url}: {method} {path} failed ({e}); is the "
                                 "server running and is the URL right?") from e
        if response.status_code != 200:
            raise EnvServerError(f"{self.env} server at {self.base_url}: {method} {path} answered "
                                 f"{response.status_code}: {response.text[:300]}")
        try:
            return response.json()
        except ValueError:
            return response.text

    def create(self) -> Any:
        """Create the environment instance on the server; returns its id."""
        data = self._request("POST", "/create", json=self.create_body)
        if isinstance(data, dict):
            self.env_id = data.get("id", data.get(self.id_key))
            self._last_observation = str(data.get("observation", ""))
        else:
            self.env_id = data
        if self.env_id is None:
            raise EnvServerError(f"{self.env} server at {self.base_url}: /create returned no id: {data!r}")
        return self.env_id

    def _parse(self, data: Any) -> StepResult:
        if not isinstance(data, dict):
            return StepResult(observation=str(data))
        observation = data.get("observation", data.get("state", ""))
        reward = float(data.get("reward", 0.0) or 0.0)
        done = bool(data.get("done", False))
        # Servers without a `score` (TextCraft) signal success by reward: the best reward so far is the score.
        score = float(data["score"] or 0.0) if "score" in data else max(self.score, reward)
        extra = {k: v for k, v in data.items() if k not in ("observation", "state", "reward", "done", "score")}
        return StepResult(observation=str(observation), reward=reward, score=score, done=done, info=extra)

    def reset(self, task_id: int = 0) -> StepResult:
        if self.env_id is None:
            self.create()
        data = self._request("POST", "/reset", json={self.id_key: self.env_id, self.reset_key: int(task_id)})
        self.score, self.done = 0.0, False
        result = self._parse(data)
        if not result.observation:  # some servers answer reset with ids only; ask for the observation
            result.observation = self.observe()
        self.score, self.done = result.score, result.done
        self._last_observation = result.observation
        result.info.setdefault("task_id", int(task_id))
        return result

    def step(self, action: str) -> StepResult:
        if self.env_id is None:
            raise EnvServerError(f"{self.env}: call reset(task_id) before step")
        result = self._parse(self._request("POST", "/step", json={self.id_key: self.env_id, "action": action}))
        self.score, self.done = result.score, result.done
        self._last_observation = result.observation
        return result

    def observe(self) -> str:
        if self.env_id is None:
            return "No task yet: call reset(task_id) first."
        data = self._request("GET", "/observation", params={self.id_key: self.env_id})
        if isinstance(data, dict):
            return str(data.get("observation", data))
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


class BridgedEnv:
    """`EnvClient` for the MCP bridge: server failures become observations (a failed call is content for the
    model, not a crash), and a fresh HTTP client is made per episode."""

    def __init__(self, env: str, base_url: str, **kwargs: Any):
        self.client = EnvClient(env, base_url, **kwargs)

    def _guard(self, fn, *args) -> StepResult:
        try:
            return fn(*args)
        except EnvServerError as e:
            return StepResult(observation=f"Environment server error: {e}", info={"error": True})

    def reset(self, task_id: int = 0) -> StepResult:
        return self._guard(self.client.reset, task_id)

    def step(self, action: str) -> StepResult:
        return self._guard(self.client.step, action)

    def observe(self) -> str:
        try:
            return self.client.observe()
        except EnvServerError as e:
            return f"Environment server error: {e}"

    def close(self) -> None:
        self.client.close()
