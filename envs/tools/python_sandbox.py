"""Python sandbox MCP server (server name `python`): run a snippet in a contained subprocess.

Run: `python -m rlfactory.envs.tools.python_sandbox` (stdio) or `--http --port N` (streamable HTTP on 127.0.0.1).
Options: `--memory-mb`, `--max-timeout-s`, `--max-output-chars`, `--file-size-mb`.

Each call runs `python -I` in a fresh scratch directory (its cwd, deleted afterwards) and returns the exit code,
stdout and stderr. Containment, in layers (the start-up log line says which are active):
- wall clock: the whole process group is killed after `timeout_s`; RLIMIT_CPU stops busy loops as well.
- memory: RLIMIT_AS (`--memory-mb`, default 512) — a hog gets MemoryError.
- output: stdout/stderr are read with a cap; past it the rest is dropped and the snippet is stopped.
- filesystem view: where a mount namespace can be made (root, or unprivileged user namespaces), the snippet's
  root is a tmpfs holding only what this interpreter needs — its stdlib and site-packages, the directories of the
  shared libraries it loads, /etc/ld.so.cache, /dev/null, zero, full, random, urandom — bind-mounted read-only,
  a fresh /proc of its own PID namespace (no other process, no host command line) and the scratch directory,
  writable (`sandbox_view.py`, derived once at start-up). /etc, /home, /root, the project tree, other files are absent.
- files: an audit hook refuses opening for writing, removing, renaming, chmod… of any path outside the scratch
  directory (after resolving symlinks; hard links to outside files are refused); RLIMIT_FSIZE caps file size.
  Without a filesystem view the hook also refuses reading (open, listing) outside the paths the view would hold
  and the scratch directory — CPython-level only, like the rest of the hook.
- processes: the audit hook refuses fork/exec/spawn/system/subprocess, and ctypes lookups of fork/exec/syscall/…
  (ctypes itself stays importable: numpy needs it), so a fork bomb cannot start a second process; with a
  per-snippet uid (below) RLIMIT_NPROC caps processes too, and when a PID namespace is available
  (`unshare --pid`) killing the sandbox kills everything in it.
- network: a new network namespace (`unshare -n`, needs root or unprivileged user namespaces) when available, and
  in every case the audit hook refuses creating sockets and name lookups (no DNS leaks).
- signals: the hook refuses kill()/killpg() of any process but the snippet's own.
When the server runs as root and an unprivileged uid can run this Python (always inside the filesystem view, whose
folders on the way to the interpreter are world-traversable; without it, e.g. /usr/bin/python3 or a venv outside
/root), each snippet drops to a uid of its own once the view is set up, which makes RLIMIT_NPROC and file
permissions bite, and takes away the privileges that could undo the view.
Not a boundary against a determined attacker with a kernel exploit: audit hooks are CPython-level; run the server in
a container or VM for hostile code. Not idempotent and not read-only (snippets may print time or random numbers).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

try:
    from .sandbox_view import ENTER, FsView, derive_view
except ImportError:  # run as a file (`python envs/tools/python_sandbox.py`): its folder is sys.path[0]
    from sandbox_view import ENTER, FsView, derive_view

log = logging.getLogger("rlfactory.envs.tools.python_sandbox")

# The child's first code: limits, then the audit hook, then the snippet. Runs with `python -I -c`.
BOOT = r'''
import sys, os, resource, signal, json, builtins
scratch, cfg = sys.argv[1], json.loads(sys.argv[2])
if cfg["view"]:
    _rlfactory_enter_view(cfg["view"], scratch)  # defined by sandbox_view.ENTER, which precedes this code
del _rlfactory_enter_view
if cfg["uid"] is not None:
    os.setgroups([])
    os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
os.chdir(scratch)
for name, value in cfg["rlimits"].items():
    try:
        resource.setrlimit(getattr(resource, name), (value, value))
    except (ValueError, OSError):
        pass
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with OSError instead of killing
with open("main.py", encoding="utf-8") as f:
    source = f.read()
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DENY = frozenset({
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
    "os.startfile", "socket.__new__", "socket.socketpair", "socket.fromfd", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo",
    "os.killpg", "signal.pthread_kill",
    "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid", "os.chroot", "sys.remote_exec",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents"})
# ctypes stays importable (numpy needs it) but cannot look up the C functions that would sidestep the checks.
DENY_SYMBOLS = frozenset({
    "fork", "vfork", "clone", "clone3", "__clone", "_Fork", "execve", "execv", "execvp", "execvpe", "execl",
    "execlp", "execle", "fexecve", "system", "popen", "posix_spawn", "posix_spawnp", "syscall", "socket",
    "socketpair", "connect", "kill", "killpg", "tgkill", "setrlimit", "prlimit", "prlimit64", "setuid", "setgid",
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "mknod", "mknodat", "ptrace",
    "dlopen", "dlsym", "dlvsym", "open", "open64", "openat", "openat64", "creat", "fopen", "fopen64", "unlink",
    "unlinkat", "rename", "renameat", "mkdir", "rmdir", "chmod", "truncate", "symlink", "link", "mprotect",
    "PySys_AddAuditHook", "_PySys_ClearAuditHooks"})
ONE_PATH = frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate",
                      "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree",
                      "sqlite3.connect"})
TWO_PATHS = frozenset({"os.rename", "os.link"})  # both ends must be inside (a hard link would alias outside)
# Without a filesystem view: reading (open, listing) is allowed only here, in scratch and from a few devices.
READABLE = None if cfg["readable"] is None else tuple(p.rstrip("/") for p in cfg["readable"])

# Everything the hook uses is bound as a default argument, and setting attributes of the hook itself is refused,
# so a snippet rebinding module globals or the hook's __defaults__/__code__ does not change what it checks.
def _rlfactory_sandbox_hook(event, args, scratch=os.path.realpath(scratch), realpath=os.path.realpath,
         fsdecode=os.fsdecode, join=os.path.join, getpid=os.getpid, isinstance=isinstance, str=str, int=int, any=any,
         PermissionError=PermissionError, WRITE_FLAGS=WRITE_FLAGS, DENY=DENY,
         ONE_PATH=ONE_PATH, TWO_PATHS=TWO_PATHS, getattr=getattr, DENY_SYMBOLS=DENY_SYMBOLS,
         DEVICES=("/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr"), READABLE=READABLE,
         READ_DEVICES=("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")):
    def inside(path, also=()):
        if isinstance(path, int):
            return True  # an already-open descriptor
        p = realpath(join(scratch, fsdecode(path)))
        return (p in DEVICES or p == scratch or p.startswith(scratch + "/") or p in also
                or any(p == r or p.startswith(r + "/") for r in (READABLE if also else ())))

    def check_read(path):
        if READABLE is not None and path is not None and not inside(path, READ_DEVICES):
            shown = path if isinstance(path, int) else fsdecode(path)
            raise PermissionError(f"sandbox: reading {shown!r} is not allowed outside the interpreter's files and "
                                  "the scratch directory")

    targets = ()
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS)
        if writing and path is not None:
            targets = (path,)
        else:
            check_read(path)
    elif event in ("os.listdir", "os.scandir"):
        check_read("." if args[0] is None else args[0])
    elif event in ONE_PATH:
        targets = args[:1]
    elif event in TWO_PATHS:
        targets = args[:2]
    elif event == "os.symlink":
        targets = args[1:2]  # the link itself; writes through it are checked after resolving
    elif event in DENY:
        raise PermissionError(f"sandbox: {event.replace('.__new__', ' creation')} is not allowed")
    elif event == "ctypes.dlsym" and (args[1] if isinstance(args[1], str) else "") in DENY_SYMBOLS:
        raise PermissionError(f"sandbox: calling {args[1]} through ctypes is not allowed")
    elif event == "os.kill" and args[0] not in (0, getpid()):
        raise PermissionError("sandbox: signalling other processes is not allowed")
    elif event in ("object.__setattr__", "object.__delattr__") and (
            getattr(args[0], "__qualname__", "") == "_rlfactory_sandbox_hook"):
        raise PermissionError("sandbox: changing the sandbox is not allowed")
    for t in targets:
        if t is not None and not inside(t):
            shown = t if isinstance(t, int) else fsdecode(t)
            raise PermissionError(f"sandbox: {event} on {shown!r} is not allowed outside the scratch directory")

# subprocess imports fine (many libraries do so at import time); its process creation is refused: Popen by the
# hook, and the C entry point it would reach directly is replaced here.
import _posixsubprocess
def _no_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: starting processes is not allowed")
_posixsubprocess.fork_exec = _no_fork_exec
code = compile(source, os.path.join(scratch, "main.py"), "exec")
sys.argv = ["main.py"]
sys.path.insert(0, scratch)
main = {"__name__": "__main__", "__builtins__": builtins, "__file__": "main.py"}
sys.addaudithook(_rlfactory_sandbox_hook)
try:
    exec(code, main)
except SystemExit:
    raise
except BaseException as e:
    import traceback
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    sys.exit(1)
'''

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


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _try_snippet(code: str, iso: Isolation) -> tuple[bool, str]:
    """Run `code` the way a snippet runs, synchronously (start-up probes): (it exited 0, its stdout or stderr)."""
    base, scratch, cmd, env = _prepare(code, 5.0, Limits(), iso)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=scratch, env=env, timeout=30)
        return out.returncode == 0, (out.stdout if out.returncode == 0 else out.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    finally:
        shutil.rmtree(base, ignore_errors=True)


_VIEW_CHECK = "import os, json, encodings.idna\nprint(os.path.isdir('/proc/self'))"


def probe_isolation() -> Isolation:
    prefix: list[str] = []
    view, reason = None, "no unshare"
    if shutil.which("unshare"):
        ns = ["unshare", "-n", "--pid", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            ns.insert(1, "-r")  # an unprivileged user namespace, where the kernel allows them
        if _works([*ns, sys.executable, "-I", "-c", "pass"]):
            prefix = ns
            try:
                candidate = derive_view()
            except (OSError, subprocess.SubprocessError) as e:
                reason = str(e)
            else:
                ok, said = _try_snippet(_VIEW_CHECK, Isolation([*ns, "-m"], None, candidate))
                if ok:
                    prefix, view = [*ns, "-m"], candidate
                    view.fresh_proc = said.endswith("True")
                else:
                    reason = "a mount namespace failed: " + (said.splitlines() or ["?"])[-1][:200]
        else:
            reason = "unshare cannot make namespaces here"
    uid_base = None
    if os.geteuid() == 0:
        probe_uid = 200_000
        if _try_snippet("import json, encodings.idna", Isolation(prefix, probe_uid, view))[0]:
            uid_base = probe_uid
    return Isolation(prefix, uid_base, view, "" if view else reason, None if view else readable_paths())


def readable_paths() -> list[str]:
    """What the interpreter reads, for the audit hook's fallback where no filesystem view can be made."""
    try:
        return [path for path, _, _ in derive_view().binds]
    except (OSError, subprocess.SubprocessError):
        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        return sorted(os.path.realpath(p) for p in paths)

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


