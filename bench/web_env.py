"""The web environment's browser on this machine: reset and step latency, memory per concurrent episode, the most
concurrent episodes that keep step p99 under 2 s, and the MCP server's overhead against calling the browser
directly — all against the probe site (rlfactory/envs/web/browser/probe_site.py), side by side in one run.

    python bench/web_env.py --json out.json [--resets 12] [--steps 36] [--concurrency 1,2,4,8,16]

- `reset_s`: a new context, the start page loaded and its first observation (`BrowserEnv.open`), p50 / p99.
- `step_s`: one action and the observation after it, cycling through click a link, click a product, go_back, type
  a search with Enter, scroll; p50 / p99.
- `fork_s`: a fork (a new context with the cookies and storage, its tabs loaded again) and its observation.
- `rss_mb_per_episode` / `pss_mb_per_episode`: the growth of the browser's process-tree memory (browser, renderers,
  GPU/utility processes) per open episode, from 0 to the largest concurrency level (each episode at the probe home
  page); summed RSS counts shared pages once per process, PSS divides them (the truer cost).
- `concurrency`: step p99 with N episodes stepping at once (one thread each, as the MCP server's worker threads
  do); `max_concurrent_under_2s_p99` the largest N measured that stays under 2 s.
- `mcp`: the same resets and steps through `python -m rlfactory.envs.tools.browser` over stdio (its own browser);
  `mcp_overhead_ratio` = MCP step p50 / direct step p50.
Left out: the real shop and forum (their own benchmark numbers come with them), and GPU anything.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, round(q * (len(xs) - 1)))], 4)


def summary(xs: list[float]) -> dict:
    return {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "mean": round(statistics.fmean(xs), 4), "n": len(xs)}


def eid(observation: str, name: str) -> str:
    m = re.search(r"\[(\d+)\] \w+ '" + re.escape(name) + "'", observation)
    if not m:
        raise RuntimeError(f"no {name!r} in the observation:\n{observation[:2000]}")
    return m.group(1)


def next_action(i: int, obs: str) -> str:
    """The i-th action of the cycle, read off the current observation."""
    k = i % 5
    if k == 0:
        return f"click [{eid(obs, 'Products')}]"
    if k == 1:
        return f"click [{eid(obs, 'Green hat')}]"
    if k == 2:
        return "go_back"
    if k == 3:
        return "goto [/]" if "'Search'" not in obs else f"type [{eid(obs, 'Search')}] [shirt]"
    return "go_back"


def play(step, obs: str, n: int) -> tuple[list[float], str]:
    """`n` steps of the cycle through `step(action) -> observation`; their latencies."""
    times = []
    for i in range(n):
        if i % 5 == 0 and "'Products'" not in obs:
            obs = step("goto [/]")
        action = next_action(i, obs)
        t = time.perf_counter()
        obs = step(action)
        times.append(time.perf_counter() - t)
    return times, obs


def direct(url: str, resets: int, steps: int, levels: list[int]) -> dict:
    from rlfactory.envs.web.browser.host import BrowserEnv, BrowserHost

    host = BrowserHost()
    out: dict = {}
    try:
        t = time.perf_counter()
        host.start()
        out["launch_s"] = round(time.perf_counter() - t, 3)
        env = BrowserEnv(host)
        reset_times = []
        for _ in range(resets):
            t = time.perf_counter()
            obs = env.open(url + "/").observation
            reset_times.append(time.perf_counter() - t)
        out["reset_s"] = summary(reset_times)
        out["observation_chars_home"] = len(obs)
        step_times, _ = play(lambda a: env.step(a).observation, obs, steps)
        out["step_s"] = summary(step_times)
        fork_times = []
        for _ in range(max(3, resets // 2)):
            t = time.perf_counter()
            twin = env.fork()
            twin.observe()
            fork_times.append(time.perf_counter() - t)
            twin.close()
        out["fork_s"] = summary(fork_times)
        env.close()
        # Memory: the browser's tree with 0 .. max(levels) episodes open.
        def mb(proportional: bool) -> float:
            return round(host.chromium.memory_bytes(proportional=proportional) / 2**20, 1)

        time.sleep(0.5)
        envs = []
        rss, pss = {0: mb(False)}, {0: mb(True)}
        for n in range(1, max(levels) + 1):
            e = BrowserEnv(host)
            e.open(url + "/")
            envs.append(e)
            if n in levels:
                rss[n], pss[n] = mb(False), mb(True)
        top = max(levels)
        out["rss_mb"], out["pss_mb"] = rss, pss
        out["rss_mb_per_episode"] = round((rss[top] - rss[0]) / top, 1)
        out["pss_mb_per_episode"] = round((pss[top] - pss[0]) / top, 1)
        # Concurrency: N of those episodes step at once, one thread each.
        conc = {}
        per_thread = max(5, steps // 4)
        for n in levels:
            lat: list[float] = []
            lock = threading.Lock()

            def worker(e: BrowserEnv, lat: list[float] = lat, lock: threading.Lock = lock) -> None:
                times, _ = play(lambda a: e.step(a).observation, e.observe(), per_thread)
                with lock:
                    lat.extend(times)

            threads = [threading.Thread(target=worker, args=(e,)) for e in envs[:n]]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.perf_counter() - t
            conc[n] = {**summary(lat), "steps_per_s": round(len(lat) / wall, 2)}
        out["concurrency"] = conc
        under = [n for n in levels if conc[n]["p99"] < 2.0]
        out["max_concurrent_under_2s_p99"] = max(under) if under else 0
        for e in envs:
            e.close()
    finally:
        host.close()
    return out


async def over_mcp(url: str, resets: int, steps: int) -> dict:
    from rlfactory.tools.mcp_client import MCPConnection
    from rlfactory.tools.mcp_configs import ServerConfig

    conn = MCPConnection(ServerConfig("browser", "bench", "stdio", command=sys.executable,
                                      args=("-m", "rlfactory.envs.tools.browser")))
    await conn.open(timeout_s=120)
    loop = asyncio.get_running_loop()
    try:
        async def call(tool: str, **args) -> str:
            r = await conn.session.call_tool(tool, args)
            if r.is_error:
                raise RuntimeError(r.content[0].text)
            return r.structured_content["observation"]

        await call("open", start_url=url + "/", episode_id="warm")  # launches the server's browser
        reset_times = []
        for _ in range(resets):
            t = time.perf_counter()
            obs = await call("open", start_url=url + "/", episode_id="bench")
            reset_times.append(time.perf_counter() - t)

        # `play` is synchronous: run it on a thread that hands each call back to this loop.
        def step(action: str) -> str:
            return asyncio.run_coroutine_threadsafe(call("act", action=action, episode_id="bench"), loop).result()

        step_times, _ = await asyncio.to_thread(play, step, obs, steps)
        for ep in ("warm", "bench"):
            await conn.session.call_tool("close", {"episode_id": ep})
    finally:
        await conn.close()
    return {"reset_s": summary(reset_times), "step_s": summary(step_times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--resets", type=int, default=12)
    p.add_argument("--steps", type=int, default=36)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    args = p.parse_args()
    levels = sorted({int(x) for x in args.concurrency.split(",")})
    from rlfactory.envs.web.browser.probe_site import ProbeSites

    t0 = time.perf_counter()
    with ProbeSites() as sites:
        report = {"direct": direct(sites.url, args.resets, args.steps, levels)}
        report["mcp"] = asyncio.run(over_mcp(sites.url, args.resets, args.steps))
        if sites.outside_hits:
            raise SystemExit(f"the outside site was reached: {sites.outside_hits}")
    d, m = report["direct"], report["mcp"]
    report.update({
        "reset_p50_s": d["reset_s"]["p50"], "reset_p99_s": d["reset_s"]["p99"],
        "step_p50_s": d["step_s"]["p50"], "step_p99_s": d["step_s"]["p99"], "fork_p50_s": d["fork_s"]["p50"],
        "rss_mb_per_episode": d["rss_mb_per_episode"], "pss_mb_per_episode": d["pss_mb_per_episode"],
        "max_concurrent_under_2s_p99": d["max_concurrent_under_2s_p99"],
        "mcp_overhead_ratio": round(m["step_s"]["p50"] / d["step_s"]["p50"], 3),
        "mcp_reset_overhead_ratio": round(m["reset_s"]["p50"] / d["reset_s"]["p50"], 3),
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "wall_s": round(time.perf_counter() - t0, 1), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    })
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
