"""Recipe loading and validation: typos named with a suggestion, every problem at once, overrides, paths, the
`validate` CLI (non-zero exit, no traceback), and the shipped recipes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlfactory.errors import ConfigError
from rlfactory.preflight import check_recipe, validate_recipe
from rlfactory.recipe.files import apply_overrides
from rlfactory.recipe.schema import Recipe

REPO = Path(__file__).resolve().parents[2]


def write_recipe(tmp: Path, recipe: dict, *, rows: int = 3) -> Path:
    (tmp / "train.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                                             for i in range(rows)))
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def base() -> dict:
    return {
        "name": "t",
        "model": {"path": "no_such_model"},
        "data": {"train_file": "train.jsonl"},
        "rewards": {"functions": [{"function": "exact_match"}]},
        "trainer": {"prompts_per_step": 2},
        "rollout": {"samples_per_prompt": 4},
        "algorithm": {"micro_batch_size": 4},
    }


def test_valid_recipe_resolves_paths_against_its_folder(tmp_path):
    path = write_recipe(tmp_path, base())
    r = Recipe.from_yaml(path)
    assert r.data.train_file == str(tmp_path / "train.jsonl")
    assert r.model.path == str(tmp_path / "no_such_model")
    assert r.base_dir == tmp_path
    check = check_recipe(path)
    assert check.ok, check.errors
    # The missing model folder is a warning for `validate` and an error for `train`.
    assert any("model.path" in w for w in check.warnings)
    assert any("model.path" in e for e in check_recipe(path, for_training=True).errors)


def test_typo_is_named_with_a_suggestion(tmp_path):
    rec = base()
    rec["trainer"]["total_stpes"] = 3
    errors = validate_recipe(write_recipe(tmp_path, rec))
    assert errors == [f"{tmp_path / 'r.yaml'}: trainer.total_stpes: unknown field (did you mean 'total_steps'?)"]


def test_every_problem_is_reported_at_once(tmp_path):
    rec = base()
    rec["trainer"]["total_stpes"] = 3  # typo
    rec["rollout"]["horizon"] = {"type": "fixed", "turnz": 2}  # typo inside a tagged union
    rec["trainer"]["prompts_per_step"] = 3  # 3 x 4 = 12 samples, micro batch 5 does not divide
    rec["algorithm"] = {"micro_batch_size": 5, "kl": {"coef": 0.1}, "learning_rate": -1}
    rec["data"]["val_file"] = "missing.jsonl"
    rec["rewards"]["functions"] = [{"function": "no_such_reward_fn", "weight": 0}]
    errors = validate_recipe(write_recipe(tmp_path, rec))
    text = "\n".join(errors)
    for needle in ["trainer.total_stpes: unknown field (did you mean 'total_steps'?)",
                   "rollout.horizon.fixed.turnz: unknown field (did you mean 'turns'?)",
                   "algorithm.learning_rate", "algorithm.micro_batch_size (5) must divide",
                   "algorithm.kl.coef is 0.1", "data.val_file: file not found", "every weight is 0",
                   "no_such_reward_fn"]:
        assert needle in text, f"{needle!r} not reported in:\n{text}"
    assert all(e.startswith(str(tmp_path / "r.yaml") + ": ") for e in errors)


def test_data_field_mapping_is_checked_against_the_rows(tmp_path):
    rec = base()
    rec["data"]["prompt_field"] = "promt"
    errors = validate_recipe(write_recipe(tmp_path, rec))
    assert any("data.prompt_field: 'promt'" in e and "did you mean 'prompt'" in e for e in errors), errors


def test_every_data_row_is_checked_and_bad_ones_are_named_by_line(tmp_path):
    path = write_recipe(tmp_path, base(), rows=3)
    with (tmp_path / "train.jsonl").open("a") as f:  # lines 4-6 are bad, line 7 is fine again
        f.write('{"question": "no prompt field"}\n{"prompt": "cut off\n[1, 2]\n')
        f.write(json.dumps({"prompt": "fine", "answer": "1"}) + "\n")
    errors = validate_recipe(path)
    bad = [e for e in errors if "data.train_file" in e]
    assert len(bad) == 1, errors
    assert "line 4: no field 'prompt' (data.prompt_field)" in bad[0]
    assert "line 5: not JSON" in bad[0] and "line 6: not an object (got list)" in bad[0]
    assert "line 7" not in bad[0] and "line 1:" not in bad[0]
    many = tmp_path / "many"
    many.mkdir()
    path = write_recipe(many, base(), rows=1)
    with (many / "train.jsonl").open("a") as f:
        f.write("".join(json.dumps({"prompt": ""}) + "\n" for _ in range(9)))
    (msg,) = [e for e in validate_recipe(path) if "data.train_file" in e]
    assert "line 2: field 'prompt' must be a non-empty string" in msg and "(and 4 more rows)" in msg


def test_a_redis_url_that_nothing_answers_is_rejected(tmp_path):
    import socket

    with socket.socket() as s:  # a port with no listener: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        rec = base()
        rec["tools"] = {"cache": {"backend": "redis", "url": f"redis://127.0.0.1:{port}/0"}}
        errors = validate_recipe(write_recipe(tmp_path, rec))
    (msg,) = [e for e in errors if "tools.cache.url" in e]
    assert f"no Redis answers at redis://127.0.0.1:{port}/0" in msg and "'embedded'" in msg


def test_a_redis_url_that_answers_passes(tmp_path, redis_server):
    rec = base()
    rec["tools"] = {"cache": {"backend": "redis", "url": redis_server.url}}
    assert not [e for e in validate_recipe(write_recipe(tmp_path, rec)) if "tools.cache" in e]


def test_budgets_larger_than_the_context_are_rejected(tmp_path):
    rec = base()
    rec["rollout"].update({"max_response_tokens": 4096, "max_context_tokens": 2048})
    errors = validate_recipe(write_recipe(tmp_path, rec))
    assert any("rollout.max_response_tokens (4096) must be smaller than rollout.max_context_tokens" in e
               for e in errors), errors


def test_overrides_parse_values_and_reach_list_items(tmp_path):
    path = write_recipe(tmp_path, base())
    r = Recipe.from_yaml(path, ["trainer.total_steps=7", "rollout.sampling.temperature=0.5",
                                "rewards.functions.0.weight=2", "tools.mcp_configs=[a.json, b.json]",
                                "trainer.log.tensorboard=false"])
    assert r.trainer.total_steps == 7 and r.rollout.sampling.temperature == 0.5
    assert r.rewards.functions[0].weight == 2.0
    assert r.tools.mcp_configs == [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert r.trainer.log.tensorboard is False
    with pytest.raises(ConfigError, match="trainer.total_stepz: unknown field"):
        Recipe.from_yaml(path, ["trainer.total_stepz=7"])
    with pytest.raises(ConfigError, match="not of the form"):
        apply_overrides({}, ["trainer.total_steps"])
    with pytest.raises(ConfigError, match="has no item 3"):
        apply_overrides({"a": [1]}, ["a.3=2"])


def test_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  path: [unclosed\n")
    errors = validate_recipe(path)
    assert len(errors) == 1 and "not valid YAML" in errors[0] and "line" in errors[0]


def test_validate_cli_fails_cleanly(tmp_path):
    rec = base()
    rec["trainer_typo_zz"] = rec.pop("trainer")
    path = write_recipe(tmp_path, rec)
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "trainer_typo_zz: unknown field (did you mean 'trainer'?)" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    ok = subprocess.run([sys.executable, "-m", "rlfactory.cli", "validate", str(write_recipe(tmp_path, base()))],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout and "warning" in ok.stderr  # the missing model folder


def test_train_cli_starts_nothing_for_a_bad_recipe(tmp_path):
    rec = base()
    rec["trainer"]["output_dir"] = str(tmp_path / "run")
    rec["algorithm"]["micro_batch_size"] = 3
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "train", str(write_recipe(tmp_path, rec))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "nothing was started" in proc.stderr
    assert "micro_batch_size" in proc.stderr and "model.path" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["qwen3_4b_deepsearch.yaml", "qwen3_1_7b_calculator.yaml"])
def test_gpu_recipes_validate_except_for_the_user_provided_model(name):
    path = REPO / "recipes" / name
    if not path.exists():
        pytest.skip(f"{path} not written yet")
    check = check_recipe(path)
    assert check.ok, check.errors
    assert all("model.path" in w for w in check.warnings)
    assert check.recipe.engine == "verl"


def test_a_micro_batch_larger_than_the_mini_batch_is_allowed(tmp_path):
    rec = base()
    rec["algorithm"]["micro_batch_size"] = 64  # 2 prompts x 4 samples = 8 trajectories: one micro-batch
    assert validate_recipe(write_recipe(tmp_path, rec)) == []


def test_asynchronous_settings_are_checked(tmp_path):
    rec = base()
    rec["trainer"].update({"max_staleness_steps": 1, "stale_groups": "skip"})
    rec["algorithm"]["off_policy"] = {"is_cap": 0.5, "mask_outside": [1.5, 3.0]}
    text = "\n".join(validate_recipe(write_recipe(tmp_path, rec)))
    for needle in ["trainer.stale_groups", "'drop' or 'wait'", "algorithm.off_policy.is_cap",
                   "mask_outside must be [lo, hi] with 0 < lo < 1 < hi, got [1.5, 3.0]"]:
        assert needle in text, f"{needle!r} not reported in:\n{text}"
    rec = base()
    rec["trainer"].update({"max_staleness_steps": 2, "stale_groups": "wait"})
    rec["algorithm"]["off_policy"] = {"is_cap": None, "mask_outside": [0.5, 2.0]}
    assert [e for e in validate_recipe(write_recipe(tmp_path, rec)) if "no_such_model" not in e] == []


def test_a_model_folder_that_is_not_one_is_named_with_what_it_lacks(tmp_path):
    """model.path: a folder without config.json, a config.json that is not JSON, and a context longer than the
    model's positions are each an error that names the file, before any work starts."""
    recipe = base()
    recipe["model"]["path"] = str(tmp_path / "m")
    (tmp_path / "m").mkdir()
    path = write_recipe(tmp_path, recipe)
    assert any("has no config.json (is it a Hugging Face model folder?)" in e for e in validate_recipe(path))
    (tmp_path / "m" / "config.json").write_text("{not json")
    assert any(f"{tmp_path / 'm' / 'config.json'} is not valid JSON" in e for e in validate_recipe(path))
    (tmp_path / "m" / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    errors = validate_recipe(path, ["rollout.max_context_tokens=128"])
    assert any("rollout.max_context_tokens (128) is larger than the model's max_position_embeddings (64)" in e
               for e in errors), errors
