"""Running one python-sandbox snippet: its limits (`Limits`), what the machine allows around it (`Isolation`, probed
by `sandbox_probe.py`), the child's folder, command and environment (`prepare`), and the run itself (`run_snippet`):
a wall-clock deadline on the snippet's main process, output read with a cap, every process it started ended with
the call (`sandbox_procs.py`), and the reply the model reads (exit code, a note on why it stopped, stdout and
stderr)."""
from __future__ import annotations

import asyncio
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
    from .sandbox_procs import CallProcesses, spawn
    from .sandbox_view import ENTER, FsView
except ImportError:  # run as a file (`python envs/tools/python_sandbox.py`): its folder is sys.path[0]
    from sandbox_boot import BOOT
    from sandbox_procs import CallProcesses, spawn
    from sandbox_view import ENTER, FsView

# Once the snippet's main process has gone and everything it started is killed, its output pipes close at once;
# this only bounds the wait for a holder that no layer could reach.
_PIPE_GRACE_S = 5.0


@dataclass
class Limits:
    memory_mb: int = 512
    max_timeout_s: float = 30.0
    max_output_chars: int = 8_000
    file_size_mb: int = 16
    nproc: int = 64
    allow_processes: bool = False
    """Snippets may start processes (the audit hook's ban off); they are still confined and end with the call."""


@dataclass
class Isolation:
    """What this machine allows beyond rlimits and the audit hook; probed once at start-up."""

    namespace_prefix: list[str]
    uid_base: int | None
    view: FsView | None = None
    no_view_reason: str = ""
    readable: list[str] | None = None  # without a view: the audit hook refuses reads outside these (and scratch)
    cgroup: str | None = None  # a cgroup v2 the server makes one cgroup per call in (sandbox_cgroup.probe_cgroup)
    no_cgroup_reason: str = ""

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
        return ", ".join(parts) + "; " + self.describe_ending()

    def describe_ending(self) -> str:
        """How a call's processes are ended, however they detach (`sandbox_procs.py`)."""
        if self.cgroup is not None:
            return "processes ended by cgroup.kill"
        ways = []
        if "--pid" in self.namespace_prefix:
            ways.append("PID-namespace init")
        if self.uid_base is not None:
            ways.append("uid kill")
        ways.append("process sweep")
        why = f" (no cgroup: {self.no_cgroup_reason})" if self.no_cgroup_reason else ""
        return "processes ended by " + " + ".join(ways) + why


def _format(exit_code: int | None, stdout: str, stderr: str, note: str) -> str:
    parts = [f"exit code: {exit_code}" if exit_code is not None else "exit code: none (killed)"]
    if note:
        parts.append(note)
    parts.append("--- stdout ---\n" + stdout if stdout else "--- stdout --- (empty)")
    if stderr:
        parts.append("--- stderr ---\n" + stderr)
    return "\n".join(parts)


class _Capped:
    """One output stream: the first `cap` bytes kept, the rest counted; kept readable if reading is abandoned."""

    def __init__(self, cap: int):
        self.cap, self.kept, self.total = cap, bytearray(), 0

    async def read(self, stream: asyncio.StreamReader, over: asyncio.Event) -> None:
        """Read to EOF; flag `over` once far past the cap (the caller then stops the snippet)."""
        while chunk := await stream.read(65536):
            self.total += len(chunk)
            if len(self.kept) < self.cap:
                self.kept.extend(chunk[: self.cap - len(self.kept)])
            if self.total > 16 * self.cap + 1_000_000:
                over.set()


def prepare(code: str, timeout_s: float, limits: Limits, iso: Isolation,
            uid: int | None) -> tuple[str, str, list[str], dict]:
    """A fresh folder (its `work/` is the scratch, its `root/` the mount point of the view), the command, the env;
    `uid` is the snippet's own (claimed by the caller from `iso.uid_base`), or None."""
    base = os.path.realpath(tempfile.mkdtemp(prefix="rlf-python-"))
    scratch, root = os.path.join(base, "work"), os.path.join(base, "root")
    os.mkdir(scratch, 0o700)
    os.mkdir(root, 0o700)
    Path(scratch, "main.py").write_text(code, encoding="utf-8")
    if uid is not None:
        os.chmod(base, 0o711)  # without a view the snippet's uid reaches its scratch through the host's path
        os.chown(scratch, uid, uid)
    cfg = {"view": iso.view.spec(root) if iso.view else None, "uid": uid,
           "readable": None if iso.view else iso.readable, "allow_processes": limits.allow_processes, "rlimits": {
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
    async with CallProcesses(cgroup_parent=iso.cgroup, uid_base=iso.uid_base) as procs:
        base, scratch, cmd, env = prepare(code, timeout_s, limits, iso, procs.uid)
        try:
            cmd, env = procs.wrap(cmd, env)
            proc = await spawn(*cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                               stderr=asyncio.subprocess.PIPE, cwd=scratch, env=env, start_new_session=True)
            procs.started(proc.pid)
            cap = limits.max_output_chars * 4  # bytes; decoded and cut to characters below
            out, err, over = _Capped(cap), _Capped(cap), asyncio.Event()
            readers = asyncio.ensure_future(asyncio.gather(out.read(proc.stdout, over), err.read(proc.stderr, over)))
            exited = asyncio.ensure_future(procs.wait_exit())
            waiter = asyncio.ensure_future(over.wait())
            note = ""
            try:
                # The main process's exit ends the call, not its pipes' EOF: a detached child may hold them.
                done, _ = await asyncio.wait({exited, waiter}, timeout=timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
                if exited not in done:
                    note = ("stopped: the output exceeded the limit" if over.is_set()
                            else f"timed out after {timeout_s:g} s (killed)")
            finally:
                exited.cancel()
                waiter.cancel()
                # Nothing the snippet started outlives the call, however it detached; that also closes the pipes.
                await asyncio.shield(procs.end_all())
            try:
                await asyncio.wait_for(asyncio.shield(readers), _PIPE_GRACE_S)
                exit_code = await asyncio.wait_for(proc.wait(), _PIPE_GRACE_S)
            except asyncio.TimeoutError:
                readers.cancel()
                proc._transport.close()  # the pipes' holder is out of reach: stop reading (no public close)
                exit_code = proc.returncode
                note = note or "stopped waiting for output held open by a process out of the sandbox's reach"
        finally:
            shutil.rmtree(base, ignore_errors=True)
    if note or exit_code is None:
        exit_code = None
    elif exit_code < 0:
        sig = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else str(-exit_code)
        note = {"SIGXCPU": "stopped: CPU time limit reached", "SIGKILL": "killed"}.get(sig, f"killed by {sig}")
    stdout = _cut(bytes(out.kept), out.total, limits.max_output_chars)
    stderr = _cut(bytes(err.kept), err.total, limits.max_output_chars)
    return _format(exit_code, stdout, stderr, note)


def _cut(kept: bytes, total: int, max_chars: int) -> str:
    text = kept.decode("utf-8", errors="replace")
    if len(text) > max_chars or total > len(kept):
        text = text[:max_chars] + f"\n[... output truncated: {total:,} bytes in all]"
    return text
