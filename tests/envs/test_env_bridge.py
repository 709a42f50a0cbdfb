"""AgentGym's HTTP env protocol: our TextCraft served over it by the stand-in server (a real uvicorn server on
127.0.0.1 that answers as AgentGym's own servers do, quirks included), `EnvClient` on its own, and the MCP bridge in
front of it, in each of the real servers' error modes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rlfactory.envs.client import OVER, EnvClient, EnvReplyError, EnvServerError, check_upstream
from rlfactory.envs.solvers import textcraft_plan

REPO = Path(__file__).resolve().parents[2]
BRIDGE = str(REPO / "envs/tools/agentgym_bridge.py")


def start_http_server(port: int, *extra: str, env: str = "textcraft") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(REPO / "envs/tools/agentgym_http_server.py"), "--env", env,
                             "--port", str(port), *extra], cwd=REPO)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agentgym_http_server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("agentgym_http_server did not come up in 60 s")


@pytest.fixture
def http_server(free_port):
    """`url = http_server(*extra_args)`: the stand-in server on a free port, stopped after the test."""
    procs = []

    def start(*extra: str) -> str:
        procs.append(start_http_server(free_port, *extra))
        return f"http://127.0.0.1:{free_port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def textcraft_http(http_server):
    return http_server()


def rlf(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The `rlfactory` CLI as a user runs it (from the checkout, or from `cwd`)."""
    exe = Path(sys.executable).parent / "rlfactory"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rlfactory.cli"]
    return subprocess.run([*cmd, *args], cwd=cwd, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
                          capture_output=True, text=True, timeout=240)


def bridge_config(path: Path, url: str, *extra: str) -> Path:
    path.write_text(json.dumps({"mcpServers": {"textcraft": {
        "command": sys.executable, "args": [BRIDGE, "--url", url, "--env", "textcraft", *extra],
        "rlfactory": {"cache": False}}}}))
    return path


def test_env_client_plays_a_task(textcraft_http):
    with EnvClient("textcraft", base_url=textcraft_http) as client:
        first = client.reset(11)
        assert "Goal: craft" in first.observation and client.env_id is not None
        assert first.info["task_id"] == 11
        assert client.observe() == first.observation
        result = None
        for action in textcraft_plan(first.observation):
            result = client.step(action)
            assert result.info["task_id"] == 11
        assert result.done and result.reward == 1.0 and result.score == 1.0
        env_id = client.env_id
    # Closed on the server: the id is gone, and the server says so the AgentGym way (HTTP 200, {"error": ...}).
    r = httpx.post(f"{textcraft_http}/step", json={"id": env_id, "action": "inventory"})
    assert r.status_code == 200 and r.json() == {"error": f"The id {env_id} is not valid."}


def test_the_stand_in_answers_with_the_real_servers_shapes(http_server):
    url = http_server()
    assert httpx.post(f"{url}/create").status_code == 422  # TextCraft's /create needs a body
    created = httpx.post(f"{url}/create", json={}).json()
    assert set(created) == {"id", "observation", "done", "reward"} and "Goal: craft" in created["observation"]
    reset = httpx.post(f"{url}/reset", json={"id": created["id"], "data_idx": 3}).json()
    assert set(reset) == {"id", "observation", "done", "reward"}
    step = httpx.post(f"{url}/step", json={"id": created["id"], "action": "inventory"}).json()
    assert set(step) == {"observation", "reward", "done"}  # no score
    assert isinstance(httpx.get(f"{url}/observation", params={"id": created["id"]}).json(), str)
    assert httpx.post(f"{url}/step", json={"env_idx": created["id"], "action": "x"}).status_code == 422
    assert httpx.post(f"{url}/close", json={"id": created["id"]}).json() is True
    assert httpx.post(f"{url}/close", json={"id": created["id"]}).json() is False


def test_env_client_two_instances_are_independent(textcraft_http):
    with EnvClient("textcraft", textcraft_http) as a, EnvClient("textcraft", textcraft_http) as b:
        a.reset(1)
        b.reset(1)
        assert a.env_id != b.env_id
        a.step("get 2 oak log")
        assert "oak log" in a.step("inventory").observation
        assert "not carrying" in b.step("inventory").observation


