"""What this machine allows a python-sandbox snippet beyond rlimits and the audit hook, probed once at the server's
start: network and PID namespaces (`unshare`), a filesystem view of its own (a mount namespace, `sandbox_view.py`),
a uid of its own (when the server runs as root), a cgroup v2 per call (`sandbox_cgroup.probe_cgroup`); without a
view, the paths the audit hook lets it read. `LAYERS` can be switched off by name (the server's `--disable`)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Collection

try:
    from .sandbox_cgroup import probe_cgroup
    from .sandbox_run import Isolation, Limits, prepare
    from .sandbox_view import derive_view
except ImportError:  # run as a file (`python envs/tools/python_sandbox.py`): its folder is sys.path[0]
    from sandbox_cgroup import probe_cgroup
    from sandbox_run import Isolation, Limits, prepare
    from sandbox_view import derive_view

# What can be switched off: a machine where one misbehaves, and tests of the layers below it.
LAYERS = ("cgroup", "namespaces", "uid")


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _try_snippet(code: str, iso: Isolation) -> tuple[bool, str]:
    """Run `code` the way a snippet runs, synchronously (start-up probes): (it exited 0, its stdout or stderr)."""
    base, scratch, cmd, env = prepare(code, 5.0, Limits(), iso, iso.uid_base)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=scratch, env=env, timeout=30)
        return out.returncode == 0, (out.stdout if out.returncode == 0 else out.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    finally:
        shutil.rmtree(base, ignore_errors=True)


_VIEW_CHECK = "import os, json, encodings.idna\nprint(os.path.isdir('/proc/self'))"


def probe_isolation(disable: Collection[str] = ()) -> Isolation:
    unknown = sorted(set(disable) - set(LAYERS))
    if unknown:
        raise ValueError(f"sandbox: cannot disable {', '.join(unknown)}: the layers are {', '.join(LAYERS)}")
    prefix: list[str] = []
    view, reason = None, "no unshare"
    if "namespaces" in disable:
        reason = "namespaces disabled"
    elif shutil.which("unshare"):
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
    if os.geteuid() == 0 and "uid" not in disable:
        probe_uid = 200_000
        if _try_snippet("import json, encodings.idna", Isolation(prefix, probe_uid, view))[0]:
            uid_base = probe_uid
    cgroup, no_cgroup = (None, "disabled") if "cgroup" in disable else probe_cgroup()
    return Isolation(prefix, uid_base, view, "" if view else reason, None if view else readable_paths(),
                     cgroup=cgroup, no_cgroup_reason=no_cgroup)


def readable_paths() -> list[str]:
    """What the interpreter reads, for the audit hook's fallback where no filesystem view can be made."""
    try:
        return [path for path, _, _ in derive_view().binds]
    except (OSError, subprocess.SubprocessError):
        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        return sorted(os.path.realpath(p) for p in paths)
