"""Serve one of our environments over AgentGym's HTTP env protocol (FastAPI + uvicorn on 127.0.0.1).

Run: `python -m rlfactory.envs.tools.agentgym_http_server --env textcraft --port 36001 [--id-key env_idx]`.
It lets `EnvClient` and the MCP bridge be exercised against a real server, and lets AgentGym's own clients use our
TextCraft / BabyAI / Deep Search. Endpoints: POST /create, /reset {id, data_idx}, /step {id, action},
GET /observation?id=, POST /close {id}; `--id-key env_idx` serves the WebShop-style variant of the id field.
Left out: authentication (bind to 127.0.0.1 only).
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import threading
from typing import Any, Callable

import uvicorn
from fastapi import Body, FastAPI, HTTPException, Query

from rlfactory.envs.episodes import EpisodeRegistry
from rlfactory.envs.types import Env, StepResult

ENVS: dict[str, str] = {
    "textcraft": "rlfactory.envs.textcraft:TextCraftEnv",
    "babyai": "rlfactory.envs.babyai:BabyAIEnv",
    "deepsearch": "rlfactory.envs.deepsearch:DeepSearchEnv",
    "sciworld": "rlfactory.envs.sciworld:SciWorldEnv",
}


def env_factory(name: str) -> Callable[[], Env]:
    module, _, attr = ENVS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def make_app(env_name: str, id_key: str = "id", max_episodes: int = 1024):
    registry: EpisodeRegistry[Env] = EpisodeRegistry(env_factory(env_name), max_episodes=max_episodes)
    ids = itertools.count()
    ids_lock = threading.Lock()
    app = FastAPI(title=f"rlfactory {env_name} (AgentGym protocol)")

    def episode(body: dict[str, Any]):
        key = body.get(id_key)
        ep = registry.get(str(key)) if key is not None else None
        if ep is None:
            raise HTTPException(404, f"no environment with {id_key}={key!r}: POST /create first")
        return ep

    def payload(result: StepResult, **extra: Any) -> dict[str, Any]:
        return {"observation": result.observation, "reward": result.reward, "score": result.score,
                "done": result.done, **extra}

    @app.get("/")
    def hello() -> str:
        return f"This is environment {env_name} (rlfactory)."

    @app.post("/create")
    def create(body: dict[str, Any] | None = Body(default=None)) -> dict[str, Any]:
        with ids_lock:
            env_id = next(ids)
        ep = registry.open(str(env_id))
        with ep.lock:
            result = ep.env.reset(0)
        return {"id": env_id, id_key: env_id, **payload(result)}

    @app.post("/reset")
    def reset(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        ep = episode(body)
        idx = body.get("data_idx", body.get("session_id", body.get("idx", 0)))
        with ep.lock:
            result = ep.env.reset(int(idx))
        return payload(result, **{id_key: body[id_key]})

    @app.post("/step")
    def step(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        ep = episode(body)
        with ep.lock:
            result = ep.env.step(str(body.get("action", "")))
        return payload(result)

    @app.get("/observation")
    def observation(id: int | None = Query(None), env_idx: int | None = Query(None)) -> str:
        ep = episode({id_key: id if id_key == "id" else env_idx})
        with ep.lock:
            return ep.env.observe()

    @app.post("/close")
    def close(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        return {"closed": registry.close(str(body.get(id_key)))}

    app.state.registry = registry
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=sorted(ENVS), default="textcraft")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=36001)
    p.add_argument("--id-key", default="id", help="name of the instance id field: id (default) or env_idx")
    p.add_argument("--max-episodes", type=int, default=1024)
    args = p.parse_args()

    uvicorn.run(make_app(args.env, args.id_key, args.max_episodes), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
