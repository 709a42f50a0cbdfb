"""The python sandbox's own view of the filesystem: what the interpreter needs, read-only, plus its scratch.

`derive_view()` runs once, at server start: it works out which host paths this Python needs — `sys.executable`,
the stdlib and site-packages of its prefixes (not whole prefixes: with /usr as prefix that would be every program),
the directories of the shared libraries it loads (read from the memory map of a child, started as a snippet is,
that imports every stdlib extension module, and numpy when installed), the loader cache, the symlinks met on the
way to each — and the harmless device nodes. Nothing about this machine is hard-coded.

`ENTER` is the child-side code, run first thing inside `unshare -m --pid --fork …` while still privileged (root, or
root of a fresh user namespace): a small tmpfs becomes the new root; each needed path is bind-mounted there at its
own path, read-only, nosuid, nodev; a fresh /proc of the snippet's own PID namespace (so no other process, and no
host command line, is visible); the scratch directory bound read-write; the tmpfs itself remounted read-only; then
pivot_root into it and the old root detached, so no host path stays reachable (chroot where pivot_root is not
available). The mounts live in the snippet's mount namespace only and vanish with it.

Deliberately absent: /etc (no passwd, hosts or resolv.conf; localtime falls back to UTC, pwd lookups fail), /sys,
/home, /root, /dev/shm, the project tree, and any path a .pth file adds outside the prefixes (an editable install's
source tree stays invisible).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICE_LINKS = {"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1",
                "/dev/stderr": "/proc/self/fd/2"}
# statvfs flags equal to the mount flags of the same name: a bind mount in a user namespace must keep them.
_KEPT_FLAGS = 1 | 2 | 4 | 8 | 1024 | 2048  # rdonly, nosuid, nodev, noexec, noatime, nodiratime

# Run in a child of the very interpreter the sandbox uses, started as a snippet is (`-I`): print its sys.path, load
# what it can load, then list the files it mapped.
_PROBE = r'''
import json, os, sys
print(json.dumps(sys.path))
names = [n for n in sys.argv[1:]]
for d in sys.path:
    if os.path.basename(d) == "lib-dynload" and os.path.isdir(d):
        names += sorted({f.split(".")[0] for f in os.listdir(d) if f.endswith(".so")})
for name in names:
    try:
        __import__(name)
    except BaseException:
        pass
with open("/proc/self/maps") as f:
    print("\n".join(sorted({line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6})))
'''


@dataclass
class FsView:
    """Host paths bound read-only into each snippet's root, at the same path."""

    binds: list[tuple[str, bool, int]]  # (real path, is a directory, mount flags it must keep)
    links: dict[str, str]  # symlinks recreated in the new root (path -> target as the host has it)
    devices: list[tuple[str, int]] = field(default_factory=list)
    fresh_proc: bool = True  # set by the start-up probe: whether a fresh /proc could be mounted

    def spec(self, root: str) -> dict:
        return {"root": root, "binds": self.binds, "links": self.links, "devices": self.devices}

    def describe(self) -> str:
        proc = "fresh /proc" if self.fresh_proc else "no /proc"
        return f"filesystem view ({len(self.binds)} read-only host paths, {proc})"


def _kept_flags(path: str) -> int:
    return os.statvfs(path).f_flag & _KEPT_FLAGS


def _follow(path: str, links: dict[str, str], depth: int = 0) -> str:
    """The real path of `path`, recording every symlink met on the way (each must exist in the new root too)."""
    if depth > 40:
        raise OSError(f"sandbox view: too many symlinks resolving {path}")
    real = "/"
    for part in path.strip("/").split("/"):
        if not part or part == ".":
            continue
        if part == "..":
            real = os.path.dirname(real)
            continue
        step = os.path.join(real, part)
        if os.path.islink(step):
            target = os.readlink(step)
            links[step] = target
            real = _follow(os.path.normpath(os.path.join(real, target)), links, depth + 1)
        else:
            real = step
    return real


