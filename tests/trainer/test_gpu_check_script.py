"""`make gpu-check` (bench/gpu_check.py) works before a GPU is at hand: its local half runs here on CPU and reports
real figures under the names the local engine logs, and its verl half's command line is accepted by
`rlfactory train` (checked with `--dry-run`, which composes and validates verl's config without a GPU)."""
from __future__ import annotations

import importlib.util
import math
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_local_half_runs_two_grpo_steps_and_reports_numbers(tmp_path):
    result = _gpu_check().local_check(tmp_path, device="cpu")
    assert result["ok"] and result["steps"] == 2
    for key in ("step_s", "reward_mean", "tokens_per_s"):
        values = result[key]
        assert len(values) == 2 and all(isinstance(v, float) and math.isfinite(v) for v in values), (key, values)
    assert all(v > 0 for v in result["step_s"] + result["tokens_per_s"])
    assert result["peak_gpu_mem_gb"] == 0.0


def test_verl_half_command_passes_verls_config_checks(tmp_path):
    cmd = _gpu_check().verl_command(tmp_path) + ["--dry-run"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    run = tmp_path / "verl" / "run"
    config = next(run.rglob("*.yaml"), None)
    assert config is not None, sorted(p.name for p in run.rglob("*"))
    text = config.read_text()
    # the overrides the check passes reached verl's config
    assert "gpu_memory_utilization: 0.3" in text and "total_training_steps: 2" in text


def test_asynchronous_half_runs_sync_and_async_and_reports_the_push(tmp_path):
    result = _gpu_check().async_check(tmp_path, device="cpu", engines=("hf",), steps=3)
    assert result["ok"], {k: v.get("log_tail") for k, v in result["runs"].items()}
    sync, asy = result["runs"]["sync"], result["runs"]["async_hf"]
    assert sync["steps"] == asy["steps"] == 3
    assert asy["weight_loads"] >= 1 and asy["staleness_token_max"] <= 1 and asy["weight_push_s_median"] > 0
    assert math.isfinite(asy["step_ratio_to_sync"]) and asy["step_ratio_to_sync"] > 0
