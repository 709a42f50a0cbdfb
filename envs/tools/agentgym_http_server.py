"""Serve one of our environments over AgentGym's HTTP env protocol (FastAPI + uvicorn on 127.0.0.1), answering as
AgentGym's own servers do, quirks included, so that `EnvClient`, the MCP bridge and their tests meet what users meet.

Run: `python -m rlfactory.envs.tools.agentgym_http_server --env textcraft --port 36001 [--id-key env_idx]`.
Endpoints: POST /create, /reset {id, data_idx}, /step {id, action}, GET /observation?id=, POST /close {id}, GET /.
`--flavor` picks whose reply shapes to copy (default: textcraft's for TextCraft, BabyAI's for the others):

| call | textcraft | babyai |
|---|---|---|
| POST /create | body required (no body: 422); `{id, observation, done, reward}`, reset to task `id` | `{id}` |
| POST /reset | `{id, observation, done, reward}` | `{observation, reward, score, deleted, done}` |
| POST /step | `{observation, reward, done}`; `done` is not sticky (a step after a win says false) | adds `score`; (1) |
| GET /observation | a bare JSON string: the last observation sent (reset's or step's) | `{"observation", ...}` (2) |
| POST /close | `true` / `false` | `true` / `false` |

(1) a step after done answers `{"error": "The task with environment N has finished."}`; a step before any reset
answers the bare text of the KeyError the real server raises there (`{"error": "N"}`).
(2) "Environment not initialized" before a reset, as the real server.

Errors are HTTP 200 with `{"error": "..."}` (an unknown or dropped id: "The id N is not valid."); a request without
the id field (e.g. `env_idx` sent to an `id` server) is a 422. The server drops the least recently used instance
beyond `--max-instances`, as the real ones drop instances, so a client holding a dropped id meets "not valid".
`--id-key env_idx` serves the WebShop-style variant of the id field. Like the real servers, it numbers instances
0, 1, 2, ... from its start (a restarted server hands out the same ids again) and never expires an idle one.
Only the stand-in has `GET /rlfactory/instances` (`{"live": [ids], "created_total", "closed_total"}`): the instances
it holds, for tests and benchmarks that count leaks. Left out: authentication (bind to 127.0.0.1).
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import threading
from typing import Any, Callable

import uvicorn
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse

from rlfactory.envs.episodes import Episode, EpisodeRegistry
from rlfactory.envs.types import Env

ENVS: dict[str, str] = {
    "textcraft": "rlfactory.envs.textcraft:TextCraftEnv",
    "babyai": "rlfactory.envs.babyai:BabyAIEnv",
    "deepsearch": "rlfactory.envs.deepsearch:DeepSearchEnv",
    "sciworld": "rlfactory.envs.sciworld:SciWorldEnv",
}
FLAVORS = ("textcraft", "babyai")


def env_factory(name: str, task_set: str | None = None, **options: Any) -> Callable[[], Env]:
    """A factory of `name` envs (`task_set` and `options` go to its constructor when given)."""
    module, _, attr = ENVS[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    kwargs = {k: v for k, v in {"task_set": task_set, **options}.items() if v is not None}
    cls(**kwargs)  # a bad option fails at start-up, not at the first /create
    return lambda: cls(**kwargs)


class _Instance:
    """One instance: the env, whether it was reset, and whether its episode ended (the server's own record)."""

    def __init__(self, env: Env):
        self.env = env
        self.reset_done = False
        self.done = False
        self.last_observation = ""  # what TextCraft's GET /observation answers: the last observation it sent

    def close(self) -> None:
        self.env.close()


def make_app(env_name: str, id_key: str = "id", max_instances: int = 1024, flavor: str | None = None,
             task_set: str | None = None, goal_order: str | None = None):
    flavor = flavor or ("textcraft" if env_name == "textcraft" else "babyai")
    if flavor not in FLAVORS:
        raise ValueError(f"--flavor {flavor!r}: use one of {', '.join(FLAVORS)}")
    make_env = env_factory(env_name, task_set, **({"goal_order": goal_order} if goal_order else {}))
    registry: EpisodeRegistry[_Instance] = EpisodeRegistry(lambda: _Instance(make_env()), max_episodes=max_instances,
                                                          idle_timeout_s=float("inf"))
    ids = itertools.count()
    ids_lock = threading.Lock()
    app = FastAPI(title=f"rlfactory {env_name} (AgentGym protocol, {flavor} replies)")

    def error(message: str) -> dict[str, str]:
        return {"error": message}

    def missing(field: str) -> JSONResponse:
        return JSONResponse({"detail": [{"type": "missing", "loc": ["body", field], "msg": "Field required"}]},
                            status_code=422)

    def instance(key: Any) -> Episode[_Instance] | None:
        return registry.get(str(key))

    @app.get("/")
    def hello() -> str:
        return f"This is environment {env_name} (rlfactory, AgentGym protocol)."

    @app.post("/create")
    def create(body: dict[str, Any] | None = Body(default=None)) -> Any:
        if flavor == "textcraft" and body is None:
            return missing("body")
        with ids_lock:
            env_id = next(ids)
        ep = registry.open(str(env_id))
        if flavor == "babyai":
            return {"id": env_id} if id_key == "id" else {"id": env_id, id_key: env_id}
        with ep.lock:
            try:
                result = ep.env.env.reset(env_id)  # TextCraft: a new instance starts on task `id`
            except Exception as e:  # noqa: BLE001 - the real servers answer every failure as {"error": ...}
                failed = str(e)
            else:
                failed = None
                ep.env.reset_done = True
                ep.env.last_observation = result.observation
        if failed is not None:  # the real server keeps no instance whose creation failed
            registry.close(str(env_id))
            return error(failed)
        return {"id": env_id, **({id_key: env_id} if id_key != "id" else {}), "observation": result.observation,
                "done": result.done, "reward": result.reward}

    @app.post("/reset")
    def reset(body: dict[str, Any] = Body(...)) -> Any:
        if id_key not in body:
            return missing(id_key)
        ep = instance(body[id_key])
        if ep is None:
            return error(f"The id {body[id_key]} is not valid.")
        idx = body.get("data_idx", body.get("session_id", body.get("idx", 0)))
        with ep.lock:
            try:
                result = ep.env.env.reset(int(idx))
            except Exception as e:  # noqa: BLE001
                return error(str(e))
            ep.env.reset_done, ep.env.done = True, result.done
            ep.env.last_observation = result.observation
        if flavor == "textcraft":
            return {id_key: body[id_key], "observation": result.observation, "done": result.done,
                    "reward": result.reward}
        return {"observation": result.observation, "reward": result.reward, "score": result.score,
                "deleted": False, "done": result.done}

    @app.post("/step")
    def step(body: dict[str, Any] = Body(...)) -> Any:
        if id_key not in body:
            return missing(id_key)
        if "action" not in body:
            return missing("action")
        ep = instance(body[id_key])
        if ep is None:
            return error(f"The id {body[id_key]} is not valid.")
        with ep.lock:
            inst = ep.env
            if not inst.reset_done:  # only BabyAI's (TextCraft's create resets): its env table has no entry yet
                return error(str(KeyError(body[id_key])))
            if inst.done and flavor == "babyai":
                return error(f"The task with environment {body[id_key]} has finished.")
            was_done = inst.done
            try:
                result = inst.env.step(str(body["action"]))
            except Exception as e:  # noqa: BLE001
                return error(str(e))
            inst.done = result.done
            inst.last_observation = result.observation
        if flavor == "textcraft":
            # TextCraft's `done` is not sticky: once won, later steps answer done false and reward 0.
            done, reward = (False, 0.0) if was_done else (result.done, result.reward)
            return {"observation": result.observation, "reward": reward, "done": done}
        return {"observation": result.observation, "reward": result.reward, "score": result.score,
                "done": result.done}

    @app.get("/observation")
    def observation(request: Request) -> Any:
        key = request.query_params.get(id_key)
        if key is None:
            return JSONResponse({"detail": [{"type": "missing", "loc": ["query", id_key], "msg": "Field required"}]},
                                status_code=422)
        ep = instance(key)
        if ep is None:
            return error(f"The id {key} is not valid.")
        with ep.lock:
            if flavor == "textcraft":
                return ep.env.last_observation
            if not ep.env.reset_done:
                return {"observation": "Environment not initialized", "reward": 0, "score": 0, "done": False,
                        "deleted": False}
            return {"observation": ep.env.env.observe(), "reward": 0, "score": 0, "done": ep.env.done,
                    "deleted": False}

    @app.post("/close")
    def close(body: dict[str, Any] = Body(...)) -> Any:
        if id_key not in body:
            return missing(id_key)
        return registry.close(str(body[id_key]))

    @app.get("/rlfactory/instances")
    def instances() -> Any:
        stats = registry.stats()
        return {"live": sorted(int(k) for k in registry.keys()), "created_total": stats["opened_total"],
                "closed_total": stats["closed_total"]}

    app.state.registry = registry
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=sorted(ENVS), default="textcraft")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=36001)
    p.add_argument("--id-key", default="id", help="name of the instance id field: id (default) or env_idx")
    p.add_argument("--flavor", choices=FLAVORS, default=None,
                   help="whose reply shapes to copy (default: textcraft for --env textcraft, else babyai)")
    p.add_argument("--max-instances", "--max-episodes", dest="max_instances", type=int, default=1024,
                   help="instances kept; the least recently used is dropped beyond it")
    p.add_argument("--task-set", default=None, help="the env's task set (e.g. agentgym: AgentGym's task ids)")
    p.add_argument("--goal-order", default=None, help="TextCraft, agentgym task set: goal names by task id (JSON)")
    args = p.parse_args()

    app = make_app(args.env, args.id_key, args.max_instances, args.flavor, args.task_set, args.goal_order)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
