"""Faults: a server killed (kill -9) during calls, a tool that crashes its server, a tool that hangs past its
timeout, a server whose event loop freezes, servers that fail to start, an HTTP server that goes away and comes
back. Every failure must come back as an error result, the server must recover, and nothing may be left running."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
from mcp_helpers import HttpToolbox, alive, child_pids, leftover_children, toolbox_entry, write_config

from rlfactory.errors import ToolServerError
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.types import ToolCall


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


async def wait_until(predicate, what: str, limit_s: float = 60.0) -> None:
    """Poll until `predicate()` (sync or async) holds; fail the test with `what` if it never does."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"gave up waiting for {what}")


@pytest.fixture
def no_leftovers():
    before = child_pids()
    yield
    left = leftover_children(before)
    assert not left, f"tool server processes left running: {left}"


async def test_kill_9_during_calls_fails_them_and_the_server_restarts(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "k.json", {"tb": toolbox_entry(tool_timeout_s=60)})
    async with ToolManager.from_files([cfg]) as tm:
        old_pid = int((await tm.call(call("pid"))).text)
        assert tm.servers["tb"].pids == [old_pid]
        pending = [asyncio.create_task(tm.call(call("tracked_sleep", ms=30_000))) for _ in range(4)]

        async def all_in_flight() -> bool:
            return (await tm.call(call("inflight"))).structured["result"][0] == 4

        await wait_until(all_in_flight, "4 calls in flight")
        os.kill(old_pid, signal.SIGKILL)
        results = await asyncio.gather(*pending)
        assert all(r.is_error and r.error_kind == "server_error" for r in results)
        assert "stopped during tracked_sleep" in results[0].text
        # a later call waits for the restart and succeeds, on a new process
        later = await tm.call(call("add", a=20, b=22))
        assert not later.is_error and later.text == "42"
        new_pid = int((await tm.call(call("pid"))).text)
        assert new_pid != old_pid and not alive(old_pid)
        m = tm.metrics()
        assert m["tools/restarts"] == 1 and m["tools/errors_server_error"] == 4


async def test_a_tool_that_kills_its_server(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "c.json", {"tb": toolbox_entry(tool_timeout_s=60)})
    async with ToolManager.from_files([cfg]) as tm:
        crashed = await tm.call(call("crash"))
        assert crashed.is_error and crashed.error_kind == "server_error"
        assert (await tm.call(call("echo", text="back"))).text == "back"
        assert tm.metrics()["tools/restarts"] == 1


async def test_hanging_tool_times_out_and_the_server_stays_up(tmp_path, no_leftovers):
    # 3 s: the ping after the timeout gets as long (PING_TIMEOUT_MAX_S allowing), which a loaded machine must not miss
    cfg = write_config(tmp_path / "h.json", {"tb": toolbox_entry(tool_timeout_s=3)})
    async with ToolManager.from_files([cfg]) as tm:
        server = tm.servers["tb"]
        pid = server.pids[0]
        hung = await tm.call(call("hang"))
        assert hung.is_error and hung.error_kind == "timeout" and "did not finish within 3 s" in hung.text
        # the health check pings the server; it answers, so it is not restarted
        await wait_until(lambda: server._slots[0].health_task is None, "the health check")
        assert (await tm.call(call("add", a=1, b=1))).text == "2"
        assert server.pids == [pid] and tm.metrics()["tools/restarts"] == 0


async def test_frozen_server_is_detected_killed_and_restarted(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "f.json", {"tb": toolbox_entry(tool_timeout_s=1)})
    async with ToolManager.from_files([cfg]) as tm:
        server = tm.servers["tb"]
        frozen_pid = server.pids[0]
        frozen = await tm.call(call("freeze", seconds=600))
        assert frozen.error_kind == "timeout"
        await wait_until(lambda: tm.metrics()["tools/restarts"] == 1, "the frozen server to be restarted")
        assert (await tm.call(call("add", a=2, b=3))).text == "5"
        assert server.pids[0] != frozen_pid and not alive(frozen_pid)


async def test_a_call_waits_for_a_restart_slower_than_its_own_timeout(tmp_path, no_leftovers):
    # The restart takes 4 s by construction, four times the call timeout: a call that arrives meanwhile waits for the
    # restart (bounded by the restart's own start-up limit), then runs within its own 1 s.
    marker = tmp_path / "started-once"
    cfg = write_config(tmp_path / "s.json", {"tb": toolbox_entry("--slow-restart", str(marker), "4",
                                                                  tool_timeout_s=1)})
    async with ToolManager.from_files([cfg]) as tm:
        server = tm.servers["tb"]
        first = server.pids[0]
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: not alive(first), "the server to die")
        lost = await tm.call(call("add", a=1, b=2))  # finds the connection gone, or the restart already begun
        assert lost.is_error or lost.text == "3"
        after = await tm.call(call("add", a=2, b=3))
        assert after.text == "5", after.text
        assert tm.metrics()["tools/restarts"] >= 1 and server.pids[0] != first