def test_env_client_protocol_variant_env_idx(http_server):
    url = http_server("--id-key", "env_idx")
    with EnvClient("textcraft", url, id_key="env_idx") as client:
        obs = client.reset(4).observation
        assert "Goal: craft" in obs
        assert client.step("get 1 oak log").observation == "Got 1 oak log"
    with EnvClient("textcraft", url) as wrong:  # `id` sent to an `env_idx` server: the 422 names the field
        with pytest.raises(EnvReplyError, match="422.*env_idx"):
            wrong.reset(0)


def test_env_client_errors_name_the_server(free_port):
    client = EnvClient("textcraft", f"http://127.0.0.1:{free_port}", timeout_s=2)
    with pytest.raises(EnvServerError, match="is the server running"):
        client.reset(0)
    with pytest.raises(EnvServerError, match="call reset"):
        client.step("inventory")
    client.close()
    ok, detail = check_upstream(f"http://127.0.0.1:{free_port}", timeout_s=2)
    assert not ok and "unreachable" in detail


def test_the_upstream_check_counts_any_answer_as_up(textcraft_http):
    ok, detail = check_upstream(textcraft_http)
    assert ok and "This is environment textcraft" in detail
    ok, detail = check_upstream(f"{textcraft_http}/no-such-page")  # a server without GET / is still up
    assert ok and "answered 404" in detail


def test_a_dropped_instance_is_an_error_and_reset_recreates_it(http_server):
    url = http_server("--max-instances", "1")  # the server keeps one instance: a second one drops the first
    with EnvClient("textcraft", url) as a, EnvClient("textcraft", url) as b:
        a.reset(2)
        dropped = a.env_id
        b.reset(5)  # drops a's instance on the server
        with pytest.raises(EnvReplyError, match=f"The id {dropped} is not valid") as e:
            a.step("inventory")
        assert e.value.message == f"The id {dropped} is not valid."
        with pytest.raises(EnvReplyError, match="not valid"):
            a.observe()
        again = a.reset(2)  # a stale id is recreated, not left stuck
        assert a.env_id != dropped and "Goal: craft" in again.observation and again.info["task_id"] == 2
        assert a.step("inventory").observation.startswith("Inventory")


@pytest.mark.parametrize("flavor", ["textcraft", "babyai"])
def test_a_step_after_done_is_answered_as_done(http_server, flavor):
    # TextCraft's server answers done false after a win; BabyAI's answers {"error": "... has finished."}.
    url = http_server("--flavor", flavor)
    with EnvClient("textcraft", url) as client:
        first = client.reset(7)
        for action in textcraft_plan(first.observation):
            last = client.step(action)
        assert last.done and last.score == 1.0
        raw = httpx.post(f"{url}/step", json={"id": client.env_id, "action": "inventory"}).json()
        assert raw.get("done") is False if flavor == "textcraft" else "has finished" in raw["error"]
        after = client.step("inventory")
        assert after.done and after.reward == 0.0 and after.score == 1.0 and after.observation == OVER
        assert after.info["task_id"] == 7


async def test_bridge_serves_the_http_env_over_mcp(open_env, textcraft_http):
    async with open_env("agentgym_bridge.py", "--url", textcraft_http, "--env", "textcraft") as env:
        _, s = await env.call("reset", task_id=21, episode_id="g")
        assert "Goal: craft" in s["observation"] and s["task_id"] == 21
        for action in textcraft_plan(s["observation"]):
            text, s = await env.call("step", action=action, episode_id="g")
            assert s["task_id"] == 21
        assert s["done"] and s["reward"] == 1.0 and s["score"] == 1.0
        assert text.startswith("[reward=1 score=1 done=true]")
        _, s = await env.call("step", action="inventory", episode_id="g")
        assert s["done"] and s["reward"] == 0.0 and s["task_id"] == 21
        _, s = await env.call("observe", episode_id="g")
        assert "Task complete" in s["observation"]  # AgentGym's TextCraft shows the last observation it sent
        health = await env.session.read_resource("rlfactory://health")
        assert json.loads(health.contents[0].text)["ok"] is True
        _, closed = await env.call("close", episode_id="g")
        assert closed["closed"]


