"""The TextCraft CPU smoke recipe run as a user would (`rlfactory train`, `rlfactory rollout`) on `model.path:
tiny-random`: the environment's tool schemas and first observation fit the context, each trajectory gets its own
episode (reset before the first turn, close at the end), and one GRPO update runs. Also: tiny-random is not a path,
and the verl engine refuses it naming model.path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "agentgym_textcraft_smoke.yaml"

# A random model's env reward is 0 for every sample, so every GRPO group ties and the update has nothing to do. This
# reward differs between samples (a hash of the sampled ids), which is all the update needs to run forward/backward.
SPREAD_REWARD = '''
def id_spread(trajectory):
    return (sum(trajectory.response_ids) % 101) / 100
'''


def rlf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "rlfactory.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_textcraft_smoke_recipe_trains_one_step_on_tiny_random(tmp_path):
    reward_file = tmp_path / "spread.py"
    reward_file.write_text(SPREAD_REWARD)
    out = tmp_path / "run"
    proc = rlf("train", str(RECIPE), "--output-dir", str(out), "--set", "trainer.total_steps=1",
               "--set", f"rewards.functions.1={{function: '{reward_file}:id_spread', weight: 1.0}}")
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
    proc = rlf("rollout", str(RECIPE), "--limit", "1", "--out", str(out))
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
