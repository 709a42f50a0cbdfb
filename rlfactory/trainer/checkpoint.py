"""Checkpoints of the local engine: weights (full model or LoRA adapter), optimizer and scheduler, RNG states
(python, numpy, torch), step, horizon stage, data position and the metrics so far.

Atomic: everything is written into `checkpoints/.tmp-step_N-<pid>/`, flushed, then renamed to `step_N/`, and only
then is `checkpoints/latest` switched (also by rename). A run killed with SIGKILL at any moment leaves either the
previous checkpoint or the new one, never a half-written one. `--resume` loads `latest`, truncates metrics.jsonl to
the checkpoint's step and continues; with the same seed the following steps repeat what an unbroken run would do.

Each checkpoint lists its files with their sizes and SHA-256 digests in `manifest.json`, written before the rename.
A checkpoint damaged afterwards (a truncated file, a disk that filled up, a partial copy) is found on `--resume`:
it is skipped with a warning that names the file, and the run resumes from the newest checkpoint that is whole
(`latest_checkpoint`). Files over `HASH_MAX_BYTES` are checked by size only (hashing gigabytes costs seconds).

`checkpoints/latest` that is unreadable (random bytes, a name that is not a step folder) is ignored with a warning:
the newest whole step folder is used. A save that fails (a full disk or quota, any other OSError) removes its partial
temporary folder and raises RLFactoryError naming the folder, the free space and the size needed, and the fix;
`run_dir.remove_partial_saves` clears the temporary folders a killed run left (`rlfactory.api.train` calls it
under the run folder's lock, so no live save is touched).

A full-model checkpoint's `model/` folder is a Hugging Face model folder (config, safetensors, tokenizer), so
`rlfactory eval --checkpoint <run>/checkpoints/step_N` works on it directly. Left out: sharded/distributed
checkpoints (the verl engine uses verl's own).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from rlfactory.errors import RLFactoryError
from rlfactory.models.vision import save_tokenizer

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
HASH_MAX_BYTES = 256 << 20
"""Files up to this size get a SHA-256 digest in the manifest; larger ones a size."""
STEP_NAME = re.compile(r"step_\d+")
"""What `latest` may name: a step folder beside it, nothing else (no path)."""
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_manifest(root: Path) -> None:
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            size = p.stat().st_size
            files[p.relative_to(root).as_posix()] = {"bytes": size,
                                                     "sha256": _sha256(p) if size <= HASH_MAX_BYTES else None}
    (root / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1))


def checkpoint_problem(path: str | Path) -> str | None:
    """Why checkpoint `path` cannot be resumed from (a missing, truncated or altered file), or None when it is whole.
    A checkpoint written before manifests existed is judged by its state file alone."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        return f"no {STATE_FILE} (an unfinished save)"
    manifest = path / MANIFEST_FILE
    if manifest.is_file():
        try:
            files = json.loads(manifest.read_bytes())["files"]
            if not (isinstance(files, dict) and all(isinstance(w, dict) and isinstance(w.get("bytes"), int)
                                                    for w in files.values())):
                raise ValueError("its files are not a mapping of name to size and digest")
        except (ValueError, KeyError, TypeError) as e:
            return f"{MANIFEST_FILE} is unreadable ({_first_line(e)})"
        for rel, want in files.items():
            p = path / rel
            if not p.is_file():
                return f"{rel} is missing"
            size = p.stat().st_size
            if size != want["bytes"]:
                return f"{rel} is {size:,} bytes, {want['bytes']:,} when saved"
            if want.get("sha256") and _sha256(p) != want["sha256"]:
                return f"{rel} changed since it was saved (SHA-256 differs)"
    try:  # also for a checkpoint written before manifests existed: the state must at least parse
        read_state(path)
    except RLFactoryError as e:
        return str(e).removeprefix(f"{path}: ")
    return None


