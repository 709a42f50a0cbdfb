"""Snippets that try to outlive their call (setsid, a double fork, closed pipes, an ignored SIGTERM, a fork bomb),
run through the real python sandbox MCP server: after each call no process of the snippet is alive, and the call
returned when the snippet's main process ended or its timeout passed, not when a detached child let go of the pipes.

Every test runs against each way the server can end a call's processes: what this machine allows (a cgroup v2 and
cgroup.kill where there is one), the PID namespace's init with the per-snippet uid and the sweep (no cgroup), a
cgroup alone (no namespaces, no uid), and the sweep alone (nothing but procfs and the server as subreaper). And a
server killed outright mid-call: the next server to start ends what its call left (cgroup v2 only).
"""
from __future__ import annotations

import asyncio
import contextlib

import psutil
import pytest
import sandbox_escapes as escapes
from local_services import pick_free_port
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

# A call that waits for a detached child (which sleeps for ever) instead of the main process or the timeout never
# returns: this bounds the wait so such a failure is reported. Not a timing assertion: calls end in seconds.
HANG_GUARD_S = 90
TIMEOUT_S = 2  # what snippets that outsleep their timeout ask for

CONFIGS = {
    "probed": (),
    "no_cgroup": ("cgroup",),
    "cgroup_only": ("namespaces", "uid"),
    "sweep_only": ("cgroup", "namespaces", "uid"),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def server(request, tmp_path_factory):
    marker = tmp_path_factory.mktemp(f"sandbox-{request.param}-")
    srv = escapes.SandboxServer(pick_free_port(), marker, CONFIGS[request.param])
    srv.isolation = srv.start()
    assert srv.isolation, srv.log.read_text()
    try:
        yield srv
    finally:
        srv.stop()
        left = escapes.alive_with(str(marker))
        kill_all(left)  # leave nothing behind, even when a test failed
        assert not left, f"processes of snippets outlived the server: {left}"


async def call(server, code: str, timeout_s: float) -> str:
    """Run `code` through the server and return its reply; the hang guard fails a call that waits for a detached
    child instead of the main process or the timeout."""
    async with streamable_http_client(server.url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await asyncio.wait_for(session.call_tool("python", {"code": code, "timeout_s": timeout_s}),
                                        HANG_GUARD_S)
        assert not result.is_error, result.content
        return result.content[0].text


def kill_all(lines: list[str]) -> None:
    """Kill leftovers found by `escapes.alive_with`, so one failure does not fail the tests after it."""
    for line in lines:
        with contextlib.suppress(psutil.Error):
            psutil.Process(int(line.split(":")[0])).kill()


def assert_nothing_left(server, out: str) -> None:
    left = escapes.alive_with(str(server.marker))
    kill_all(left)
    assert not left, f"processes of the snippet outlived its call ({server.isolation}):\n{left}\nreply: {out}"
    # Orphans the server adopted (it is a child subreaper) are reaped too, not left as zombies call after call.
    kids = [(p.pid, p.status()) for p in psutil.Process(server.proc.pid).children()]
    assert not kids, f"the server still has children after the call ({server.isolation}): {kids}"


def test_each_configuration_names_how_processes_end(server):
    disabled = set(server.disable)
    assert "processes ended by " in server.isolation
    if "cgroup" in disabled:
        assert "process sweep" in server.isolation and "cgroup.kill" not in server.isolation
    if {"namespaces", "uid"} <= disabled:
        assert "PID-namespace init" not in server.isolation and "uid kill" not in server.isolation


async def test_setsid_then_sleep_is_killed_at_the_timeout(server):
    out = await call(server, escapes.setsid_sleep(), TIMEOUT_S)
    assert out.startswith(f"exit code: none (killed)\ntimed out after {TIMEOUT_S} s (killed)\n"), out
    assert "ready" in out
    assert_nothing_left(server, out)


async def test_a_double_forked_daemon_holding_the_pipes_does_not_hold_the_call(server):
    # The main process exits at once: the call returns with its output, long before the 30 s timeout, and the
    # daemon that still holds stdout/stderr is gone.
    out = await call(server, escapes.double_fork(), 30)
    assert out == "exit code: 0\n--- stdout ---\nready\n"
    assert_nothing_left(server, out)


@pytest.mark.parametrize("main_exits", [False, True])
async def test_closed_pipes_after_setsid(server, main_exits):
    out = await call(server, escapes.closed_pipes(main_exits), TIMEOUT_S if not main_exits else 30)
    if main_exits:
        assert out == "exit code: 0\n--- stdout ---\nready\n"
    else:
        assert out.startswith("exit code: none (killed)\ntimed out after"), out
    assert_nothing_left(server, out)


async def test_a_child_ignoring_sigterm_ends_with_the_call(server):
    out = await call(server, escapes.ignores_sigterm(), TIMEOUT_S)
    assert out.startswith("exit code: none (killed)\ntimed out after"), out
    out = await call(server, escapes.ignores_sigterm(main_exits=True), 30)
    assert out == "exit code: 0\n--- stdout ---\nready\n"
    assert_nothing_left(server, out)


async def test_a_fork_bomb_is_capped_and_ended(server):
    if "per-snippet uid" not in server.isolation:
        pytest.skip("no per-snippet uid here, so no RLIMIT_NPROC to cap a fork bomb: a bounded tree instead")
    out = await call(server, escapes.fork_bomb(), TIMEOUT_S)
    assert out.startswith("exit code: none (killed)\ntimed out after"), out
    assert_nothing_left(server, out)


async def test_a_tree_of_detached_processes_ends_with_the_call(server):
    out = await call(server, escapes.process_tree(depth=2, width=3), TIMEOUT_S)
    assert out.startswith("exit code: none (killed)\ntimed out after"), out
    assert_nothing_left(server, out)



async def test_a_server_killed_mid_call_has_its_snippets_ended_by_the_next_one(tmp_path):
    # SIGKILL gives the server no chance to end the call; its call cgroup names its pid, so the next server to
    # start on the machine ends what is left there.
    first, second = (escapes.SandboxServer(pick_free_port(), tmp_path) for _ in range(2))
    try:
        if "cgroup.kill" not in first.start():
            pytest.skip("no cgroup v2 with cgroup.kill here, so nothing names the calls of a killed server")
        async with streamable_http_client(first.url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            call = asyncio.ensure_future(session.call_tool("python", {"code": escapes.setsid_sleep(say_ready=False),
                                                                        "timeout_s": 30}))
            for _ in range(600):  # until the snippet has detached and sleeps (a hang guard, not a timing)
                if escapes.snippet_ready(tmp_path):
                    break
                await asyncio.sleep(0.1)
            first.proc.kill()
            first.proc.wait()
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
        assert escapes.alive_with(str(tmp_path)), "the snippet should still run after its server was killed"
        second.start()
        assert escapes.alive_with(str(tmp_path)) == []
    finally:
        first.stop()
        second.stop()
        kill_all(escapes.alive_with(str(tmp_path)))