def _prepare(code: str, timeout_s: float, limits: Limits, iso: Isolation) -> tuple[str, str, list[str], dict]:
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
    base, scratch, cmd, env = _prepare(code, timeout_s, limits, iso)
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


_limits = Limits()
_isolation: Isolation | None = None

server = MCPServer(
    "python",
    instructions="Run Python code: python(code, timeout_s) returns the exit code, stdout and stderr.",
    log_level="WARNING",
)


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False, destructive_hint=False,
                                         open_world_hint=False))
async def python(code: str, timeout_s: float = 5) -> str:
    """Run a Python 3 snippet in a fresh sandbox and return its exit code, stdout and stderr.

    Print what you want to see. No network, no subprocesses, files only in the current (temporary) directory,
    limited memory and time. Nothing persists between calls.

    Args:
        code: The Python source to run.
        timeout_s: Wall-clock limit in seconds (at most 30).
    """
    global _isolation
    if _isolation is None:
        _isolation = await asyncio.to_thread(probe_isolation)
    return await run_snippet(code, timeout_s, _limits, _isolation)


def main() -> None:
    global _isolation
    parser = argparse.ArgumentParser(description="Python sandbox MCP server.")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8013)
    parser.add_argument("--memory-mb", type=int, default=_limits.memory_mb)
    parser.add_argument("--max-timeout-s", type=float, default=_limits.max_timeout_s)
    parser.add_argument("--max-output-chars", type=int, default=_limits.max_output_chars)
    parser.add_argument("--file-size-mb", type=int, default=_limits.file_size_mb)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)  # the MCP server has already set up the root logger at WARNING
    _limits.memory_mb, _limits.max_timeout_s = args.memory_mb, args.max_timeout_s
    _limits.max_output_chars, _limits.file_size_mb = args.max_output_chars, args.file_size_mb
    _isolation = probe_isolation()
    log.info("python sandbox isolation: %s", _isolation.describe())
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
