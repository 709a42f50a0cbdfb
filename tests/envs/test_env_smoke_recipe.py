"""The TextCraft CPU smoke recipe run as a user would (`rlfactory train`, `rlfactory rollout`) on `model.path:
tiny-random`: the environment's tool schemas and first observation fit the context, each trajectory gets its own
episode (reset before the first turn, close at the end), and one GRPO update runs. Also: tiny-random is not a path,
and the verl engine refuses it naming model.path."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_runs import REPO, SPREAD_REWARD, rlf

RECIPE = REPO / "recipes" / "agentgym_textcraft_smoke.yaml"



def test_textcraft_smoke_recipe_trains_one_step_on_tiny_random(tmp_path):
    reward_file = tmp_path / "spread.py"
    reward_file.write_text(SPREAD_REWARD)
    out = tmp_path / "run"
    proc = rlf("train", str(RECIPE), "--output-dir", str(out), "--set", "trainer.total_steps=1",
               "--set", f"rewards.functions.1={{function: '{reward_file}:id_spread', weight: 1.0}}", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (row,) = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    n = row["rollout/trajectories"]
    assert n == 4  # 2 prompts x 2 samples
    # The schemas + the reset observation are far past the old 512-position model, and they fit now.
    assert row["rollout/prompt_tokens_mean"] > 512
    assert row["rollout/finish_context_length"] == 0 and row["rollout/finish_error"] == 0
    assert row["rollout/num_turns_mean"] >= 1 and row["rollout/policy_tokens_mean"] > 0
    # one reset before the first turn and one close at the end, per trajectory, on the real server
    assert row["tools/textcraft/calls"] >= 2 * n and row["tools/textcraft/errors"] == 0
    assert row["rollout/rows_with_signal"] > 0 and row["loss/grad_norm"] > 0
    assert row["reward/env_score"] == pytest.approx(0.0, abs=1.0)  # present: the env reward reached the reward set
    assert (out / "checkpoints").is_dir() and (out / "summary.json").is_file()


def test_textcraft_smoke_recipe_rollout_shows_the_first_observation(tmp_path):
    out = tmp_path / "trajs.jsonl"
    proc = rlf("rollout", str(RECIPE), "--limit", "1", "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajs = [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()]
    assert len(trajs) == 2
    for t in trajs:
        assert t["finish_reason"] != "context_length" and t["response_ids"]
        users = [m["content"] for m in t["messages"] if m["role"] == "user"]
        assert "Call reset" not in users[0]  # the loop opens the episode; the prompt no longer asks the policy to
        assert "Crafting commands" in users[1]  # the reset observation, shown before the first turn


def test_tiny_random_is_not_a_path_and_verl_refuses_it(tmp_path):
    from rlfactory.api import train
    from rlfactory.errors import ConfigError
    from rlfactory.preflight import check_recipe
    from rlfactory.recipe.schema import Recipe
    from rlfactory.recipe.training import TINY_RANDOM_MODEL

    recipe = Recipe.from_yaml(RECIPE)
    assert recipe.model.path == TINY_RANDOM_MODEL
    assert recipe.with_overrides(["trainer.seed=1"]).model.path == TINY_RANDOM_MODEL
    assert not check_recipe(RECIPE, for_training=True).errors
    check = check_recipe(RECIPE, ["engine=verl"])
    assert any("model.path: tiny-random is a local-engine option" in e for e in check.errors), check.errors
    too_long = check_recipe(RECIPE, ["rollout.max_context_tokens=8192"], for_training=True)
    assert any("tiny-random model's 4096 positions" in e for e in too_long.errors), too_long.errors
    with pytest.raises(ConfigError, match="model.path: tiny-random"):
        train(recipe.with_overrides(["engine=verl", f"trainer.output_dir={tmp_path}"]), dry_run=True)


# Goals AgentGym's own TextCraft server sets for these task ids (seen when it ran; the project's own task set
# names acacia boat / acacia door / anvil there).
REAL_SERVER_GOALS = {0: "light blue dye", 3: "green stained glass", 17: "lead"}


def test_the_smoke_recipe_shows_the_servers_goal_and_its_rows_name_no_other():
    from rlfactory.envs.textcraft import TextCraftEnv
    from rlfactory.models.tokenizer import load_qwen_tokenizer
    from rlfactory.recipe.schema import Recipe
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.rollout.truncation import truncate_tokens

    recipe = Recipe.from_yaml(RECIPE)
    rows = [json.loads(ln) for f in (recipe.data.train_file, recipe.data.val_file)
            for ln in Path(str(f)).read_text().splitlines() if ln.strip()]  # resolved by the recipe loader
    ids = {r["env"]["task_id"] for r in rows}
    assert set(REAL_SERVER_GOALS) <= ids
    # The rows name no goal: the goal is the server's, read from its reset observation (ours or AgentGym's).
    known = set(TextCraftEnv().goals) | set(TextCraftEnv(task_set="agentgym").goals)
    for row in rows:
        named = {g for g in known if f"craft {g}" in row["prompt"]}
        assert named <= {REAL_SERVER_GOALS.get(row["env"]["task_id"])}, (row["id"], named)
    # The local server numbers tasks as AgentGym's does.
    (cfg,) = recipe.tools.mcp_configs
    server = json.loads(Path(RECIPE.parent, cfg).read_text())["mcpServers"][recipe.tools.servers[0]]
    assert server["args"][-2:] == ["--task-set", "agentgym"]

    # Every row's reset observation (AgentGym's shape: the crafting commands, then the goal) keeps its goal line
    # through the recipe's tool-response budget, and so does one with three times as many commands.
    ro = recipe.rollout
    chat = ChatFormat(load_qwen_tokenizer(), None)

    def seen(text: str) -> str:
        return truncate_tokens(chat.neutralize(text), ro.tool_response_max_tokens, ro.tool_response_truncation,
                               chat.encode, chat.decode)[0]

    env = TextCraftEnv(task_set="agentgym")
    for task_id in sorted(ids):
        observation = env.reset(task_id).observation
        assert seen(observation).endswith(f"Goal: craft {env.goal}."), task_id
    commands = "\n".join(env.commands * 3)
    assert seen(f"Crafting commands:\n{commands}\n\nGoal: craft light blue dye.").endswith(
        "Goal: craft light blue dye.")


def test_rollout_summary_counts_infra_failures(tmp_path, free_port):
    cfg = tmp_path / "dead.json"  # the bridge in front of an AgentGym server that is down
    cfg.write_text(json.dumps({"mcpServers": {"textcraft": {
        "command": sys.executable,
        "args": [str(REPO / "envs/tools/agentgym_bridge.py"), "--url", f"http://127.0.0.1:{free_port}",
                 "--timeout-s", "2", "--state-dir", str(tmp_path / "state")],
        "rlfactory": {"cache": False}}}}))
    proc = rlf("rollout", str(RECIPE), "--limit", "1", "--out", str(tmp_path / "t.jsonl"),
               "--set", f"tools.mcp_configs=[{cfg}]", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if "rollout/infra_failed" in ln]
    assert line.replace("│", " ").split() == ["rollout/infra_failed", "2"], proc.stdout
