"""Whether a run folder may be trained into: an existing run is never replaced by accident, and one run at a time.

`rlfactory train` into a folder that already holds a run (its metrics, summary or checkpoints) refuses before any
work starts, unless `--resume` (continue it) or `--overwrite` (replace it: its metrics, transcripts and checkpoints
are deleted) says what to do. Both engines and the Python API (`rlfactory.api.train(..., overwrite=True)`) check.

A run owns its folder while it runs: `lock_run_folder` takes an exclusive `flock` on `<run>/run.lock` and writes
who holds it (pid, host, start time, command) into the file. A second `train` (new, `--resume` or `--overwrite`) into
a held folder is refused before any work, naming the holder; two runs started at the same instant into a folder that
does not exist yet get one owner, because the lock, not the folder's contents, decides. The kernel drops the lock
when its process ends however it ends, so a run killed with SIGKILL can be resumed at once; the file itself stays
(its text then names the last holder). The lock's descriptor is close-on-exec, so subprocesses (the asynchronous
generator, tool servers, Ray) neither hold nor release it. Readers (dashboard, report, eval of a checkpoint) never
take it. Left out: file systems without `flock` (NFS emulates it with POSIX locks on Linux, which works across hosts).
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import shlex
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlfactory.errors import RLFactoryError

logger = logging.getLogger(__name__)

RUN_MARKERS = ("metrics.jsonl", "summary.json", "checkpoints")
"""What a started run leaves in its folder."""

FRESH_RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "tensorboard", "transcripts", "checkpoints", "eval",
                     "trackers.json", "wandb", "mlruns")
"""What the local engine deletes when a new run starts in a folder (a fresh run is a new run in the trackers too)."""

LOCK_FILE = "run.lock"
HOLDER_WAIT_S = 5.0
"""How long a refused run waits for the holder's details (the holder writes them just after it takes the lock)."""


class RunFolderBusy(RLFactoryError):
    """Another live run holds the run folder."""


def run_markers(out: Path) -> list[str]:
    """What of RUN_MARKERS `out` holds (empty: no run there)."""
    return [name for name in RUN_MARKERS if (out / name).exists()] if out.is_dir() else []


def refuse_to_replace(output_dir: str | os.PathLike[str], *, resume: bool, overwrite: bool) -> None:
    """Raise when `output_dir` holds a run and neither `resume` nor `overwrite` is set. Call it with the folder's
    lock held (`lock_run_folder`), or a run that ends meanwhile can still be replaced."""
    out = Path(output_dir)
    if resume or overwrite:
        return
    found = run_markers(out)
    if found:
        raise RLFactoryError(
            f"{out} already holds a run ({', '.join(found)}); nothing was started. Pass --resume to continue it, "
            f"--overwrite to replace it (its metrics, transcripts and checkpoints are deleted), or choose another "
            f"--output-dir")


def refuse_dry_run_over_run(output_dir: str | os.PathLike[str]) -> None:
    """Raise when `output_dir` holds a run: a dry run writes its inputs (recipe, config) there and would leave the
    run's metrics beside a recipe that did not make them. `--resume` may check there (a resume rewrites them)."""
    out = Path(output_dir)
    found = run_markers(out)
    if found:
        raise RLFactoryError(
            f"{out} already holds a run ({', '.join(found)}); --dry-run writes the verl inputs into the run folder "
            f"and would replace that run's recipe and config, so nothing was written. Give the dry run another "
            f"--output-dir, or add --resume to check the config a resume of that run would use")


def clear_run_outputs(output_dir: str | os.PathLike[str]) -> list[str]:
    """Delete what a local run wrote (FRESH_RUN_OUTPUTS) from `output_dir`; the names deleted. Only under the lock."""
    out = Path(output_dir)
    found = [name for name in FRESH_RUN_OUTPUTS if (out / name).exists()]
    for name in found:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return found


