"""`rlfactory envs doctor` and `rlfactory envs tasks --server`, run as a user would, against the stand-in AgentGym
server (a real uvicorn server) behind the real MCP bridge."""
from __future__ import annotations

import json

from test_env_bridge import bridge_config, rlf, start_http_server

from rlfactory.envs.textcraft import TextCraftEnv


def test_doctor_plays_an_episode_and_names_the_failing_stage(tmp_path, free_port):
    proc = start_http_server(free_port, "--task-set", "agentgym", env="babyai")
    try:
        live = bridge_config(tmp_path / "live.json", f"http://127.0.0.1:{free_port}")
        ok = rlf("envs", "doctor", "-c", str(live), "--task-id", "41")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        for stage in ("health", "reset(task_id=41)", "step(action='inventory')", "observe()", "close()"):
            assert f"✓ {stage}" in ok.stdout, ok.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    dead = bridge_config(tmp_path / "dead.json", f"http://127.0.0.1:{free_port}", "--timeout-s", "2")
    bad = rlf("envs", "doctor", str(dead))
    assert bad.returncode == 1 and "✗ health" in bad.stdout and "unreachable" in bad.stdout, bad.stdout
    assert "environment check failed: textcraft" in bad.stderr


def test_doctor_shows_an_error_reply_on_reset(tmp_path, free_port):
    # The server answers this reset with {"error": ...} (its goal is one our recipe set cannot craft).
    order = tmp_path / "goals.json"
    order.write_text(json.dumps({"goals": ["light blue dye", "lead"]}))
    proc = start_http_server(free_port, "--task-set", "agentgym", "--goal-order", str(order))
    try:
        # No sentinel instance: its create would shift the ids, and the stand-in's create resets an instance to
        # the task of its id, whose goal this order may leave uncraftable (AgentGym's server has no such ids).
        cfg = bridge_config(tmp_path / "tc.json", f"http://127.0.0.1:{free_port}", "--no-sentinel")
        bad = rlf("envs", "doctor", str(cfg), "--task-id", "0")
        out = bad.stdout.replace("\n", " ")
        assert bad.returncode == 1 and "✗ reset(task_id=0)" in out and "light blue dye" in out, out
        good = rlf("envs", "doctor", str(cfg), "--task-id", "1")
        assert good.returncode == 0 and "Goal: craft lead." in good.stdout.replace("\n", " "), good.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tasks_read_off_a_server_name_its_goals(tmp_path, free_port):
    proc = start_http_server(free_port, "--task-set", "agentgym")
    try:
        out, goals = tmp_path / "rows.jsonl", tmp_path / "goals.json"
        r = rlf("envs", "tasks", "--env", "textcraft", "--server", f"http://127.0.0.1:{free_port}", "--ids", "0:12",
                "--server-name", "textcraft_real", "--out", str(out), "--goals-out", str(goals))
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ours = TextCraftEnv(task_set="agentgym")
    assert [row["env"] for row in rows] == [{"server": "textcraft_real", "task_id": i} for i in range(12)]
    for i, row in enumerate(rows):
        assert row["prompt"].startswith(f"TextCraft task {i}: craft {ours.reset(i).info['goal']}.")
    # The goals file is a goal order our own TextCraft takes: the same goal per id.
    replay = TextCraftEnv(task_set="agentgym", goal_order=str(goals))
    assert [replay.reset(i).info["goal"] for i in range(12)] == [ours.reset(i).info["goal"] for i in range(12)]
    bad = rlf("envs", "tasks", "--env", "textcraft", "--ids", "a:b", "--out", str(out))
    assert bad.returncode == 1 and "--ids" in bad.stderr and "Traceback" not in bad.stderr


def test_doctor_given_no_file_checks_the_environments_file(tmp_path):
    """`rlfactory envs doctor` with no file reads mcp_configs/envs.json (default.json holds tools, not
    environments); run from an empty folder, the shipped one."""
    ok = rlf("envs", "doctor", "--server", "textcraft", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "textcraft" in ok.stdout and "✓ reset(task_id=0)" in ok.stdout, ok.stdout
