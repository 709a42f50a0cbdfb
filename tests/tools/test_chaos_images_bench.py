"""bench/chaos_images.py at its smallest: every hostile image case once (3 trajectories x 4 tool turns, one round)
through the real image_toolbox MCP server, to the scripted tiny Qwen3-VL and the scripted text-only Qwen3 on the HF
engine. No rollout crashes, every trajectory plays all its turns, and every bad image (and every image a text-only
policy cannot see) is named in the tool turn the policy reads."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos_images.py"


@pytest.fixture(scope="module")
def chaos_images():
    spec = importlib.util.spec_from_file_location("chaos_images_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vl", "text"])
def test_every_bad_image_becomes_feedback_and_no_rollout_crashes(chaos_images, tmp_path, kind):
    config = tmp_path / "images.json"
    config.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [str(chaos_images.TOOLBOX)],
        "rlfactory": {"cache": False, "max_image_bytes": 2**20, "max_images_per_result": 8}}}}))
    out = asyncio.run(chaos_images.play(kind, config, trajectories=3, turns=4, rounds=1, seed=0))
    assert sorted(out["by_case"]) == sorted(chaos_images.CASES)  # 12 calls: each case once
    assert out["rollout_crashes"] == 0 and out["trajectories_finished"] == 3, out["errors"]
    assert out["feedback_missing"] == 0, {c: r.get("missing_example") for c, r in out["by_case"].items()}
    assert out["errors_by_kind"] == {"bad_image": 8}  # the tool-side refusals and the mixed result
    if kind == "vl":
        assert out["images_shown"] == 1 + 1 + 8 + 1  # good, huge_pixels, several, mixed's good one
    else:
        assert out["images_shown"] == 0 and "this policy is text-only" in out["text_engine_refusal"]