def remove_partial_saves(output_dir: str | Path) -> list[str]:
    """Delete the temporary folders and pointer files of saves that never finished (a killed or crashed run), so a
    resumed run has their space; the names removed. Only with the run folder's lock held: a live run's save
    looks the same."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    removed = []
    for p in sorted([*root.glob(".tmp-*"), *root.glob(".latest-*")]):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(p.name)
    if removed:
        logger.warning("removed what unfinished checkpoint saves left in %s: %s", root, ", ".join(removed))
    return removed


# ------------------------------------------------------------------------------------------------ the lock
_held: dict[str, tuple[int, int, int]] = {}
"""Folders this process holds: resolved path -> (descriptor, owning thread, depth)."""
_held_guard = threading.Lock()


def _holder_record() -> dict[str, Any]:
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    command = shlex.join(argv)
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": command if len(command) <= 400 else command[:400] + " ..."}


def _read_holder(path: Path, *, live_only: bool = False) -> dict[str, Any] | None:
    """The record in the lock file; with `live_only`, None for a record of a process on this host that has ended
    (the new holder has taken the lock but not yet written its own)."""
    try:
        rec = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(rec, dict) and isinstance(rec.get("pid"), int)):
        return None
    if live_only and rec.get("host") == socket.gethostname():
        try:
            os.kill(rec["pid"], 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass  # alive, another user's
    return rec


def describe_holder(rec: dict[str, Any] | None) -> str:
    """`pid 123 on host h, started 2026-…, command: …` (or what is known)."""
    if rec is None:
        return "a process that has not written its details yet (it is starting)"
    return (f"pid {rec.get('pid')} on host {rec.get('host', '?')}, started {rec.get('started', '?')}, command: "
            f"{rec.get('command', '?')}")


def current_holder(output_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Who holds `output_dir` now (the lock file's record), or None when no live run holds it. Takes nothing."""
    path = Path(output_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path, live_only=True) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _busy(out: Path, lock_path: Path) -> RunFolderBusy:
    deadline = time.monotonic() + HOLDER_WAIT_S
    rec = _read_holder(lock_path, live_only=True)
    while rec is None and time.monotonic() < deadline:
        time.sleep(0.05)
        rec = _read_holder(lock_path, live_only=True)
    pid = rec.get("pid") if rec else None
    stop = f"stop it (kill {pid}) and continue it with --resume" if pid else "stop it and continue it with --resume"
    return RunFolderBusy(
        f"{out} is in use by another run: {describe_holder(rec)}; nothing was started. Wait for that run to end, "
        f"{stop}, or choose another --output-dir (--overwrite does not replace a run that is still running). The "
        f"lock is {lock_path}; the system releases it when that process ends.")


@contextlib.contextmanager
def lock_run_folder(output_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Own `output_dir` (created if missing) for the duration of the block; raise RunFolderBusy, naming the holder,
    when another run owns it. Re-entrant within one thread (the CLI and `run_verl` may both ask)."""
    out = Path(output_dir).resolve()
    key = str(out)
    me = threading.get_ident()
    with _held_guard:
        if key in _held:
            fd, owner, depth = _held[key]
            if owner != me:
                raise RunFolderBusy(f"{out} is in use by another run in this process (thread {owner}); nothing was "
                                    f"started. Wait for it to end or choose another output_dir")
            _held[key] = (fd, owner, depth + 1)
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield out
        finally:
            with _held_guard:
                fd, owner, depth = _held[key]
                _held[key] = (fd, owner, depth - 1)
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RLFactoryError(f"{out}: cannot create the run folder ({e.strerror or e}); choose another "
                             f"--output-dir") from None
    lock_path = out / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RLFactoryError(f"{lock_path}: cannot open the run folder's lock file ({e.strerror or e}); check the "
                             f"folder's permissions or choose another --output-dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _busy(out, lock_path) from None
    except OSError as e:
        os.close(fd)
        raise RLFactoryError(f"{lock_path}: cannot lock the run folder ({e.strerror or e}); its file system may "
                             f"not support flock: choose a run folder on a local disk") from None
    previous = _read_holder(lock_path)
    if previous is not None:
        logger.info("%s: the last run here (%s) ended without releasing it (killed?); this run takes it",
                    lock_path, describe_holder(previous))
    with contextlib.suppress(OSError):  # the details are for people; the lock works without them
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder_record()) + "\n").encode(), 0)
    with _held_guard:
        _held[key] = (fd, me, 1)
    try:
        yield out
    finally:
        with _held_guard:
            del _held[key]
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a clean end leaves an empty file: a record found later names a run that died
        os.close(fd)  # releases the lock
