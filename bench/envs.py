"""Environment steps per second with 32 concurrent episodes: through the ToolManager (MCP stdio servers) vs the
same environment called in-process, measured side by side in one run.

    python bench/envs.py --json out.json [--episodes 32] [--tasks-per-episode 4] [--envs textcraft,babyai]

32 episodes run concurrently; each plays `--tasks-per-episode` tasks in turn (reset, solve, next) and is then
closed. Each task is played by a scripted solver (TextCraft: the plan read off the reset observation;
BabyAI: minigrid's BabyAIBot on a private copy of the level, computed before timing) until done. Only `step` calls
are counted as steps. `mcp_overhead_ratio` = in-process steps/s / MCP steps/s for the first environment (textcraft);
per-environment figures are under `envs`. Also reports episodes solved and episodes left open (must be 0).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("OMP_NUM_THREADS", "1")


def textcraft_env():
    from rlfactory.envs.textcraft import TextCraftEnv

    return TextCraftEnv()


def babyai_env():
    from rlfactory.envs.babyai import BabyAIEnv

    return BabyAIEnv()


def plan_for(env_name: str, task_id: int) -> list[str]:
    """The scripted solver's actions for one task, computed outside the timed region."""
    from rlfactory.envs.solvers import BabyAIShadow, textcraft_plan

    if env_name == "textcraft":
        env = textcraft_env()
        return textcraft_plan(env.reset(task_id).observation)
    env = babyai_env()
    env.reset(task_id)
    shadow, actions = BabyAIShadow(env.level, task_id), []
    for _ in range(256):
        name = shadow.next_action()
        actions.append(name)
        if env.step(name).done:
            break
    return actions


Plans = dict[int, list[tuple[int, list[str]]]]
"""Per episode slot: the (task id, actions) it plays in turn."""


def run_direct(env_name: str, plans: Plans) -> dict:
    """All episodes open at once, stepped round-robin in this process (what the same episodes cost without MCP,
    JSON-RPC or a second process)."""
    make = textcraft_env if env_name == "textcraft" else babyai_env
    t0 = time.perf_counter()
    envs = {slot: make() for slot in plans}
    queue = {slot: list(tasks) for slot, tasks in plans.items()}
    current: dict[int, list[str]] = {}
    steps = solved = 0
    for slot, env in envs.items():
        tid, actions = queue[slot].pop(0)
        env.reset(tid)
        current[slot] = list(actions)
    live = set(plans)
    while live:
        for slot in list(live):
            result = envs[slot].step(current[slot].pop(0))
            steps += 1
            if result.done or not current[slot]:
                solved += int(result.done and result.score > 0)
                if queue[slot]:
                    tid, actions = queue[slot].pop(0)
                    envs[slot].reset(tid)
                    current[slot] = list(actions)
                else:
                    live.discard(slot)
    for env in envs.values():
        env.close()
    elapsed = time.perf_counter() - t0
    return {"steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed, "solved": solved}


async def run_mcp(env_name: str, plans: Plans, config: Path) -> dict:
    from rlfactory.tools.manager import ToolManager
    from rlfactory.tools.types import ToolCall

    async with ToolManager.from_files([config]) as tools:
        # Warm up one call so the server's imports are not timed.
        await tools.call(ToolCall(name=f"{env_name}.observe", arguments={"episode_id": "warmup"}))

        async def episode(slot: int) -> tuple[int, int, bool]:
            eid = f"bench-{env_name}-{slot}"
            steps = solved = 0
            for tid, actions in plans[slot]:
                r = await tools.call(ToolCall(name=f"{env_name}.reset",
                                              arguments={"task_id": tid, "episode_id": eid}))
                if r.is_error:
                    raise RuntimeError(f"reset failed: {r.text}")
                for action in actions:
                    r = await tools.call(ToolCall(name=f"{env_name}.step",
                                                  arguments={"action": action, "episode_id": eid}))
                    steps += 1
                    if r.is_error:
                        raise RuntimeError(f"step failed: {r.text}")
                    if r.structured["done"]:
                        solved += int(r.structured["score"] > 0)
                        break
            closed = await tools.call(ToolCall(name=f"{env_name}.close", arguments={"episode_id": eid}))
            return steps, solved, bool(closed.structured and closed.structured.get("closed"))

        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(episode(slot) for slot in plans))
        elapsed = time.perf_counter() - t0
        # After closing everything, nothing must remain open: `observe` on a closed id says so.
        leftover = await tools.call_many([ToolCall(name=f"{env_name}.observe",
                                                   arguments={"episode_id": f"bench-{env_name}-{slot}"})
                                          for slot in plans])
        still_open = sum("No episode is open" not in r.text for r in leftover)
    steps = sum(o[0] for o in outcomes)
    return {"steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed,
            "solved": sum(o[1] for o in outcomes), "closed": sum(o[2] for o in outcomes), "left_open": still_open}


def write_config(envs: list[str], tmp: Path, concurrency: int) -> Path:
    servers = {name: {"command": "python", "args": ["-m", f"rlfactory.envs.tools.{name}"],
                      "rlfactory": {"cache": False, "max_concurrency": concurrency, "tool_timeout_s": 60}}
               for name in envs}
    path = tmp / "bench_envs.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="write the figures here")
    p.add_argument("--episodes", type=int, default=32, help="episodes in flight at once")
    p.add_argument("--tasks-per-episode", type=int, default=4, help="tasks each episode plays in turn")
    p.add_argument("--envs", default="textcraft,babyai")
    p.add_argument("--rounds", type=int, default=2, help="measure each side this many times, keep the best")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    envs = [e for e in args.envs.split(",") if e]
    unknown = set(envs) - {"textcraft", "babyai"}
    if unknown:
        p.error(f"--envs: unknown {sorted(unknown)}; choose from textcraft, babyai")
    report: dict = {"episodes": args.episodes, "tasks_per_episode": args.tasks_per_episode, "envs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(envs, Path(tmp), args.episodes)
        for env_name in envs:
            per = args.tasks_per_episode
            plans = {slot: [(tid, plan_for(env_name, tid)) for tid in range(slot * per, (slot + 1) * per)]
                     for slot in range(args.episodes)}
            direct = max((run_direct(env_name, plans) for _ in range(args.rounds)), key=lambda d: d["steps_per_s"])
            mcp = max((asyncio.run(run_mcp(env_name, plans, config)) for _ in range(args.rounds)),
                      key=lambda d: d["steps_per_s"])
            report["envs"][env_name] = {
                "direct_steps_per_s": round(direct["steps_per_s"], 1),
                "mcp_steps_per_s": round(mcp["steps_per_s"], 1),
                "mcp_overhead_ratio": round(direct["steps_per_s"] / mcp["steps_per_s"], 2),
                "steps": mcp["steps"], "solved_direct": direct["solved"], "solved_mcp": mcp["solved"],
                "closed": mcp["closed"], "left_open": mcp["left_open"],
            }
    first = report["envs"][envs[0]]
    report = {"mcp_overhead_ratio": first["mcp_overhead_ratio"], "mcp_steps_per_s": first["mcp_steps_per_s"],
              "direct_steps_per_s": first["direct_steps_per_s"], **report}
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    tasks = args.episodes * args.tasks_per_episode
    bad = [n for n, e in report["envs"].items() if e["left_open"] or e["solved_mcp"] != tasks]
    if bad:
        sys.exit(f"bench/envs.py: episodes unsolved or left open in {bad}")


if __name__ == "__main__":
    main()
