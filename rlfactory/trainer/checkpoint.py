"""Checkpoints of the local engine: weights (full model or LoRA adapter), optimizer and scheduler, RNG states
(python, numpy, torch), step, horizon stage, data position and the metrics so far.

Atomic: everything is written into `checkpoints/.tmp-step_N-<pid>/`, flushed, then renamed to `step_N/`, and only
then is `checkpoints/latest` switched (also by rename). A run killed with SIGKILL at any moment leaves either the
previous checkpoint or the new one, never a half-written one. `--resume` loads `latest`, truncates metrics.jsonl to
the checkpoint's step and continues; with the same seed the following steps repeat what an unbroken run would do.

A full-model checkpoint's `model/` folder is a Hugging Face model folder (config, safetensors, tokenizer), so
`rlfactory eval --checkpoint <run>/checkpoints/step_N` works on it directly. Left out: sharded/distributed
checkpoints (the verl engine uses verl's own).
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from rlfactory.errors import RLFactoryError

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(
    output_dir: str | Path, step: int, *, model: Any, optimizer: Any, scheduler: Any | None,
    state: dict[str, Any], tokenizer: Any | None = None, keep: int = 2,
) -> Path:
    """Write checkpoint `step_<step>` atomically and point `latest` at it; keep the newest `keep` checkpoints.

    `state` is JSON-able trainer state (step, horizon stage, data position, metrics so far)."""
    root = checkpoints_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    if is_peft(model):
        model.save_pretrained(tmp / "adapter")
    else:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
    torch.save({"optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None}, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1))
    _fsync_tree(tmp)
    if final.exists():  # a re-save of the same step (e.g. the final save after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".latest-{os.getpid()}"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, root / "latest")
    _prune(root, keep)
    logger.info("saved checkpoint %s", final)
    return final


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):  # left by a killed run
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint `latest` points at (or the newest complete one when the pointer is missing)."""
    root = checkpoints_dir(output_dir)
    pointer = root / "latest"
    if pointer.is_file():
        cand = root / pointer.read_text().strip()
        if (cand / STATE_FILE).is_file():
            return cand
    done = sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())
    return done[-1] if done else None


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def load_checkpoint(path: str | Path, *, model: Any, optimizer: Any, scheduler: Any | None) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG states in place; return the trainer state."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise RLFactoryError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    if is_peft(model):
        from peft import set_peft_model_state_dict  # only for LoRA checkpoints: importing peft costs seconds

        set_peft_model_state_dict(model, load_file(str(path / "adapter" / "adapter_model.safetensors")))
    else:
        sd: dict[str, torch.Tensor] = {}
        for f in sorted((path / "model").glob("*.safetensors")):
            sd.update(load_file(str(f)))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or []) | {"lm_head.weight"}
        bad = [k for k in missing if k not in tied]
        if bad or unexpected:
            raise RLFactoryError(f"{path}: checkpoint does not match the model (missing {bad[:5]}, unexpected "
                                 f"{list(unexpected)[:5]}); resume with the same model.path")
    opt = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(opt["optimizer"])
    if scheduler is not None and opt.get("scheduler") is not None:
        scheduler.load_state_dict(opt["scheduler"])
    set_rng_state(torch.load(path / "rng.pt", map_location="cpu", weights_only=False))
    state = json.loads((path / STATE_FILE).read_text())
    logger.info("resumed from %s (step %s)", path, state.get("step"))
    return state


def model_dir_of(checkpoint: str | Path) -> Path:
    """The HF model folder inside a checkpoint (or the folder itself when it already is one)."""
    p = Path(checkpoint)
    if (p / "config.json").is_file():
        return p
    if (p / "model" / "config.json").is_file():
        return p / "model"
    if (p / "adapter").is_dir():
        return p / "adapter"
    raise RLFactoryError(f"{p}: neither a checkpoint folder (model/ or adapter/ inside) nor a Hugging Face model "
                         f"folder (config.json)")