def read_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's trainer state (`trainer_state.json`); RLFactoryError naming the file when it is not a JSON
    object with an integer step."""
    path = Path(path)
    try:
        state = json.loads((path / STATE_FILE).read_bytes())
    except (OSError, ValueError) as e:
        raise RLFactoryError(f"{path}: {STATE_FILE} is unreadable ({_first_line(e)})") from None
    if not isinstance(state, dict) or type(state.get("step")) is not int:
        raise RLFactoryError(f"{path}: {STATE_FILE} is not a trainer state (a JSON object with an integer step)")
    return state


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:200]


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

    `state` is JSON-able trainer state (step, horizon stage, data position, metrics so far). A save that fails
    leaves no partial folder behind and raises RLFactoryError (see `_save_failed`); the checkpoints before it stay."""
    root = checkpoints_dir(output_dir)
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    latest_tmp = root / f".latest-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        if is_peft(model):
            model.save_pretrained(tmp / "adapter")
        else:
            model.save_pretrained(tmp / "model", safe_serialization=True)
            if tokenizer is not None:
                save_tokenizer(tokenizer, tmp / "model")  # a VL policy's image processor too
        torch.save({"optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None}, tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1))
        _write_manifest(tmp)
        _fsync_tree(tmp)
        if final.exists():  # a re-save of the same step (e.g. the final save after a periodic one)
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp.write_text(name)
        os.replace(latest_tmp, root / "latest")
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            latest_tmp.unlink()
        failure = _save_failed(root, name, e, _needed_bytes(root, model, optimizer), keep)
        if failure is None:
            raise  # not the file system's doing: a bug, with its traceback
        raise failure from None
    _prune(root, keep)
    logger.info("saved checkpoint %s", final)
    return final


def _needed_bytes(root: Path, model: Any, optimizer: Any) -> int:
    """About what one checkpoint takes: the newest saved one's size, else its weights and optimizer tensors."""
    done = sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file()) if root.is_dir() else []
    if done:
        with contextlib.suppress(OSError):
            return sum(p.stat().st_size for p in done[-1].rglob("*") if p.is_file())
    return _estimated_bytes(model, optimizer)


def _estimated_bytes(model: Any, optimizer: Any) -> int:
    """The saved weights (the adapter's, for LoRA) and the optimizer's tensors."""
    tensors = ([p for p in model.parameters() if p.requires_grad] if is_peft(model)
               else list(model.state_dict().values()))
    n = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    for st in optimizer.state.values():
        n += sum(t.numel() * t.element_size() for t in st.values() if isinstance(t, torch.Tensor))
    return n


def _errnos(e: BaseException) -> set[int]:
    """The errno values along an exception's cause/context chain (torch wraps the OSError of its writer)."""
    out: set[int] = set()
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno is not None:
            out.add(cur.errno)
        cur = cur.__cause__ or cur.__context__
    return out


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _mb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _save_failed(root: Path, name: str, e: Exception, needed: int, keep: int) -> RLFactoryError | None:
    """The one-paragraph error for a save that failed on the file system; None when `e` is something else.

    A full disk shows as ENOSPC/EDQUOT, or (torch's writer reports a short write as a RuntimeError with no errno)
    as a failure while less space is free than the checkpoint needs."""
    try:
        free = shutil.disk_usage(root if root.exists() else root.parent).free
    except OSError:
        free = -1
    codes = _errnos(e)
    wording = str(e).lower()
    full = bool(codes & DISK_FULL_ERRNOS) or "no space left" in wording or "quota" in wording \
        or (0 <= free < needed + (1 << 20) and isinstance(e, (OSError, RuntimeError)))
    if not full and not isinstance(e, OSError):
        return None
    done = sorted(p.name for p in root.glob("step_*") if (p / STATE_FILE).is_file()) if root.is_dir() else []
    after = (f"The checkpoints before it stay (the newest is {done[-1]}): continue with the same command and "
             f"--resume." if done else "The run has no checkpoint yet: start it again (with --overwrite).")
    if full:
        quota = " (the disk quota is used up)" if errno.EDQUOT in codes else ""
        return RLFactoryError(
            f"checkpoint {name} could not be saved in {root}: the disk is full{quota}. The file system mounted at "
            f"{_mount_point(root)} has {_mb(max(free, 0))} free and a checkpoint needs about {_mb(needed)} "
            f"(weights and optimizer state), and with trainer.keep_checkpoints={keep} "
            f"the folder holds {keep + 1} while "
            f"one is written. The partial checkpoint was removed. Free space there (or lower trainer.keep_checkpoints, "
            f"or save less often with trainer.save_every_steps). {after}")
    what = f"{e.strerror or e}" + (f": {e.filename}" if getattr(e, "filename", None) else "")
    return RLFactoryError(
        f"checkpoint {name} could not be saved in {root} ({what}). The partial checkpoint was removed. Fix the "
        f"folder (permissions, a read-only or failed disk) or choose another --output-dir. {after}")


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):  # left by a killed run
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest whole checkpoint: the one `latest` points at, else the newest step folder that passes
    `checkpoint_problem`. Damaged ones (and an unreadable `latest`) are skipped with a warning naming what is
    wrong; when checkpoints exist but none is whole, RLFactoryError says so. None when there is no checkpoint."""
    root = checkpoints_dir(output_dir)
    order = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    skipped: list[str] = []
    named, pointer_problem = _latest_pointer(root)
    if pointer_problem:
        skipped.append(f"checkpoints/latest {pointer_problem} and was ignored")
    if named is not None:
        order = [named] + [p for p in order if p != named]
    for cand in order:
        problem = checkpoint_problem(cand)
        if problem is None:
            if skipped:
                logger.warning("resuming from %s: %s", cand.name, "; ".join(skipped))
            return cand
        skipped.append(f"{cand.name} is damaged ({problem}) and was skipped")
    if order:
        raise RLFactoryError(f"{root}: no whole checkpoint to resume from: {'; '.join(skipped)}. Start the run "
                             f"again without --resume (add --overwrite to replace this run folder)")
    if skipped:
        logger.warning("%s: %s; there is no step folder", root, "; ".join(skipped))
    return None


def _latest_pointer(root: Path) -> tuple[Path | None, str | None]:
    """The step folder `checkpoints/latest` names, and what is wrong with the pointer (None when nothing is)."""
    pointer = root / "latest"
    if not pointer.exists():
        return None, None
    try:
        text = pointer.read_bytes()[:256].decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        return None, f"is unreadable ({_first_line(e)})"
    if not STEP_NAME.fullmatch(text):
        return None, f"does not name a step folder ({text[:40]!r})"
    if not (root / text).is_dir():
        return None, f"names {text}, which does not exist"
    return root / text, None


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def load_checkpoint(path: str | Path, *, model: Any, optimizer: Any, scheduler: Any | None) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG states in place; return the trainer state."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise RLFactoryError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    state = read_state(path)
    if is_peft(model):
        from peft import set_peft_model_state_dict  # only for LoRA checkpoints: importing peft costs seconds

        set_peft_model_state_dict(model, _read(path / "adapter" / "adapter_model.safetensors"))
    else:
        sd: dict[str, torch.Tensor] = {}
        for f in sorted((path / "model").glob("*.safetensors")):
            sd.update(_read(f))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or []) | {"lm_head.weight"}
        bad = [k for k in missing if k not in tied]
        if bad or unexpected:
            raise RLFactoryError(f"{path}: checkpoint does not match the model (missing {bad[:5]}, unexpected "
                                 f"{list(unexpected)[:5]}); resume with the same model.path")
    opt = _read(path / "optimizer.pt")
    optimizer.load_state_dict(opt["optimizer"])
    if scheduler is not None and opt.get("scheduler") is not None:
        scheduler.load_state_dict(opt["scheduler"])
    set_rng_state(_read(path / "rng.pt"))
    logger.info("resumed from %s (step %s)", path, state.get("step"))
    return state


def _read(f: Path) -> Any:
    """A checkpoint file's contents; a file that cannot be read is named in the error, with no torch traceback."""
    try:
        if f.suffix == ".safetensors":
            return load_file(str(f))
        return torch.load(f, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - torch and safetensors raise many kinds for a damaged file
        ckpt = f.parent.parent if f.parent.name in ("model", "adapter") else f.parent
        first = str(e).splitlines()[0] if str(e) else ""
        raise RLFactoryError(f"{f}: cannot be read ({type(e).__name__}: {first}); the checkpoint is damaged: "
                             f"delete {ckpt} to resume from the one before it") from None


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
