"""Checkpoints carry a manifest (sizes, SHA-256): `--resume` skips a damaged one, naming the file, and resumes from
the newest whole one; a file that cannot be read is an error that names it, not a torch traceback."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from rlfactory.errors import RLFactoryError
from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.trainer.checkpoint import (
    MANIFEST_FILE,
    checkpoint_problem,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


@pytest.fixture
def run(tmp_path, qwen_tokenizer):
    model = build_tiny_qwen3(len(qwen_tokenizer), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model=model, optimizer=opt, scheduler=None, state={"data": {}}, keep=3)
    return tmp_path, model, opt


def test_a_whole_checkpoint_passes(run):
    out, _, _ = run
    ckpt = latest_checkpoint(out)
    assert ckpt.name == "step_000002" and checkpoint_problem(ckpt) is None
    files = json.loads((ckpt / MANIFEST_FILE).read_text())["files"]
    assert "optimizer.pt" in files and files["optimizer.pt"]["sha256"]


def test_a_truncated_latest_checkpoint_falls_back_to_the_one_before(run, caplog):
    out, model, opt = run
    weights = out / "checkpoints" / "step_000002" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert "model/model.safetensors is 1,000 bytes" in checkpoint_problem(weights.parent.parent)
    with caplog.at_level(logging.WARNING):
        ckpt = latest_checkpoint(out)
    assert ckpt.name == "step_000001"
    assert "step_000002 is damaged (model/model.safetensors is 1,000 bytes" in caplog.text
    assert load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=None)["step"] == 1


def test_a_changed_byte_is_found_and_no_whole_checkpoint_is_an_error(run):
    out, _, _ = run
    for step in (1, 2):
        rng = out / "checkpoints" / f"step_00000{step}" / "rng.pt"
        data = bytearray(rng.read_bytes())
        data[len(data) // 2] ^= 0xFF
        rng.write_bytes(bytes(data))
    assert "rng.pt changed since it was saved" in checkpoint_problem(out / "checkpoints" / "step_000002")
    with pytest.raises(RLFactoryError, match="no whole checkpoint.*step_000002 is damaged.*step_000001 is damaged"
                                             ".*without --resume"):
        latest_checkpoint(out)


def test_a_damaged_file_without_a_manifest_is_named(run):
    out, model, opt = run
    ckpt = out / "checkpoints" / "step_000002"
    (ckpt / MANIFEST_FILE).unlink()  # as written before manifests existed: judged by its state file alone
    assert checkpoint_problem(ckpt) is None
    (ckpt / "optimizer.pt").write_bytes(b"not a torch file")
    with pytest.raises(RLFactoryError, match=r"optimizer\.pt: cannot be read .*delete .*step_000002"):
        load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=None)
