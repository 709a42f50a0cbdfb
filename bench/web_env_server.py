"""The web environment's MCP server (`python -m rlfactory.envs.tools.web`) over stdio on this machine: reset and
step latency through the server, a fork's cost, and the server's memory with N episodes open.

    python bench/web_env_server.py [--episodes 8] [--steps 24] [--json PATH]

- `reset_s` / `step_s`: p50 / p99 of `reset(task_id)` (a fresh copy of the sites' databases, a browser context at
  the start page, its observation) and of `step` (cycling scroll down, scroll up, and a click on the first link of
  the observation), measured at the client, MCP and JSON included.
- `fork_s`: p50 of the loop-only `fork` (the databases copied, a new context at the same URL, its observation).
- `rss_mb`: summed RSS of the server's process tree (the server, the site server, Chromium and its renderers)
  with no episode and with `--episodes` open at once; `rss_mb_per_episode` the growth per episode. Summed RSS counts
  shared pages once per process: an upper bound; `pss_mb` divides shared pages among their processes (the truer
  cost).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time

import psutil

from rlfactory.tools.manager import ToolManager
from rlfactory.tools.mcp_configs import ServerConfig, ServerSettings
from rlfactory.tools.types import ToolCall


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, round(q * (len(xs) - 1)))], 4)


def tree_mb(root: psutil.Process) -> tuple[float, float]:
    """(summed RSS, summed PSS) of `root` and its descendants, in MiB."""
    rss = pss = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        pss += getattr(info, "pss", 0)
    return round(rss / 2**20, 1), round(pss / 2**20, 1)


def server_process() -> psutil.Process:
    me = psutil.Process()
    for child in me.children(recursive=True):
        try:
            if "rlfactory.envs.tools.web" in " ".join(child.cmdline()):
                return child
        except psutil.Error:  # a browser helper that exited (a zombie) or is gone: not the server
            continue
    raise RuntimeError("the web server process was not found among this process's children")


async def run(episodes: int, steps: int) -> dict:
    cfg = ServerConfig("web", "bench", "stdio", command=sys.executable,
                       args=("-m", "rlfactory.envs.tools.web", "--max-episodes", str(episodes + 4)),
                       settings=ServerSettings(cache=False, startup_timeout_s=120, tool_timeout_s=120))
    resets, stepped, forks = [], [], []
    async with ToolManager({"web": cfg}) as tm:
        server = server_process()
        await tm.call(ToolCall(name="web.reset", arguments={"task_id": 0, "episode_id": "warm"}))
        await tm.call(ToolCall(name="web.close", arguments={"episode_id": "warm"}))
        (idle, idle_pss) = tree_mb(server)

        async def call(tool: str, ep: str, **args):
            t0 = time.perf_counter()
            r = await tm.call(ToolCall(name=f"web.{tool}", arguments={**args, "episode_id": ep}))
            if r.is_error:
                raise RuntimeError(f"{tool} on {ep}: {r.text[:300]}")
            return time.perf_counter() - t0, r

        for i in range(episodes):
            took, _ = await call("reset", f"e{i}", task_id=i)
            resets.append(took)
        open_rss, open_pss = tree_mb(server)
        for k in range(steps):
            ep = f"e{k % episodes}"
            if k % 3 == 2:
                _, obs = await call("observe", ep)
                page = obs.structured.get("observation", "") if obs.structured else obs.text
                m = re.search(r"\[(\d+)\] link '", page)
                action = f"click [{m.group(1)}]" if m else "scroll [down]"
            else:
                action = "scroll [down]" if k % 3 == 0 else "scroll [up]"
            took, _ = await call("step", ep, action=action)
            stepped.append(took)
        for i in range(min(4, episodes)):
            took, _ = await call("fork", f"e{i}", into=f"f{i}")
            forks.append(took)
            await call("close", f"f{i}")
        for i in range(episodes):
            await call("close", f"e{i}")
    return {"episodes": episodes, "reset_s": {"p50": pct(resets, 0.5), "p99": pct(resets, 0.99)},
            "step_s": {"p50": pct(stepped, 0.5), "p99": pct(stepped, 0.99)},
            "fork_s": {"p50": round(statistics.median(forks), 4)},
            "rss_mb": {"idle": idle, f"with_{episodes}_open": open_rss},
            "rss_mb_per_episode": round((open_rss - idle) / episodes, 1),
            "pss_mb": {"idle": idle_pss, f"with_{episodes}_open": open_pss},
            "pss_mb_per_episode": round((open_pss - idle_pss) / episodes, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = asyncio.run(run(args.episodes, args.steps))
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
