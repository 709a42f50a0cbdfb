"""A cgroup v2 per python-sandbox call, the strongest way `sandbox_procs.py` has to end a call's processes: the
call's wrapper joins the cgroup before it execs the snippet (`join_command`), so every process the snippet starts
is in it whatever it does to its session, parent or uid, and one write to `cgroup.kill` (Linux 5.14+) ends them
all; `cgroup.events` says when none is left.

`probe_cgroup` finds, once, where this process may make such cgroups (its own cgroup v2 directory: root, or a
delegated subtree) and proves it by ending a real process through one. Call cgroups are named for the server's
pid, so a server killed mid-call leaves only those of its running calls, which the next probe on the machine
ends. Leaves out controllers (no pids.max or memory.max: the snippet's rlimits cap those) and cgroup v1.
"""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

log = logging.getLogger("rlfactory.envs.tools.sandbox_cgroup")

_PREFIX = "rlfactory-sandbox-"
# `echo` is a shell builtin, so writing 0 moves the shell itself; exec keeps its pid and its cgroup.
_JOIN = 'echo 0 > "$0/cgroup.procs" || { echo "sandbox: cannot join the cgroup $0" >&2; exit 125; }; exec "$@"'


def join_command(cgroup: str, cmd: list[str]) -> list[str]:
    """`cmd`, run from inside `cgroup`: the wrapper moves itself there, then execs (same pid)."""
    return [shutil.which("sh") or "/bin/sh", "-c", _JOIN, cgroup, *cmd]


def _own_cgroup_dir() -> str:
    """The cgroup v2 directory this process belongs to (raises OSError saying why there is none)."""
    own = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                own = line[3:].strip()
    if own is None:
        raise OSError("this process is in no cgroup v2 hierarchy")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] != "cgroup2":
                continue
            root, point = fields[3], fields[4].replace("\\040", " ")
            if own == root or own.startswith(root.rstrip("/") + "/"):
                return os.path.join(point, os.path.relpath(own, root)).rstrip("/.") or point
    raise OSError(f"cgroup v2 path {own} is not under any mounted cgroup2 file system")


def cgroup_empty(path: str) -> bool:
    """No live process left in the cgroup (zombies do not count: they have left it)."""
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            return "populated 0" in f.read()
    except FileNotFoundError:
        return True


def cgroup_kill(path: str) -> None:
    """SIGKILL every process in the cgroup and its children, in one write."""
    with open(os.path.join(path, "cgroup.kill"), "w") as f:
        f.write("1")


def new_cgroup_name() -> str:
    """A fresh cgroup name, naming this process so that a later server can tell the leftovers of a dead one."""
    return f"{_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"


def _remove_cgroup(path: str) -> None:
    """Kill what is left in `path` and remove it (best effort)."""
    for child in [os.path.join(path, c) for c in os.listdir(path) if os.path.isdir(os.path.join(path, c))]:
        _remove_cgroup(child)
    try:
        cgroup_kill(path)
    except OSError:
        pass
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def _remove_stale(here: str) -> None:
    """Call cgroups of sandbox servers that died mid-call (their pid is gone): their processes too."""
    for name in os.listdir(here):
        owner = name[len(_PREFIX):].split("-")[0] if name.startswith(_PREFIX) else ""
        if owner.isdigit():
            try:
                os.kill(int(owner), 0)
            except ProcessLookupError:
                log.info("sandbox: ending the processes left in %s by a server that is gone", name)
                _remove_cgroup(os.path.join(here, name))
            except PermissionError:
                pass


def probe_cgroup() -> tuple[str | None, str]:
    """The cgroup v2 directory this process can make one cgroup per call in, proven by ending a real process
    through one: (its path, "") or (None, why not). Call cgroups are made beside nothing else of ours, so a server
    killed outright leaves only those of the calls it was running, which the next probe on the machine ends."""
    if shutil.which("sh") is None:
        return None, "no sh to join a cgroup with"
    try:
        here = _own_cgroup_dir()
        _remove_stale(here)
        trial = os.path.join(here, new_cgroup_name())
        os.mkdir(trial)
    except OSError as e:
        return None, f"cannot make a cgroup: {e.strerror or e}"
    try:
        if not os.path.exists(os.path.join(trial, "cgroup.kill")):
            return None, "cgroup v2 without cgroup.kill (Linux 5.14+ needed)"
        sleeper = [sys.executable, "-I", "-S", "-c", "import time; time.sleep(60)"]
        proc = subprocess.Popen(join_command(trial, sleeper), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            for _ in range(500):
                with open(os.path.join(trial, "cgroup.procs")) as f:
                    if f.read().strip() or proc.poll() is not None:
                        break
                time.sleep(0.01)
            cgroup_kill(trial)
            proc.wait(timeout=10)
            if proc.returncode != -signal.SIGKILL:
                said = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                return None, f"a process in a new cgroup was not ended by cgroup.kill ({said or proc.returncode})"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
        return here, ""
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cgroup.kill does not work here: {e}"
    finally:
        _remove_cgroup(trial)