async def test_server_that_dies_at_start_names_itself_and_its_stderr(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "d.json", {
        "good": toolbox_entry(),
        "broken": {"command": "python", "args": ["-c", "import sys; sys.stderr.write('boom: no model file\\n'); "
                                                       "sys.exit(3)"]},
    })
    with pytest.raises(ToolServerError) as e:
        async with ToolManager.from_files([cfg]):
            pass
    msg = str(e.value)
    assert "server 'broken'" in msg and "boom: no model file" in msg and "good" not in msg


async def test_server_that_never_initializes_times_out_at_start(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "t.json", {"mute": {
        "command": "python", "args": ["-c", "import time; time.sleep(120)"], "rlfactory": {"startup_timeout_s": 1}}})
    with pytest.raises(ToolServerError, match="server 'mute' .* did not start within 1 s"):
        async with ToolManager.from_files([cfg]):
            pass


async def test_http_server_that_goes_away_and_comes_back(tmp_path, free_port, no_leftovers):
    web = HttpToolbox(free_port)
    web.start()
    try:
        cfg = write_config(tmp_path / "w.json", {"web": {"url": web.url, "rlfactory": {"tool_timeout_s": 5}}})
        async with ToolManager.from_files([cfg]) as tm:
            assert (await tm.call(call("add", a=1, b=1))).text == "2"
            web.kill()
            down = await tm.call(call("add", a=1, b=1))
            assert down.is_error and down.error_kind in ("server_error", "timeout")
            web.start()

            async def answers() -> bool:
                r = await tm.call(call("add", a=2, b=2))
                return not r.is_error and r.text == "4"

            await wait_until(answers, "the HTTP server to be reconnected")
    finally:
        web.kill()


@pytest.mark.skipif(sys.platform != "linux", reason="process-tree checks use Linux semantics")
async def test_close_during_calls_and_restarts_leaves_nothing(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "z.json", {"a": toolbox_entry(sessions=2), "b": toolbox_entry("--name", "b")})
    async with ToolManager.from_files([cfg]) as tm:
        pids = tm.servers["a"].pids + tm.servers["b"].pids
        assert len(pids) == 3
        await tm.call(call("b.crash"))  # b restarting while we close
        inflight = [asyncio.create_task(tm.call(call("a.sleep_ms", ms=60_000))) for _ in range(3)]
        await asyncio.sleep(0)
    results = await asyncio.gather(*inflight)
    assert all(r.is_error for r in results)
    assert not any(alive(p) for p in pids)


async def test_an_idempotent_call_lost_to_a_crash_runs_again_once_the_server_is_back(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "i.json", {"tb": toolbox_entry(tool_timeout_s=60)})
    async with ToolManager.from_files([cfg]) as tm:
        first = tm.servers["tb"].pids[0]
        got = await tm.call(call("crash_once", marker=str(tmp_path / "crashed")))  # its server dies under it
        assert not got.is_error and got.text == "survived" and got.retried and not got.infra
        assert tm.servers["tb"].pids[0] != first
        lost = await tm.call(call("crash"))  # not idempotent: the crash is reported, marked as the infrastructure's
        assert lost.is_error and lost.error_kind == "server_error" and lost.infra and not lost.retried
        m = tm.metrics()
        assert m["tools/retried"] == 1 and m["tools/infra_errors"] == 1 and m["tools/restarts"] == 2


async def test_a_call_during_failed_restart_attempts_waits_for_the_one_that_works(tmp_path, no_leftovers):
    # starts 2 and 3 fail: after the kill, two restart attempts fail before the third serves again
    cfg = write_config(tmp_path / "r.json", {"tb": toolbox_entry("--fail-starts", str(tmp_path / "starts"), "2,3",
                                                                  tool_timeout_s=60)})
    async with ToolManager.from_files([cfg]) as tm:
        first = tm.servers["tb"].pids[0]
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: not alive(first), "the server to die")
        got = await tm.call(call("add", a=40, b=2))
        assert not got.is_error and got.text == "42", got.text
        assert (tmp_path / "starts").read_text() == "4"


async def test_a_server_whose_first_start_fails_is_started_again(tmp_path, no_leftovers):
    cfg = write_config(tmp_path / "s.json", {"tb": toolbox_entry("--fail-starts", str(tmp_path / "starts"), "1,2")})
    async with ToolManager.from_files([cfg]) as tm:
        assert (await tm.call(call("add", a=1, b=1))).text == "2"
    assert (tmp_path / "starts").read_text() == "3"
    always = write_config(tmp_path / "a.json", {"tb": toolbox_entry("--fail-starts", str(tmp_path / "n"), "1,2,3")})
    with pytest.raises(ToolServerError, match="server 'tb'"):
        async with ToolManager.from_files([always]):
            pass
    assert (tmp_path / "n").read_text() == "3"  # START_ATTEMPTS tries, then the run is told