async def test_bridge_answers_server_errors_as_error_results(open_env, http_server):
    url = http_server("--max-instances", "1")
    # no sentinel instance: the stand-in's dropping would read as a restart (the real servers never drop one)
    async with open_env("agentgym_bridge.py", "--url", url, "--env", "textcraft", "--no-sentinel") as env:
        await env.call("reset", task_id=1, episode_id="a")
        await env.call("reset", task_id=2, episode_id="b")  # the server drops a's instance
        for tool, args in (("step", {"action": "inventory"}), ("observe", {})):
            result = await env.session.call_tool(tool, {**args, "episode_id": "a"})
            assert result.is_error and "is not valid" in result.content[0].text
            assert "{" not in result.content[0].text.split("error:", 1)[-1]  # the message, not a dict repr
        _, s = await env.call("reset", task_id=1, episode_id="a")  # recreated
        assert "Goal: craft" in s["observation"] and s["task_id"] == 1


async def test_bridge_reports_an_unreachable_server_as_an_error(open_env, free_port):
    async with open_env("agentgym_bridge.py", "--url", f"http://127.0.0.1:{free_port}", "--timeout-s", "2") as env:
        result = await env.session.call_tool("reset", {"task_id": 0, "episode_id": "dead"})
        assert result.is_error and "is the server running" in result.content[0].text
        # nothing a reward could read as a step; marked as the infrastructure's failure, not the env's answer
        assert result.structured_content == {"rlfactory/infra": True}
        health = await env.session.read_resource("rlfactory://health")
        report = json.loads(health.contents[0].text)
        assert report["ok"] is False and "unreachable" in report["detail"]


async def test_an_unreachable_upstream_is_an_infra_failure_a_reply_error_is_not(tmp_path, free_port, http_server):
    from rlfactory.tools.manager import ToolManager
    from rlfactory.tools.mcp_configs import load_mcp_configs
    from rlfactory.tools.types import ToolCall

    dead = bridge_config(tmp_path / "dead.json", f"http://127.0.0.1:{free_port}", "--timeout-s", "2")
    async with ToolManager(load_mcp_configs([dead])) as tools:
        r = await tools.call(ToolCall(name="textcraft.reset", arguments={"task_id": 0, "episode_id": "x"}))
    assert r.is_error and r.infra and "is the server running" in r.text
    live = bridge_config(tmp_path / "live.json", http_server("--max-instances", "1"), "--no-sentinel")
    async with ToolManager(load_mcp_configs([live])) as tools:
        for ep in ("a", "b"):  # b's instance drops a's on the server
            await tools.call(ToolCall(name="textcraft.reset", arguments={"task_id": 1, "episode_id": ep}))
        r = await tools.call(ToolCall(name="textcraft.step", arguments={"action": "inventory", "episode_id": "a"}))
    assert r.is_error and not r.infra and "is not valid" in r.text


async def test_setup_mcp_checks_the_bridged_upstream(tmp_path, free_port, http_server):
    from rlfactory.tools.setup_mcp import run_setup

    dead = bridge_config(tmp_path / "dead.json", f"http://127.0.0.1:{free_port}", "--timeout-s", "2")
    report = await run_setup([dead])
    assert not report.ok
    (problem,) = report.problems()
    assert "server 'textcraft'" in problem and "health check failed" in problem and "unreachable" in problem

    live = bridge_config(tmp_path / "live.json", http_server())
    report = await run_setup([live])
    assert report.ok, report.problems()
    assert "This is environment textcraft" in report.servers[0].health


def test_cli_setup_mcp_and_tools_call_fail_on_a_dead_upstream(tmp_path, free_port):
    cfg = bridge_config(tmp_path / "dead.json", f"http://127.0.0.1:{free_port}", "--timeout-s", "2")
    setup = rlf("setup-mcp", "--config", str(cfg), "--cache-backend", "none")
    assert setup.returncode == 1 and "unreachable" in setup.stderr, setup.stdout + setup.stderr
    call = rlf("tools", "call", "-c", str(cfg), "textcraft.reset", '{"task_id": 0}')
    assert call.returncode == 1 and "is the server running" in call.stdout, call.stdout + call.stderr
    for form in (["-c", str(cfg)], [str(cfg)]):  # `tools list` takes the config as `tools call` does, or as before
        listed = rlf("tools", "list", *form, "--json")
        assert listed.returncode == 0, listed.stderr
        assert {t["function"]["name"] for t in json.loads(listed.stdout)} == {"reset", "step", "observe", "close"}
