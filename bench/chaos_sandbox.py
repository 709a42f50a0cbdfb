"""The python-sandbox campaign of the chaos benchmark: snippets that try to outlive their call, concurrently.

    python bench/chaos_sandbox.py --json bench/results/chaos_sandbox.json [--seed 0] [--quick]

Two real sandbox MCP servers over streamable HTTP (`envs/tools/python_sandbox.py`): one with everything this
machine allows (cgroup.kill where there is a cgroup v2), one with the fallback alone (`--disable cgroup --disable
namespaces --disable uid`: the process sweep and the server as subreaper). Seeded calls, 8 at a time, spread over
both, with processes allowed (`--allow-processes`: a snippet that may start processes, or one that got around the
audit hook's ban, meets the process-lifetime layer; tests/tools/sandbox_escapes.py), and each:
- `setsid`: leaves its session and outsleeps its timeout;
- `double_fork`: daemonizes a grandchild that keeps the pipes, and exits at once (0);
- `closed_pipes`: a detached child closes stdin/stdout/stderr; the main process does too and sleeps, or exits;
- `ignores_sigterm`: a child in its own session ignores SIGTERM and SIGHUP; the main process sleeps, or exits;
- `fork_bomb`: forks for ever, each child in a new session (capped by RLIMIT_NPROC where the snippet has a uid of
  its own; a bounded tree of detached processes where it has not).
Each snippet first prints its scratch directory, which every one of its processes names in its command line.
`sandbox_orphans` counts the processes alive after their call returned (checked right after each call, and for
both servers once all calls are done): it must be 0. `unexpected_replies` counts replies that are neither the
timeout a sleeping snippet earns nor exit code 0 from one whose main process exits; `longest_call_s` is the
slowest call, beside its timeout, and `max_overrun_s` the most any call took past its timeout (a snippet whose main
process exits must return long before its 30 s timeout: `max_exit_call_s`).
"""
from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # local_services: free ports
sys.path.insert(0, str(REPO / "tests" / "tools"))  # sandbox_escapes: the snippets and the server
import sandbox_escapes as escapes  # noqa: E402
from local_services import pick_free_port  # noqa: E402

KINDS = ("setsid", "double_fork", "closed_pipes", "ignores_sigterm", "fork_bomb")
CONCURRENCY = 8
EXIT_TIMEOUT_S = 30.0  # for snippets whose main process exits: the call must not wait for it
HANG_GUARD_S = 120.0  # a call that waits for a detached child would never return; this reports it instead


def _snippet(kind: str, rng: random.Random, capped: bool) -> tuple[str, float, bool]:
    """(code, timeout_s, whether its main process exits by itself)."""
    main_exits = kind == "double_fork" or (kind in ("closed_pipes", "ignores_sigterm") and rng.random() < 0.5)
    code = {"setsid": escapes.setsid_sleep,
            "double_fork": escapes.double_fork,
            "closed_pipes": lambda: escapes.closed_pipes(main_exits),
            "ignores_sigterm": lambda: escapes.ignores_sigterm(main_exits),
            "fork_bomb": escapes.fork_bomb if capped else lambda: escapes.process_tree(depth=2, width=3)}[kind]()
    # The scratch directory first (every process of the snippet names it), then a seeded pause before escaping.
    head = f"import os, time\nprint('scratch', os.getcwd(), flush=True)\ntime.sleep({rng.uniform(0, 0.3):.3f})\n"
    timeout_s = EXIT_TIMEOUT_S if main_exits else round(rng.uniform(1.5, 3.0), 2)
    return head + code, timeout_s, main_exits