def _probe_child(executable: str) -> tuple[list[str], set[str]]:
    """A snippet interpreter's sys.path, and the directories of the shared libraries it maps."""
    out = subprocess.run([executable, "-I", "-c", _PROBE, "numpy"], capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0 or not out.stdout:
        raise OSError(f"sandbox view: probing the libraries of {executable} failed: {out.stderr.strip()[-300:]}")
    first, *rest = out.stdout.splitlines()
    files = [p for p in rest if p.startswith("/") and not p.endswith("(deleted)")]
    return json.loads(first), {os.path.dirname(p) for p in files if ".so" in os.path.basename(p) and os.path.isfile(p)}


def derive_view() -> FsView:
    """What this interpreter needs, derived from it (raises OSError when it cannot be worked out)."""
    path, library_dirs = _probe_child(sys.executable)
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    # Only the stdlib and site-packages of the prefixes, not the whole prefix (with /usr as prefix, that would be
    # every program on the machine); sys.path entries elsewhere (an editable install's project tree) stay out.
    wanted = {sys.executable, *library_dirs}
    wanted |= {p for k, p in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")}
    wanted |= {p for p in path if any(os.path.realpath(p).startswith(x.rstrip("/") + "/") for x in prefixes)}
    if os.path.isfile("/etc/ld.so.cache"):
        wanted.add("/etc/ld.so.cache")  # where the loader looks first for a library dlopen()ed by name
    links: dict[str, str] = {}
    # Top-level symlinks (/lib -> usr/lib on merged-/usr systems) are on the loader's search path.
    for name in sorted(os.listdir("/")):
        if os.path.islink("/" + name):
            links["/" + name] = os.readlink("/" + name)
    real = sorted({_follow(p, links) for p in wanted if p and os.path.isabs(p) and os.path.exists(p)})
    binds: list[tuple[str, bool, int]] = []
    for p in real:  # sorted, so a directory comes before anything inside it
        if not any(p == b or p.startswith(b.rstrip("/") + "/") for b, _, _ in binds):
            binds.append((p, os.path.isdir(p), _kept_flags(p)))
    inside = [b for b, is_dir, _ in binds if is_dir]
    links = {k: v for k, v in links.items() if not any(k.startswith(b.rstrip("/") + "/") for b in inside)}
    links.update(DEVICE_LINKS)
    devices = [(d, _kept_flags(d)) for d in DEVICES if os.path.exists(d)]
    return FsView(binds, links, devices)


# Child side: defines _rlfactory_enter_view(view, scratch); BOOT calls it, then deletes it, before the snippet.
ENTER = r'''
def _rlfactory_enter_view(view, scratch):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, DETACH = 1, 2, 4, 8, 32, 4096, 2

    def mount(src, dst, fstype, flags, data=None):
        enc = lambda s: None if s is None else os.fsencode(s)
        if libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sandbox view: mounting {dst}: {os.strerror(err)}")

    def bind(path, target, flags):
        mount(path, target, None, BIND)
        mount(None, target, None, REMOUNT | BIND | flags)

    def mount_point(target, is_dir):
        os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
        if not is_dir:
            open(target, "wb").close()

    os.umask(0o022)
    root = view["root"]
    mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "mode=755,size=4m")
    for path, is_dir, keep in view["binds"]:
        mount_point(root + path, is_dir)
        bind(path, root + path, keep | RDONLY | NOSUID | NODEV)
    for path, keep in view["devices"]:
        mount_point(root + path, False)
        bind(path, root + path, keep | RDONLY | NOSUID | NOEXEC)  # writes to a device node pass a read-only mount
    for link, target in view["links"].items():
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        os.symlink(target, root + link)
    mount_point(root + scratch, True)
    bind(scratch, root + scratch, os.statvfs(scratch).f_flag & (NOSUID | NODEV | NOEXEC | 1024 | 2048) | NOSUID | NODEV)
    mount_point(root + "/proc", True)
    try:
        mount("proc", root + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    except OSError:
        pass  # e.g. a user namespace in a container with a masked /proc: then /proc stays empty, which is stricter
    mount(None, root, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
    os.chdir(root)
    pivot_root = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
    if pivot_root is not None and libc.syscall(pivot_root, b".", b".") == 0:
        # The old root now sits on top of the new one; detaching it leaves no host mount reachable.
        if libc.umount2(b".", DETACH) != 0:
            raise OSError(ctypes.get_errno(), "sandbox view: detaching the host root failed")
    else:
        os.chroot(".")
    os.chdir("/")
'''
