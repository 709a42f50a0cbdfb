"""`tools/restarts` in per-batch metrics: a server lost during a batch counts in THAT batch, even when its restart
finishes after the batch's metrics were read (the AgentLoop re-bases the counters at the start of each batch), and
it is never counted twice. Real toolbox MCP server processes."""
from __future__ import annotations

import asyncio
import time

import pytest
from mcp_helpers import toolbox_entry, write_config

from rlfactory.tools.manager import ToolManager
from rlfactory.tools.types import ToolCall


async def _wait_restarted(tm: ToolManager, name: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while tm.servers[name].restarts < 1:
        if time.monotonic() > deadline:
            pytest.fail(f"server {name} was not restarted")
        await asyncio.sleep(0.05)


async def test_a_restart_still_in_progress_counts_in_the_batch_that_lost_the_server(tmp_path):
    cfg = write_config(tmp_path / "r.json", {"tb": toolbox_entry(tool_timeout_s=60)})
    async with ToolManager.from_files([cfg]) as tm:
        tm.reset_metrics()  # batch 1 starts
        crashed = await tm.call(ToolCall(name="crash", arguments={}))
        assert crashed.is_error and crashed.error_kind == "server_error"
        batch1 = tm.metrics()  # read at once, before the restart (backoff + process start) can finish
        assert batch1["tools/restarts"] == 1
        await _wait_restarted(tm, "tb")
        tm.reset_metrics()  # batch 2: nothing died in it
        assert (await tm.call(ToolCall(name="echo", arguments={"text": "back"}))).text == "back"
        assert tm.metrics()["tools/restarts"] == 0
        # and a loss in batch 2 counts there, once
        assert (await tm.call(ToolCall(name="crash", arguments={}))).error_kind == "server_error"
        assert (await tm.call(ToolCall(name="echo", arguments={"text": "again"}))).text == "again"
        assert tm.metrics()["tools/restarts"] == 1
