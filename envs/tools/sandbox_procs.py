"""Every process a python-sandbox snippet starts ends with its call, however it detaches (`setsid`, a double fork,
closed pipes, an ignored SIGTERM, a fork bomb); and the call learns when the snippet's main process has ended
without waiting for its pipes, which a detached child may hold open.

A call's processes are ended by the strongest means the machine allows (`sandbox_probe.py` finds out, once):
- cgroup v2 (`sandbox_cgroup.py`): the call's wrapper joins a fresh cgroup of its own before it execs the snippet,
  so everything the snippet starts is in it, whatever it does to its session, parent or uid; `cgroup.kill` ends
  them all in one write.
- otherwise, together:
  - PID namespace: the snippet's interpreter is the namespace's init, always the child of the wrapper (`unshare`)
    whatever it does; when it dies the kernel kills everything in the namespace.
  - per-snippet uid: every process of the snippet's uid is killed (a process cannot leave an unprivileged uid),
    again until none is left. Uids are claimed with a record lock, so two servers never share one.
  - sweep: the process tree under the wrapper, every process whose environment carries the call's marker
    (`RLF_SANDBOX_CALL`), and, in the server (a child subreaper), orphans reparented to it; killed through pidfds
    (no pid reuse) until a pass finds none.
Out of reach: on a machine that allows none of the first three, a process that rewrites its environment and
detaches where no subreaper catches it (the server is one; an embedding process need not be). Linux only (procfs).
"""
from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import random
import secrets
import select
import signal
import tempfile

try:
    from .sandbox_cgroup import cgroup_empty, cgroup_kill, join_command, new_cgroup_name
except ImportError:  # run as a file (`python envs/tools/python_sandbox.py`): its folder is sys.path[0]
    from sandbox_cgroup import cgroup_empty, cgroup_kill, join_command, new_cgroup_name

log = logging.getLogger("rlfactory.envs.tools.sandbox_procs")

MARKER = "RLF_SANDBOX_CALL"
_UIDS = 30_000  # snippet uids are uid_base + [0, _UIDS)
_END_LIMIT_S = 15.0  # a hang guard: SIGKILLed processes go in milliseconds

_ours: set[int] = set()  # the wrappers `spawn` started: asyncio reaps them, the sweep leaves them to their call
_subreaper = False


def enable_subreaper() -> bool:
    """Make this process adopt orphaned descendants (prctl PR_SET_CHILD_SUBREAPER), so a double-forked snippet
    process lands here instead of on init, where the sweep finds it. For the server process only: an embedding
    process (a test, a trainer) would then have to reap orphans it never asked for."""
    global _subreaper
    try:
        import ctypes
        _subreaper = ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


# ---------------------------------------------------------------- procfs


def _table() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, state letter, start time in clock ticks) of every visible process."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                out[int(name)] = stat
    return out