async def _run(servers: list[tuple[str, Any, bool]], plan: list[tuple[str, int]], seed: int) -> dict[str, Any]:
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    rng = random.Random(seed)
    stack = contextlib.AsyncExitStack()
    opened = []
    for _, srv, _ in servers:
        read, write, *_ = await stack.enter_async_context(streamable_http_client(srv.url))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        opened.append(session)
    gate = asyncio.Semaphore(CONCURRENCY)
    orphans: dict[int, str] = {}
    calls: list[dict[str, Any]] = []

    async def one(kind: str, which: int, code: str, timeout_s: float, main_exits: bool) -> None:
        name = servers[which][0]
        async with gate:
            started = time.monotonic()
            try:
                result = await asyncio.wait_for(
                    opened[which].call_tool("python", {"code": code, "timeout_s": timeout_s}), HANG_GUARD_S)
                reply = result.content[0].text if result.content else ""
            except asyncio.TimeoutError:
                reply = f"(no reply in {HANG_GUARD_S:g} s)"
            took = time.monotonic() - started
        found = re.search(r"scratch (\S+)", reply)
        left = escapes.alive_with(found.group(1)) if found else []
        for line in left:
            orphans[int(line.split(":")[0])] = line
        ok = (reply == "exit code: 0\n--- stdout ---\nscratch " + (found.group(1) if found else "") + "\nready\n"
              if main_exits else reply.startswith(f"exit code: none (killed)\ntimed out after {timeout_s:g} s"))
        calls.append({"kind": kind, "server": name, "timeout_s": timeout_s, "main_exits": main_exits,
                      "took_s": round(took, 3), "orphans": len(left), "ok": ok, "reply": reply[:300]})

    jobs = []
    for kind, n in plan:
        for _ in range(n):
            which = rng.randrange(len(servers))
            jobs.append((kind, which, *_snippet(kind, rng, servers[which][2])))
    rng.shuffle(jobs)
    async with stack:
        await asyncio.gather(*(one(*job) for job in jobs))
    for _, srv, _ in servers:  # whatever no call could be tied to (a snippet killed before it printed)
        for line in escapes.alive_with(str(srv.marker)):
            orphans.setdefault(int(line.split(":")[0]), line)
    return {"orphans": orphans, "calls": calls}


def campaign(tmp: Path, *, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    per_kind = 6 if quick else 24
    servers = []
    try:
        for name, disable in (("probed", ()), ("sweep_only", ("cgroup", "namespaces", "uid"))):
            marker = tmp / name
            marker.mkdir()
            srv = escapes.SandboxServer(pick_free_port(), marker, disable)
            isolation = srv.start()
            servers.append((name, srv, "per-snippet uid" in isolation, isolation))
        ran = asyncio.run(_run([(n, s, capped) for n, s, capped, _ in servers], [(k, per_kind) for k in KINDS],
                               seed))
    finally:
        for _, srv, _, _ in servers:
            srv.stop()
        for _, srv, _, _ in servers:  # leave nothing behind, whatever the result
            for line in escapes.alive_with(str(srv.marker)):
                with contextlib.suppress(psutil.Error):
                    psutil.Process(int(line.split(":")[0])).kill()
    calls = ran["calls"]
    longest = max(calls, key=lambda c: c["took_s"])
    timed = [c["took_s"] - c["timeout_s"] for c in calls if not c["main_exits"]]
    exits = [c["took_s"] for c in calls if c["main_exits"]]
    kinds = {k: sum(c["kind"] == k for c in calls) for k in KINDS}
    return {
        "sandbox_orphans": len(ran["orphans"]),
        "calls": len(calls),
        "kinds": kinds,
        "servers": {name: isolation for name, _, _, isolation in servers},
        "unexpected_replies": sum(not c["ok"] for c in calls),
        "unexpected_examples": [c for c in calls if not c["ok"]][:3],
        "orphan_examples": sorted(ran["orphans"].values())[:5],
        "longest_call_s": longest["took_s"],
        "longest_call_timeout_s": longest["timeout_s"],
        "longest_call_kind": longest["kind"],
        "max_overrun_s": round(max(timed), 3) if timed else None,
        "max_exit_call_s": round(max(exits), 3) if exits else None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    from campaign_cli import run_campaign  # bench/ is on the path when this file runs as a script

    run_campaign(__doc__, campaign, name="sandbox", quick_help="6 snippets of each kind instead of 24")


if __name__ == "__main__":
    main()
