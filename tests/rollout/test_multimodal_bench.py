"""bench/multimodal.py in its smallest mode (2 prompts x 2 samples, one round, the scripted tiny-random-vl): the
image and text rollouts run through the real HF engine and MCP servers, the update runs on both, and every figure
the benchmark reports is a positive number (ratios, not asserted values: the bench's figures are for bench/README)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "multimodal.py"
POSITIVE = ("image_generation_tokens_per_s", "text_generation_tokens_per_s", "generation_tokens_per_s_ratio",
            "image_rollout_tokens_per_s", "text_rollout_tokens_per_s", "rollout_tokens_per_s_ratio",
            "image_update_s", "text_update_s", "update_s_ratio", "text_update_whole_rows_s",
            "update_s_ratio_whole_rows", "image_step_s", "text_step_s", "step_s_ratio", "image_path_s",
            "image_path_share_of_step", "images_per_step", "image_tokens_per_step")


@pytest.mark.slow
def test_the_smallest_run_reports_every_figure(tmp_path):
    spec = importlib.util.spec_from_file_location("multimodal_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    figures = bench.run(tmp_path / "no-such-model", quick=True)  # a missing folder: the scripted stand-in
    assert figures["model"] == "tiny-random-vl (scripted)" and figures["rounds"] == 1
    for key in POSITIVE:
        value = figures[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value)
    parts = figures["image_path_s_by_part"]
    for part in ("rollout_tool_decode_s", "rollout_pixel_processing_s", "rollout_vision_tower_forward_s",
                 "update_vision_tower_forward_s", "update_vision_tower_backward_s"):
        assert parts[part] > 0, (part, parts)
    assert figures["twins_policy_tokens_equal"]  # the text twins hold the image trajectories' policy tokens
    assert figures["image"]["tool_errors"] == figures["text"]["tool_errors"] == 0