def _stat(pid: int) -> tuple[int, str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and ')'
        return int(rest[1]), rest[0].decode(), int(rest[19])
    except (OSError, IndexError, ValueError):
        return None  # gone meanwhile


def _marker(pid: int) -> bytes | None:
    """The call marker in the process's environment: b"" when it has none, None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    key = (MARKER + "=").encode()
    for entry in env.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key):]
    return b""


def _uids(pid: int) -> tuple[bytes, ...]:
    """Real, effective and saved uid (the kernel lets a process of one uid move only among these)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return tuple(line.split()[1:4])
    except OSError:
        pass
    return ()


def _kill(pid: int, start_time: int) -> None:
    """SIGKILL `pid` if it is still the process that started at `start_time` (a pidfd pins it against reuse)."""
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        pass  # no pidfds (Linux < 5.3): the start-time check alone narrows the reuse window
    try:
        stat = _stat(pid)
        if stat is None or stat[2] != start_time:
            return
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        if fd is not None:
            os.close(fd)


# ---------------------------------------------------------------- per-snippet uids


class _UidPool:
    """Snippet uids handed out once at a time: within this process by a set, across processes (two servers on
    one machine) by a record lock on one byte per uid of a shared file, which the kernel drops if we die."""

    def __init__(self, base: int):
        folder = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
        self.fd = os.open(os.path.join(folder, f"rlfactory-sandbox-uids-{base}.lock"),
                          os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.base, self.in_use = base, set()
        self.next = random.randrange(_UIDS)  # two servers rarely even try the same uid first

    def claim(self) -> int:
        for _ in range(_UIDS):
            offset, self.next = self.next, (self.next + 1) % _UIDS
            if offset in self.in_use:
                continue
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            except OSError:
                continue  # another server's snippet has it
            self.in_use.add(offset)
            return self.base + offset
        raise OSError(f"sandbox: all {_UIDS} snippet uids from {self.base} are in use")

    def release(self, uid: int) -> None:
        offset = uid - self.base
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, offset)
        self.in_use.discard(offset)


_pools: dict[int, _UidPool] = {}


# ---------------------------------------------------------------- one call


async def spawn(*cmd: str, **kwargs) -> asyncio.subprocess.Process:
    """`asyncio.create_subprocess_exec`, with the child known to the sweep before any other task runs a sweep (so a
    wrapper that exits at once is never taken for an adopted orphan and reaped behind asyncio's back)."""
    global _spawning
    _spawning += 1
    try:
        proc = await asyncio.create_subprocess_exec(*cmd, **kwargs)
        _ours.add(proc.pid)
        return proc
    finally:
        _spawning -= 1


_spawning = 0


class CallProcesses:
    """The processes of one snippet call: `wrap` its command (cgroup, marker), `started` with the wrapper's pid,
    `wait_exit` for the main process, `end_all` for everything it started. Use as `async with`: the exit ends all
    and frees the uid and the cgroup."""

    def __init__(self, *, cgroup_parent: str | None, uid_base: int | None):
        self.token = secrets.token_hex(8)
        self.cgroup_parent, self.uid_base = cgroup_parent, uid_base  # where call cgroups are made (probe_cgroup)
        self.cgroup: str | None = None
        self.uid: int | None = None
        self.pid: int | None = None
        self.pidfd: int | None = None

    async def __aenter__(self) -> CallProcesses:
        if self.uid_base is not None:
            pool = _pools.get(self.uid_base) or _pools.setdefault(self.uid_base, _UidPool(self.uid_base))
            self.uid = pool.claim()
            await self._sweep()  # processes of this uid left by a server that died mid-call
        if self.cgroup_parent is not None:
            self.cgroup = os.path.join(self.cgroup_parent, new_cgroup_name())
            os.mkdir(self.cgroup)
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await asyncio.shield(self.end_all())
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
            _ours.discard(self.pid)
            if self.uid is not None:
                _pools[self.uid_base].release(self.uid)
            if self.cgroup is not None:
                try:
                    os.rmdir(self.cgroup)
                except OSError as e:
                    log.warning("sandbox: could not remove the call's cgroup %s: %s", self.cgroup, e)

    def wrap(self, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        if self.cgroup is not None:
            cmd = join_command(self.cgroup, cmd)
        return cmd, {**env, MARKER: self.token}

    def started(self, pid: int) -> None:
        self.pid = pid
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None  # no pidfds (Linux < 5.3): _exited polls waitid

    def _exited(self) -> bool:
        """Whether the wrapper has exited (a zombie counts: its children have been reparented already)."""
        if self.pidfd is not None:
            return bool(select.select([self.pidfd], [], [], 0)[0])
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True  # reaped already

    async def wait_exit(self) -> None:
        """Return when the main process (the wrapper, which lives exactly as long as the snippet's interpreter)
        has exited — not when its pipes close, which a detached child can delay for ever."""
        if self.pidfd is None:
            while not self._exited():
                await asyncio.sleep(0.02)
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.add_reader(self.pidfd, lambda: done.done() or done.set_result(None))
        try:
            await done
        finally:
            loop.remove_reader(self.pidfd)

    async def end_all(self) -> None:
        """SIGKILL every process of the call still alive, and return once they are gone (or a hang guard passes)."""
        if self.pid is None:
            return
        if self.cgroup is not None and await self._end_cgroup():
            if _subreaper and not _spawning:
                _reap_adopted(_table(), os.getpid())  # orphans that died in the cgroup came here first
            return
        await self._sweep()

    async def _end_cgroup(self) -> bool:
        try:
            cgroup_kill(self.cgroup)
        except OSError as e:
            log.warning("sandbox: cgroup.kill of %s failed (%s); sweeping the call's processes instead",
                        self.cgroup, e)
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _END_LIMIT_S
        while not cgroup_empty(self.cgroup):
            if loop.time() > deadline:
                log.warning("sandbox: the cgroup %s still holds processes %g s after cgroup.kill", self.cgroup,
                            _END_LIMIT_S)
                return False
            await asyncio.sleep(0.005)
        return True

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _END_LIMIT_S
        while left := self._sweep_once():
            if loop.time() > deadline:
                log.warning("sandbox: processes of a snippet outlived SIGKILL for %g s: %s", _END_LIMIT_S, left)
                return
            await asyncio.sleep(0.005)

    def _sweep_once(self) -> list[int]:
        """One pass: SIGKILL what belongs to the call; the pids found alive (none: nothing is left)."""
        table = _table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        me, token, uid = os.getpid(), self.token.encode(), str(self.uid).encode()
        roots = set()
        if self.pid is not None and not self._exited():
            roots.add(self.pid)  # the wrapper and its tree, the PID namespace's init among them
        for pid, (ppid, state, _) in table.items():
            if pid == me or pid in _ours or state == "Z":
                continue
            if self.uid is not None and uid in _uids(pid):
                roots.add(pid)
                continue
            marker = _marker(pid)
            # The server starts nothing but snippets: an orphan it adopted is a snippet's, this call's unless it
            # carries another call's marker. Not while a wrapper is being started: until it execs, it is a child
            # of the server without a marker too.
            if marker == token or (_subreaper and ppid == me and not marker and not _spawning):
                roots.add(pid)
        found, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid in table and pid not in found:
                found.add(pid)
                todo.extend(children.get(pid, ()))
        alive = []
        for pid in sorted(found):
            ppid, state, start = table[pid]
            if state == "Z":
                continue
            alive.append(pid)
            if pid == self.pid and self.pidfd is not None:
                try:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            elif pid not in _ours or pid == self.pid:
                _kill(pid, start)
        if _subreaper and not _spawning:
            _reap_adopted(table, me)
        return alive


def _reap_adopted(table: dict[int, tuple[int, str, int]], me: int) -> None:
    """Reap zombies this subreaper adopted: nobody else waits for them (asyncio waits only for its own children)."""
    for pid, (ppid, state, _) in table.items():
        if ppid == me and state == "Z" and pid not in _ours:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
