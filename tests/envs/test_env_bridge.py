"""AgentGym's HTTP env protocol: our TextCraft served over it (a real uvicorn server on 127.0.0.1), `EnvClient`
on its own, and the MCP bridge in front of it."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from solvers import textcraft_plan

from rlfactory.envs.client import EnvClient, EnvServerError

REPO = Path(__file__).resolve().parents[2]


def start_http_server(port: int, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(REPO / "envs/tools/agentgym_http_server.py"), "--env", "textcraft",
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
def textcraft_http(free_port):
    proc = start_http_server(free_port)
    yield f"http://127.0.0.1:{free_port}"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def textcraft_http_env_idx(free_port):
    proc = start_http_server(free_port, "--id-key", "env_idx")
    yield f"http://127.0.0.1:{free_port}"
    proc.terminate()
    proc.wait(timeout=10)


def test_env_client_plays_a_task(textcraft_http):
    with EnvClient("textcraft", base_url=textcraft_http) as client:
        first = client.reset(11)
        assert "Goal: craft" in first.observation and client.env_id is not None
        assert client.observe() == first.observation
        result = None
        for action in textcraft_plan(first.observation):
            result = client.step(action)
        assert result.done and result.reward == 1.0 and result.score == 1.0
        env_id = client.env_id
    # Closed on the server: the id is gone.
    r = httpx.post(f"{textcraft_http}/step", json={"id": env_id, "action": "inventory"})
    assert r.status_code == 404


def test_env_client_two_instances_are_independent(textcraft_http):
    with EnvClient("textcraft", textcraft_http) as a, EnvClient("textcraft", textcraft_http) as b:
        a.reset(1)
        b.reset(1)
        assert a.env_id != b.env_id
        a.step("get 2 oak log")
        assert "oak log" in a.step("inventory").observation
        assert "not carrying" in b.step("inventory").observation


def test_env_client_protocol_variant_env_idx(textcraft_http_env_idx):
    with EnvClient("textcraft", textcraft_http_env_idx, id_key="env_idx") as client:
        obs = client.reset(4).observation
        assert "Goal: craft" in obs
        assert client.step("get 1 oak log").observation == "Got 1 oak log"


def test_env_client_errors_name_the_server(free_port):
    client = EnvClient("textcraft", f"http://127.0.0.1:{free_port}", timeout_s=2)
    with pytest.raises(EnvServerError, match="is the server running"):
        client.reset(0)
    with pytest.raises(EnvServerError, match="call reset"):
        client.step("inventory")
    client.close()


async def test_bridge_serves_the_http_env_over_mcp(open_env, textcraft_http):
    async with open_env("agentgym_bridge.py", "--url", textcraft_http, "--env", "textcraft") as env:
        _, s = await env.call("reset", task_id=21, episode_id="g")
        assert "Goal: craft" in s["observation"] and s["task_id"] == 21
        for action in textcraft_plan(s["observation"]):
            text, s = await env.call("step", action=action, episode_id="g")
        assert s["done"] and s["reward"] == 1.0 and s["score"] == 1.0
        assert text.startswith("[reward=1 score=1 done=true]")
        _, s = await env.call("observe", episode_id="g")
        assert "Goal: craft" in s["observation"]
        _, closed = await env.call("close", episode_id="g")
        assert closed["closed"]


async def test_bridge_reports_an_unreachable_server_as_an_observation(open_env, free_port):
    async with open_env("agentgym_bridge.py", "--url", f"http://127.0.0.1:{free_port}", "--timeout-s", "2") as env:
        _, s = await env.call("reset", task_id=0, episode_id="dead")
        assert s["observation"].startswith("Environment server error") and "is the server running" in \
            s["observation"]
        assert s["done"] is False
