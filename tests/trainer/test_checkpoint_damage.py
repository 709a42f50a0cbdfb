"""Damage around checkpoints that used to end in raw tracebacks (`trainer/checkpoint.py`):
- random bytes in `checkpoints/latest`, or in a checkpoint's `trainer_state.json`: `--resume` takes the newest whole
  checkpoint and says which one it skipped and why;
- a full disk at save time, on a real small tmpfs: one paragraph naming the folder, the file system, the free space
  and the size needed; the partial folder is removed; a crash's leftover `.tmp-step_*` is removed by `--resume`,
  which then continues in place.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlfactory.errors import RLFactoryError
from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.trainer.checkpoint import (
    MANIFEST_FILE,
    STATE_FILE,
    checkpoint_problem,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

PAGE = 4096


def _model_and_optimizer():
    model = build_tiny_qwen3(400, seed=0, hidden_size=32, num_layers=1, heads=2, kv_heads=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()  # the optimizer state a real checkpoint carries
    return model, opt


def _save(out: Path, step: int, model, opt, keep: int = 3) -> Path:
    return save_checkpoint(out, step, model=model, optimizer=opt, scheduler=None, state={"data": {}}, keep=keep)


@pytest.fixture
def saved(tmp_path):
    model, opt = _model_and_optimizer()
    for step in (1, 2, 3):
        _save(tmp_path, step, model, opt)
    return tmp_path, model, opt


def test_random_bytes_in_latest_fall_back_to_the_newest_whole_checkpoint(saved, caplog):
    out, _, _ = saved
    latest = out / "checkpoints" / "latest"
    for junk in (os.urandom(64) + b"\xff", b"../../../etc", b"step_000009"):
        latest.write_bytes(junk)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert latest_checkpoint(out).name == "step_000003"
        assert "checkpoints/latest" in caplog.text and "was ignored" in caplog.text


def test_random_bytes_in_trainer_state_skip_that_checkpoint(saved, caplog):
    out, model, opt = saved
    ckpt = out / "checkpoints" / "step_000003"
    for p in (out / "checkpoints").glob("step_*"):
        (p / MANIFEST_FILE).unlink()  # as written before manifests: the state file alone is judged
    (ckpt / STATE_FILE).write_bytes(os.urandom(300))
    with caplog.at_level(logging.WARNING):
        found = latest_checkpoint(out)
    assert found.name == "step_000002"
    assert f"step_000003 is damaged ({STATE_FILE} is unreadable" in caplog.text
    assert load_checkpoint(found, model=model, optimizer=opt, scheduler=None)["step"] == 2
    with pytest.raises(RLFactoryError, match=f"step_000003: {STATE_FILE} is unreadable"):
        load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=None)
    (ckpt / STATE_FILE).write_text("[1, 2]")  # valid JSON, not a state
    assert "is not a trainer state" in checkpoint_problem(ckpt)


# ------------------------------------------------------------------------------------------- a full disk
def _tree_pages(root: Path) -> int:
    """Bytes a folder takes on tmpfs (whole pages per file)."""
    return sum(math.ceil(p.stat().st_size / PAGE) * PAGE for p in root.rglob("*") if p.is_file())


@contextlib.contextmanager
def small_disk(where: Path, size_bytes: int):
    """A real tmpfs of `size_bytes` mounted at `where` (root only); unmounted at the end."""
    where.mkdir(parents=True)
    kb = math.ceil(size_bytes / 1024)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", str(where)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({proc.stderr.strip()}): needs root with CAP_SYS_ADMIN")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def resize(where: Path, size_bytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={math.ceil(size_bytes / 1024)}k", str(where)], check=True)


def test_a_full_disk_at_save_removes_the_partial_folder_and_names_the_disk(tmp_path):
    model, opt = _model_and_optimizer()
    one = _tree_pages(_save(tmp_path / "probe", 1, model, opt))
    with small_disk(tmp_path / "disk", int(1.6 * one)) as disk:
        _save(disk, 1, model, opt)
        with pytest.raises(RLFactoryError) as e:
            _save(disk, 2, model, opt)
        msg = str(e.value)
        assert "checkpoint step_000002 could not be saved" in msg and f"{disk / 'checkpoints'}" in msg
        assert f"the disk is full. The file system mounted at {disk} has" in msg and "needs about" in msg
        assert "the newest is step_000001" in msg and "--resume" in msg and "\n" not in msg
        assert not list((disk / "checkpoints").glob(".*")), "the partial save is still there"
        assert latest_checkpoint(disk).name == "step_000001"
        resize(disk, 4 * one)  # room again: the run saves where it stopped
        _save(disk, 2, model, opt)
        assert latest_checkpoint(disk).name == "step_000002"


def test_cli_full_disk_is_one_clear_error_and_resume_clears_a_crashed_save(tiny_setup_master, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_setup_master / "model")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    probe = save_checkpoint(tmp_path / "probe", 1, model=model, optimizer=opt, scheduler=None, state={},
                            tokenizer=AutoTokenizer.from_pretrained(tiny_setup_master / "model"))
    one = _tree_pages(probe)  # what each of the run's checkpoints takes
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def train(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rlfactory.cli", "train", str(tiny_setup_master / "recipe.yaml"),
                               "--output-dir", str(run), *args], capture_output=True, text=True, timeout=240, env=env,
                              check=False)

    # room for two checkpoints (keep_checkpoints: 2) and the run's other files, not for a third while it is written
    with small_disk(tmp_path / "disk", int(2.5 * one) + 160 * 1024) as disk:
        run = disk / "run"
        proc = train("--set", "trainer.total_steps=4")
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        err = proc.stderr[proc.stderr.index("error:"):]
        assert f"could not be saved in {run / 'checkpoints'}: the disk is full" in err
        assert f"mounted at {disk}" in err and "needs about" in err and "--resume" in err
        assert not list((run / "checkpoints").glob(".tmp-*"))
        whole = sorted(p.name for p in (run / "checkpoints").glob("step_*") if checkpoint_problem(p) is None)
        assert whole == ["step_000001", "step_000002"]
        # a save that a crash (not a clean error) left behind fills what is free again
        used = _tree_pages(disk)
        resize(disk, used + int(1.5 * one) + 160 * 1024)
        stale = run / "checkpoints" / ".tmp-step_000003-4242"
        stale.mkdir()
        (stale / "optimizer.pt").write_bytes(os.urandom(one))
        resumed = train("--resume", "--set", "trainer.total_steps=3")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "removed what unfinished checkpoint saves left" in resumed.stderr and stale.name in resumed.stderr
        assert not stale.exists() and (run / "checkpoints" / "latest").read_text() == "step_000003"
