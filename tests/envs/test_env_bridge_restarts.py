"""The AgentGym bridge against a restarting, real stand-in server (a subprocess killed and started again on the same
port, numbering its instances from 0 again, as AgentGym's own servers do) and bridges run as real subprocesses:

- an episode opened before the restart whose id the new server gave to another episode fails as an infrastructure
  failure, and never acts on that episode's instance, nor closes it; each way of seeing the restart is tried alone
  (ids going back on create, in one process and across the processes of one host; the sentinel instance, across
  hosts; the observation check, across hosts without a sentinel);
- every instance a bridge opened is closed on the server when its session ends: by the client closing it, by
  stdin EOF, by SIGTERM (the stand-in's instance table says what is left);
- a step after a failed reset is refused without asking the server, as an infrastructure failure naming both."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from agentgym_stand_in import BridgeProcess, StandIn

from rlfactory.envs.client import EnvClient, EnvReplyError, EnvResetFailed
from rlfactory.envs.textcraft import TextCraftEnv

INFRA = {"rlfactory/infra": True}


@pytest.fixture
def stand_in(free_port, tmp_path):
    """`stand_in(*args)`: the stand-in server on a free port (restartable), stopped after the test."""
    started: list[StandIn] = []

    def start(*args: str) -> StandIn:
        server = StandIn(free_port, *args, log=tmp_path / "stand_in.log").start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def bridges(tmp_path):
    """`bridges(url, *args, host="a")`: a bridge subprocess; bridges of one `host` share a restart record."""
    started: list[BridgeProcess] = []

    def start(url: str, *args: str, host: str = "a") -> BridgeProcess:
        n = len(started)
        bridge = BridgeProcess(url, *args, state_dir=tmp_path / f"host-{host}", stderr=tmp_path / f"bridge{n}.log")
        started.append(bridge)
        return bridge

    yield start
    for bridge in started:
        bridge.kill()


def wait_for_instances(server: StandIn, expected: list[int], deadline_s: float = 30.0) -> list[int]:
    """The server's live instances once they are `expected` (a closing bridge needs a moment); hang guard only."""
    deadline = time.monotonic() + deadline_s
    live = server.instances()
    while live != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        live = server.instances()
    return live


def episode_instances(server: StandIn) -> list[int]:
    """The live instances that are episodes' (not a bridge's sentinel)."""
    return [i for i in server.instances() if "rlfactory-sentinel" not in str(server.observation(i))]


