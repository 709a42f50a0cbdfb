"""What forking an episode costs, against a step and a reset of the same environment, side by side in one run.

    python bench/forks.py --json out.json [--repeats 50] [--envs textcraft,babyai,deepsearch,sciworld]

Per environment, in-process: an episode is played a few steps in (TextCraft: the scripted plan's first steps;
BabyAI: the bot's; Deep Search: two searches; SciWorld: three moves), then `fork()` is timed `--repeats` times (each
copy closed), and so are `step` (on copies, so every step starts from the same state) and `reset`. Reported per
environment: the medians in milliseconds and `fork_to_step` / `fork_to_reset` (ratios of medians). Over MCP
(TextCraft's server, one stdio session, the ToolManager): the `fork` tool's round trip against `step`'s
(`mcp_fork_to_step`). SciWorld forks by replaying the episode in a new simulator, so its fork costs a JVM start-up
plus a step per action; it is skipped when `scienceworld` is not installed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 4)


def _played(name: str) -> tuple[Any, str, Callable[[], Any]]:
    """(an environment a few steps into an episode, an action to time, a reset to time)."""
    if name == "textcraft":
        from rlfactory.envs.solvers import textcraft_plan
        from rlfactory.envs.textcraft import TextCraftEnv

        env = TextCraftEnv()
        plan = textcraft_plan(env.reset(3).observation)
        for a in plan[:3]:
            env.step(a)
        return env, plan[3] if len(plan) > 3 else "inventory", lambda: TextCraftEnv().reset(3)
    if name == "babyai":
        from rlfactory.envs.babyai import BabyAIEnv
        from rlfactory.envs.solvers import BabyAIShadow

        env = BabyAIEnv()
        env.reset(2)
        shadow = BabyAIShadow(env.level, 2)
        for _ in range(3):
            env.step(shadow.next_action())
        fresh = BabyAIEnv()
        return env, "turn left", lambda: fresh.reset(2)
    if name == "deepsearch":
        from rlfactory.envs.deepsearch import DeepSearchEnv

        env = DeepSearchEnv()
        env.reset(1)
        env.step("search: capital city")
        env.step("search: river")
        fresh = DeepSearchEnv()
        return env, "search: mountain", lambda: fresh.reset(1)
    from rlfactory.envs.sciworld import SciWorldEnv

    env = SciWorldEnv()
    env.reset(0)
    for a in ["look around", "open door to kitchen", "go to kitchen"]:
        env.step(a)
    fresh = SciWorldEnv()
    fresh.reset(0)
    return env, "look around", lambda: fresh.reset(0)


def in_process(name: str, repeats: int) -> dict[str, float]:
    env, action, reset = _played(name)
    if name == "sciworld":
        repeats = min(repeats, 5)  # each fork starts a JVM

    def fork_once() -> None:
        env.fork().close()

    copies = [env.fork() for _ in range(repeats)]
    it = iter(copies)
    step_ms = _median_ms(lambda: next(it).step(action), repeats)
    for c in copies:
        c.close()
    out = {"fork_ms": _median_ms(fork_once, repeats), "step_ms": step_ms, "reset_ms": _median_ms(reset, repeats),
           "steps_before_fork": len(getattr(env, "_actions", [])) or 3, "repeats": repeats}
    out["fork_to_step"] = round(out["fork_ms"] / out["step_ms"], 3)
    out["fork_to_reset"] = round(out["fork_ms"] / out["reset_ms"], 3)
    env.close()
    return out


async def over_mcp(repeats: int) -> dict[str, float]:
    from rlfactory.envs.solvers import textcraft_plan
    from rlfactory.tools.manager import ToolManager
    from rlfactory.tools.mcp_configs import load_mcp_configs
    from rlfactory.tools.types import ToolCall

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "mcp.json"
        cfg.write_text(json.dumps({"mcpServers": {"textcraft": {
            "command": sys.executable, "args": ["-m", "rlfactory.envs.tools.textcraft"],
            "rlfactory": {"cache": False}}}}))
        async with ToolManager(load_mcp_configs([cfg])) as tools:
            async def call(name: str, **args: Any) -> Any:
                (r,) = await tools.call_many([ToolCall(name=name, arguments=args)])
                assert not r.is_error, r.text
                return r

            reset = await call("reset", task_id=3, episode_id="root")
            plan = textcraft_plan(reset.structured["observation"])
            for a in plan[:3]:
                await call("step", action=a, episode_id="root")
            fork_s, step_s = [], []
            for i in range(repeats):
                t0 = time.perf_counter()
                await call("fork", into=f"c{i}", episode_id="root")
                fork_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await call("step", action=plan[3] if len(plan) > 3 else "inventory", episode_id=f"c{i}")
                step_s.append(time.perf_counter() - t0)
                await call("close", episode_id=f"c{i}")
    fork_ms, step_ms = statistics.median(fork_s) * 1000, statistics.median(step_s) * 1000
    return {"fork_ms": round(fork_ms, 3), "step_ms": round(step_ms, 3), "mcp_fork_to_step": round(fork_ms / step_ms, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--envs", default="textcraft,babyai,deepsearch,sciworld")
    args = ap.parse_args()
    result: dict[str, Any] = {"envs": {}}
    for name in args.envs.split(","):
        if name == "sciworld":
            try:
                import scienceworld  # noqa: F401
            except ImportError:
                print("sciworld: skipped (scienceworld not installed)")
                continue
        result["envs"][name] = in_process(name, args.repeats)
        print(name, result["envs"][name], flush=True)
    result["mcp_textcraft"] = asyncio.run(over_mcp(args.repeats))
    print("mcp textcraft", result["mcp_textcraft"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
