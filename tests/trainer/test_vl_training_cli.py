"""`rlfactory train` and `rlfactory rollout` with `model.path: tiny-random-vl`, as a user runs them: task rows with a
picture, the real digits_image MCP server, two GRPO steps on the local HF engine (pixels in the rollout and in the
update), synchronous and asynchronous (a generator process), the saved trajectories holding the image content the
policy saw."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from cli_runs import SPREAD_REWARD, rlf

from rlfactory.envs.tools.digits_image import render_png
from rlfactory.rollout.trajectory import Trajectory


def _setup(tmp: Path) -> Path:
    pics = []
    for k, text in enumerate(["42", "1999", "7", "12345"]):
        pic = tmp / f"q{k}.png"
        pic.write_bytes(render_png(text))
        pics.append((pic, text))
    (tmp / "train.jsonl").write_text("".join(
        json.dumps({"id": f"q{k}", "prompt": "What number is in the picture?", "answer": text, "images": [pic.name]})
        + "\n" for k, (pic, text) in enumerate(pics)))
    (tmp / "mcp.json").write_text(json.dumps({"mcpServers": {
        "digits": {"command": "python", "args": ["-m", "rlfactory.envs.tools.digits_image"]}}}))
    (tmp / "spread.py").write_text(SPREAD_REWARD)
    recipe = {
        "name": "vl-smoke", "model": {"path": "tiny-random-vl", "dtype": "float32"},
        "data": {"train_file": "train.jsonl"},
        "tools": {"mcp_configs": ["mcp.json"], "cache": {"backend": "none"}},
        "rollout": {"samples_per_prompt": 2, "horizon": {"type": "fixed", "turns": 2},
                    "sampling": {"temperature": 1.0, "max_new_tokens_per_turn": 12}, "max_response_tokens": 96,
                    "tool_response_max_tokens": 32,
                    "max_context_tokens": 1024, "prefix_cache": True},
        "rewards": {"functions": [{"function": "exact_match", "weight": 0.0},
                                  {"function": f"{tmp / 'spread.py'}:id_spread", "weight": 1.0}]},
        "algorithm": {"learning_rate": 1e-3, "micro_batch_size": 4, "kl": {"use_reference": False, "coef": 0.0}},
        "trainer": {"total_steps": 2, "prompts_per_step": 2, "eval_every_steps": 0, "save_every_steps": 0,
                    "output_dir": str(tmp / "run"), "torch_threads": 1, "log": {"tensorboard": False}},
    }
    path = tmp / "vl.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.mark.parametrize("staleness", [0, 1], ids=["synchronous", "asynchronous"])
def test_tiny_random_vl_trains_and_rolls_out_with_pictures(tmp_path, staleness):
    recipe = _setup(tmp_path)
    proc = rlf("train", str(recipe), "--set", f"trainer.max_staleness_steps={staleness}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert len(rows) == 2 and all(r["loss/grad_norm"] > 0 for r in rows)
    assert all(r["rollout/images_mean"] == 1 for r in rows)  # every trajectory saw its task's picture
    if staleness:  # the generator process ran the rollouts, the trainer's update took their pixels
        assert max(r["async/staleness_token_max"] for r in rows) <= 1
    out, html = tmp_path / "trajs.jsonl", tmp_path / "trajs.html"
    proc = rlf("rollout", str(recipe), "--limit", "2", "--out", str(out), "--html", str(html))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajs = [Trajectory.model_validate_json(ln) for ln in out.read_text().splitlines() if ln.strip()]
    assert len(trajs) == 4
    for t in trajs:
        assert t.finish_reason != "error", t.error
        assert len(t.images) == 1 and t.images[0].turn is None  # the task's picture, in the first user turn
        picture = render_png(t.task["answer"])
        assert base64.b64decode(t.images[0].data_b64) == picture
        first = t.messages[0 if t.messages[0]["role"] == "user" else 1]
        assert {"type": "image", "image": t.images[0].sha256} in first["content"]
        # the viewer shows the picture inline, at the prompt (report/transcript_images.py)
        assert f'src="data:image/png;base64,{t.images[0].data_b64}"' in html.read_text()