# The bridge options that leave one way of seeing the restart (B's bridge: the same process, another process of the
# same host, or another host).
WAYS = {
    "ids_back_one_process": ("--no-sentinel", "--no-verify-owner"),
    "ids_back_one_host": ("--no-sentinel", "--no-verify-owner"),
    "sentinel_other_host": ("--no-verify-owner",),
    "observation_other_host": ("--no-sentinel",),
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_an_episode_from_before_a_restart_never_acts_on_the_new_episode_with_its_id(stand_in, bridges, way):
    server = stand_in()
    opts = WAYS[way]
    a_bridge = bridges(server.url, *opts, host="a")
    _, s, err = a_bridge.call("reset", task_id=3, episode_id="A")
    assert not err and s["task_id"] == 3
    _, s, err = a_bridge.call("step", action="get 2 oak log", episode_id="A")
    assert not err and s["observation"] == "Got 2 oak log"
    (a_id,) = episode_instances(server)

    server.restart()  # a new server: every instance is gone, and ids start from 0 again
    if way == "ids_back_one_process":
        b_bridge = a_bridge
    else:
        b_bridge = bridges(server.url, *opts, host="a" if way == "ids_back_one_host" else "b")
    _, s, err = b_bridge.call("reset", task_id=5, episode_id="B")
    assert not err and s["task_id"] == 5
    _, s, err = b_bridge.call("step", action="get 3 oak log", episode_id="B")
    assert not err and s["observation"] == "Got 3 oak log"
    assert a_id in server.instances()  # B holds A's old id now
    b_before = server.observation(a_id)

    for tool, args in (("step", {"action": "get 1 cobblestone"}), ("observe", {}), ("step", {"action": "inventory"})):
        text, s, err = a_bridge.call(tool, episode_id="A", **args)
        assert err and s == INFRA, (tool, text)  # an infrastructure failure: kept out of the loss
        assert "not this episode's any more" in text and server.url in text and "Nothing was sent" in text
    assert server.observation(a_id) == b_before  # B's instance saw nothing of A
    _, closed, err = a_bridge.call("close", episode_id="A")
    assert not err and closed["closed"]
    assert a_id in server.instances()  # closing A did not close B's instance
    text, s, err = b_bridge.call("step", action="inventory", episode_id="B")
    assert not err and s["observation"] == "Inventory: [oak log] (3)", text  # B's items only


def test_the_old_episode_can_start_again_after_a_restart(stand_in, bridges):
    server = stand_in()
    bridge = bridges(server.url)
    bridge.call("reset", task_id=3, episode_id="A")
    server.restart()
    text, _, err = bridge.call("step", action="inventory", episode_id="A")
    assert err and "not this episode's any more" in text  # seen by the sentinel: its id is gone
    _, s, err = bridge.call("reset", task_id=4, episode_id="A")  # a new instance for the same episode id
    assert not err and s["task_id"] == 4
    _, s, err = bridge.call("step", action="inventory", episode_id="A")
    assert not err and s["observation"].startswith("Inventory")


def session_ends(way: str, bridge: BridgeProcess) -> int:
    """End the bridge's session by stdin EOF or SIGTERM; returns its exit status."""
    return bridge.end_by_eof() if way == "eof" else bridge.end_by_signal()


@pytest.mark.parametrize("way", ["eof", "sigterm"])
def test_every_instance_a_bridge_opened_is_closed_when_its_session_ends(stand_in, bridges, way):
    server = stand_in()
    bridge = bridges(server.url)
    for i in range(4):
        _, _, err = bridge.call("reset", task_id=i, episode_id=f"e{i}")
        assert not err
    bridge.call("step", action="get 1 oak log", episode_id="e1")
    _, closed, _ = bridge.call("close", episode_id="e0")  # the episode's own end closes its instance at once
    assert closed["closed"] and len(episode_instances(server)) == 3
    status = session_ends(way, bridge)
    assert wait_for_instances(server, []) == []
    assert status == (0 if way == "eof" else 143)  # SIGTERM: closed, then it exits as terminated


async def test_instances_close_when_the_mcp_client_closes_the_session(stand_in, tmp_path):
    from rlfactory.tools.manager import ToolManager
    from rlfactory.tools.mcp_configs import load_mcp_configs
    from rlfactory.tools.types import ToolCall

    server = stand_in()
    cfg = tmp_path / "bridge.json"
    cfg.write_text(json.dumps({"mcpServers": {"textcraft": {
        "command": sys.executable, "args": [str(Path(__file__).parents[2] / "envs/tools/agentgym_bridge.py"), "--url",
                                      server.url, "--state-dir", str(tmp_path / "state")],
        "rlfactory": {"cache": False}}}}))
    async with ToolManager(load_mcp_configs([cfg])) as tools:
        for i in range(3):  # the trajectories' episodes, named by their ids: never closed by the loop here
            r = await tools.call(ToolCall(name="textcraft.reset", arguments={"task_id": i, "episode_id": f"t{i}"}))
            assert not r.is_error, r.text
        assert len(episode_instances(server)) == 3
    assert wait_for_instances(server, []) == []


def goal_order(tmp_path: Path) -> Path:
    """AgentGym task ids 0 and 1 craftable, 2 a goal our recipes cannot craft (its reset fails)."""
    goals = TextCraftEnv(task_set="agentgym").goals[:2] + ["netherite upgrade smithing template"]
    path = tmp_path / "goals.json"
    path.write_text(json.dumps({"goals": goals}))
    return path


@pytest.mark.parametrize("flavor", ["textcraft", "babyai"])
def test_a_step_after_a_failed_reset_is_refused_without_asking_the_server(stand_in, bridges, tmp_path, flavor):
    server = stand_in("--flavor", flavor, "--task-set", "agentgym", "--goal-order", str(goal_order(tmp_path)))
    with EnvClient("textcraft", server.url, state_dir=tmp_path / "state") as client:
        with pytest.raises(EnvReplyError, match="cannot craft"):
            client.reset(2)
        before = server.observation(client.env_id)
        with pytest.raises(EnvResetFailed, match=r"reset\(task_id=2\) failed .*cannot craft.* the step was not sent"):
            client.step("inventory")
        assert server.observation(client.env_id) == before  # nothing reached the server
        assert client.reset(1).info["task_id"] == 1  # a reset that works clears it
        assert client.step("inventory").observation.startswith("Inventory")

    bridge = bridges(server.url)
    text, s, err = bridge.call("reset", task_id=2, episode_id="x")
    assert err and "cannot craft" in text
    text, s, err = bridge.call("step", action="inventory", episode_id="x")
    assert err and s == INFRA
    assert server.url in text and "reset(task_id=2) failed" in text and "the step was not sent" in text


def test_concurrent_creates_answered_out_of_order_are_not_a_restart(stand_in, tmp_path):
    # Ids come back out of order when creates overlap (16 threads here, and a second process's watch): only an id
    # not above what was seen *before the create was sent* shows a restart.
    import threading

    from rlfactory.envs.restarts import RestartWatch

    server = stand_in()
    other = RestartWatch(server.url, tmp_path / "state")  # another process of the host, same record
    epoch = other.epoch()
    failures: list[BaseException] = []

    def play(i: int) -> None:
        try:
            for round_ in range(3):
                with EnvClient("textcraft", server.url, state_dir=tmp_path / "state") as client:
                    client.reset(i + round_)
                    client.step("get 1 oak log")
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=play, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
    assert other.epoch() == epoch and other.before_create().high_water == 47  # 48 creates, one epoch
    assert wait_for_instances(server, []) == []
