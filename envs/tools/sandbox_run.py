"""Running one python-sandbox snippet: its limits (`Limits`), what the machine allows around it (`Isolation`, probed
by `sandbox_probe.py`), the child's folder, command and environment (`prepare`), and the run itself (`run_snippet`):
a wall-clock deadline over the whole process group, output read with a cap, and the reply the model reads (exit
code, a note on why it stopped, stdout and stderr)."""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

try:
    from .sandbox_boot import BOOT
    from .sandbox_view import ENTER, FsView
except ImportError:  # run as a file (`python envs/tools/python_sandbox.py`): its folder is sys.path[0]
    from sandbox_boot import BOOT
    from sandbox_view import ENTER, FsView

_uid_pool = itertools.cycle(range(0, 30_000))


@dataclass
class Limits:
    memory_mb: int = 512
    max_timeout_s: float = 30.0
    max_output_chars: int = 8_000
    file_size_mb: int = 16
    nproc: int = 64


@dataclass
class Isolation:
    """What this machine allows beyond rlimits and the audit hook; probed once at start-up."""

    namespace_prefix: list[str]
    uid_base: int | None
    view: FsView | None = None
    no_view_reason: str = ""
    readable: list[str] | None = None  # without a view: the audit hook refuses reads outside these (and scratch)

    def describe(self) -> str:
        parts = ["audit hook", "rlimits"]
        if self.namespace_prefix:
            parts.append("network+PID namespaces")
        if self.view is not None:
            parts.append(self.view.describe())
        else:
            parts.append("no filesystem view" + (f" ({self.no_view_reason})" if self.no_view_reason else ""))
            if self.readable is not None:
                parts.append("reads limited to the interpreter's files (audit hook)")
        if self.uid_base is not None:
            parts.append("per-snippet uid")
        return ", ".join(parts)


def _format(exit_code: int | None, stdout: str, stderr: str, note: str) -> str:
    parts = [f"exit code: {exit_code}" if exit_code is not None else "exit code: none (killed)"]
    if note:
        parts.append(note)
    parts.append("--- stdout ---\n" + stdout if stdout else "--- stdout --- (empty)")
    if stderr:
        parts.append("--- stderr ---\n" + stderr)
    return "\n".join(parts)


async def _read_capped(stream: asyncio.StreamReader, cap: int, over: asyncio.Event) -> tuple[bytes, int]:
    """Keep the first `cap` bytes; count the rest; flag `over` once far past the cap (the caller then kills)."""
    kept = bytearray()
    total = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(kept), total
        total += len(chunk)
        if len(kept) < cap:
            kept.extend(chunk[: cap - len(kept)])
        if total > 16 * cap + 1_000_000:
            over.set()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def prepare(code: str, timeout_s: float, limits: Limits, iso: Isolation) -> tuple[str, str, list[str], dict]:
    """A fresh folder (its `work/` is the scratch, its `root/` the mount point of the view), the command, the env."""
    base = os.path.realpath(tempfile.mkdtemp(prefix="rlf-python-"))
    scratch, root = os.path.join(base, "work"), os.path.join(base, "root")
    os.mkdir(scratch, 0o700)
    os.mkdir(root, 0o700)
    Path(scratch, "main.py").write_text(code, encoding="utf-8")
    uid = None
    if iso.uid_base is not None:
        uid = iso.uid_base + next(_uid_pool)
        os.chmod(base, 0o711)  # without a view the snippet's uid reaches its scratch through the host's path
        os.chown(scratch, uid, uid)
    cfg = {"view": iso.view.spec(root) if iso.view else None, "uid": uid,
           "readable": None if iso.view else iso.readable, "rlimits": {
        "RLIMIT_AS": limits.memory_mb * 2**20,
        "RLIMIT_CPU": int(timeout_s) + 1,
        "RLIMIT_FSIZE": limits.file_size_mb * 2**20,
        "RLIMIT_CORE": 0,
    }}
    if uid is not None:
        # Counted per uid: meaningful only for a uid of the snippet's own (root is exempt; a shared user
        # account may already run more processes than any sane limit).
        cfg["rlimits"]["RLIMIT_NPROC"] = limits.nproc
    cmd = [*iso.namespace_prefix, sys.executable, "-I", "-c", ENTER + BOOT, scratch, json.dumps(cfg)]
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONIOENCODING": "utf-8"}
    return base, scratch, cmd, env


async def run_snippet(code: str, timeout_s: float, limits: Limits, iso: Isolation) -> str:
    timeout_s = float(timeout_s) if math.isfinite(float(timeout_s)) else 5.0
    timeout_s = min(max(timeout_s, 0.1), limits.max_timeout_s)
    base, scratch, cmd, env = prepare(code, timeout_s, limits, iso)
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=scratch, env=env, start_new_session=True,
        )
        cap = limits.max_output_chars * 4  # bytes; decoded and cut to characters below
        over = asyncio.Event()
        readers = asyncio.gather(_read_capped(proc.stdout, cap, over), _read_capped(proc.stderr, cap, over))
        waiter = asyncio.ensure_future(over.wait())
        note = ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            done, _ = await asyncio.wait({readers, waiter}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if readers not in done:
                note = ("stopped: the output exceeded the limit" if over.is_set()
                        else f"timed out after {timeout_s:g} s (killed)")
                _kill_group(proc)
            else:
                # Output closed; the process may still run (it can close its own stdout): same deadline.
                try:
                    await asyncio.wait_for(proc.wait(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    note = f"timed out after {timeout_s:g} s (killed)"
                    _kill_group(proc)
            (out_b, out_n), (err_b, err_n) = await readers
            exit_code = await proc.wait()
        finally:
            waiter.cancel()
            if proc.returncode is None:
                _kill_group(proc)
                await proc.wait()
        if note:
            exit_code = None
        elif exit_code < 0:
            sig = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else str(-exit_code)
            note = {"SIGXCPU": "stopped: CPU time limit reached", "SIGKILL": "killed"}.get(sig, f"killed by {sig}")
        stdout = _cut(out_b, out_n, limits.max_output_chars)
        stderr = _cut(err_b, err_n, limits.max_output_chars)
        return _format(exit_code, stdout, stderr, note)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _cut(kept: bytes, total: int, max_chars: int) -> str:
    text = kept.decode("utf-8", errors="replace")
    if len(text) > max_chars or total > len(kept):
        text = text[:max_chars] + f"\n[... output truncated: {total:,} bytes in all]"
    return text
