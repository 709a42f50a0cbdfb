"""The python sandbox: normal runs, and escape attempts (network, files outside scratch, fork bombs, huge output,
infinite loops, memory hogs, signals, tampering with the sandbox, reading host files and other processes' /proc)
— each one contained."""
from __future__ import annotations

import asyncio
import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sandbox_escapes as escapes
from mcp_helpers import child_pids

from envs.tools import python_sandbox, sandbox_probe, sandbox_run


@pytest.fixture(scope="module", params=["probed", "hook_only"])
def iso(request) -> sandbox_run.Isolation:
    """Every test runs twice: with what this machine allows (namespaces and the filesystem view, per-snippet uid when
    root), and with the audit hook (reads limited to the interpreter's files) and rlimits alone — what a machine
    without unshare gets."""
    if request.param == "hook_only":
        return sandbox_run.Isolation(namespace_prefix=[], uid_base=None, readable=sandbox_probe.readable_paths())
    return sandbox_probe.probe_isolation()


@pytest.fixture(scope="module")
def viewed() -> sandbox_run.Isolation:
    """What this machine allows, where it can make namespaces: then the sandbox must have its own filesystem."""
    iso = sandbox_probe.probe_isolation()
    if not iso.namespace_prefix:
        pytest.skip(f"this machine cannot make namespaces (unshare), so no filesystem view: {iso.describe()}")
    return iso


@pytest.fixture(scope="module", params=["view", "hook_reads"])
def contained(request) -> sandbox_run.Isolation:
    """Both ways host files are kept from a snippet: the filesystem view, and the audit hook's fallback."""
    if request.param == "hook_reads":
        return sandbox_run.Isolation(namespace_prefix=[], uid_base=None, readable=sandbox_probe.readable_paths())
    return request.getfixturevalue("viewed")


# Snippets expected to finish get the server's whole 30 s: they end at once, and a loaded machine (tests run in two
# workers) must not turn a slow interpreter start into a timeout.
async def run(iso, code: str, timeout_s: float = 30, **limits) -> str:
    return await sandbox_run.run_snippet(code, timeout_s, sandbox_run.Limits(**limits), iso)


def scratch_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "rlf-python-*")))


async def test_runs_code_and_reports_streams_and_exit_code(iso):
    before = scratch_dirs()
    out = await run(iso, "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert out == "exit code: 3\n--- stdout ---\nhello\n\n--- stderr ---\noops\n"
    out = await run(iso, "def f():\n    raise ValueError('boom')\nf()")
    assert out.startswith("exit code: 1\n--- stdout --- (empty)\n--- stderr ---\nTraceback")
    assert "ValueError: boom" in out and "<string>" not in out  # the sandbox's own frames are hidden
    assert scratch_dirs() == before  # scratch directories are removed


async def test_scratch_directory_is_cwd_and_writable(iso):
    out = await run(iso, "import os\nopen('notes.txt', 'w').write('kept')\nos.mkdir('sub')\n"
                         "open('sub/a.txt', 'w').write('x')\nprint(open('notes.txt').read(), os.getcwd())")
    assert out.startswith("exit code: 0\n--- stdout ---\nkept ")
    assert "rlf-python-" in out


async def test_network_is_blocked(iso):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        out = await run(iso, f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                             "print('connected')")
        assert "connected" not in out.split("--- stderr ---")[0]
        assert out.startswith("exit code: 1")
        assert "sandbox: socket.getaddrinfo is not allowed" in out  # refused before any packet
        out = await run(iso, f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))")
        assert "sandbox: socket creation is not allowed" in out
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached the listener
        out = await run(iso, "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)")
        assert out.startswith("exit code: 1") and "not allowed" in out
    finally:
        listener.close()


async def test_writes_outside_scratch_are_blocked(iso, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    target = tmp_path / "escape.txt"
    attempts = {
        "open": f"open({str(target)!r}, 'w').write('x')",
        "append": f"open({str(victim)!r}, 'a').write('x')",
        "os.open": f"import os\nos.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)",
        "remove": f"import os\nos.remove({str(victim)!r})",
        "rename": f"import os\nos.rename({str(victim)!r}, 'stolen.txt')",
        "symlink": f"import os\nos.symlink({str(victim)!r}, 'link')\nopen('link', 'w').write('x')",
        "hardlink": f"import os\nos.link({str(victim)!r}, 'hard')\nopen('hard', 'w').write('x')",
        "relative": "open('../../../../../../tmp/rlf-escape-rel.txt', 'w').write('x')",
        "pathlib": f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        "shutil": f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        "chmod": f"import os\nos.chmod({str(victim)!r}, 0o777)",
        "sqlite": f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (x)')",
    }
    for name, code in attempts.items():
        out = await run(iso, code)
        assert out.startswith("exit code: 1"), (name, out)
        assert "not allowed outside the scratch directory" in out, (name, out)
    assert victim.read_text() == "original"
    assert not target.exists()
    assert not os.path.exists("/tmp/rlf-escape-rel.txt")


async def test_fork_bombs_are_contained(iso):
    before = child_pids()
    bombs = [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nwhile True:\n    subprocess.Popen(['sleep', '100'])",
        "import multiprocessing as mp\nwhile True:\n    mp.Process(target=print).start()",
        "import os\nos.system('sleep 100 &')",
        "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()",
        "import ctypes\nlibc = ctypes.CDLL('libc.so.6')\nlibc.syscall(57)",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()",
        # a fresh copy of the C module would carry the real fork_exec
        "import sys\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess\n_posixsubprocess.fork_exec()",
        "import importlib, _posixsubprocess\nimportlib.reload(_posixsubprocess)\n_posixsubprocess.fork_exec()",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'sleep 100'])",
    ]
    for code in bombs:
        out = await run(iso, code)
        assert out.startswith("exit code: 1"), (code, out)
        assert "sandbox:" in out and "not allowed" in out, (code, out)
    assert child_pids() == before


async def test_processes_may_be_allowed_and_still_end_with_the_call(iso, tmp_path, monkeypatch):
    """`--allow-processes` (`Limits.allow_processes`): a snippet may run a program; the process-lifetime layer still
    ends what it leaves behind (the escapes are test_sandbox_escapes.py's)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = ("import os, time\n"  # (the filesystem view holds no program to run: fork)
            "r, w = os.pipe()\n"
            "if os.fork() == 0:\n    os.write(w, b'42')\n    time.sleep(300)\n"
            "print(os.read(r, 2).decode())\n")
    out = await run(iso, code, allow_processes=True)
    assert out.startswith("exit code: 0") and "42" in out, out
    assert escapes.alive_with(str(tmp_path)) == []
    refused = await run(iso, code)
    assert refused.startswith("exit code: 1") and "not allowed" in refused, refused


async def test_huge_output_is_truncated(iso):
    out = await run(iso, "while True:\n    print('x' * 1000)", timeout_s=20, max_output_chars=2000)
    assert "stopped: the output exceeded the limit" in out
    assert "[... output truncated:" in out
    assert len(out) < 2600
    out = await run(iso, "print('y' * 5000)", max_output_chars=100)
    assert out.startswith("exit code: 0\n--- stdout ---\n" + "y" * 100 + "\n[... output truncated: 5,001 bytes")


async def test_infinite_loop_is_killed(iso):
    before = child_pids()
    out = await run(iso, "while True:\n    pass", timeout_s=1)
    assert out.startswith("exit code: none (killed)\ntimed out after 1 s (killed)")
    # A snippet that closes its own output and keeps running is killed at the same deadline.
    out = await run(iso, "import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass", timeout_s=1)
    assert "timed out after 1 s" in out
    # The requested timeout is capped by the server's maximum.
    out = await run(iso, "import time\ntime.sleep(60)", timeout_s=1000, max_timeout_s=1)
    assert "timed out after 1 s" in out
    assert child_pids() == before


async def test_detached_processes_end_with_the_call_in_process(iso, tmp_path, monkeypatch):
    # Run inside this (test) process, which adopts no orphans: what embeds run_snippet gets. Scratch directories go
    # under tmp_path, so every process of these snippets names it (sandbox_escapes.py); the real server is
    # test_sandbox_escapes.py's.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for code, timeout_s, expected in [
        (escapes.double_fork(), 30, "exit code: 0\n--- stdout ---\nready\n"),
        (escapes.closed_pipes(), 1, "exit code: none (killed)\ntimed out after 1 s (killed)\n--- stdout ---\nready\n"),
        (escapes.setsid_sleep(), 1, "exit code: none (killed)\ntimed out after 1 s (killed)\n--- stdout ---\nready\n"),
    ]:
        out = await asyncio.wait_for(run(iso, code, timeout_s=timeout_s, allow_processes=True), 90)  # a hang guard
        assert out == expected
        assert escapes.alive_with(str(tmp_path)) == []


async def test_memory_hog_gets_memory_error(iso):
    out = await run(iso, "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))", memory_mb=256)
    assert out.startswith("exit code: 1") and "MemoryError" in out
    out = await run(iso, "x = bytearray(10 * 2**20)\nprint(len(x))", memory_mb=256)
    assert out.startswith("exit code: 0\n--- stdout ---\n10485760")


async def test_file_size_is_capped(iso):
    out = await run(iso, "open('big', 'wb').write(b'x' * (3 * 2**20))", file_size_mb=1)
    assert out.startswith("exit code: 1") and "File too large" in out


async def test_other_processes_cannot_be_signalled(iso):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        out = await run(iso, f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)")
        assert out.startswith("exit code: 1") and "signalling other processes is not allowed" in out
        assert victim.poll() is None
        out = await run(iso, f"import os, signal\nos.killpg({os.getpgid(victim.pid)}, signal.SIGKILL)")
        assert "not allowed" in out and victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


async def test_the_sandbox_cannot_be_switched_off_from_inside(iso, tmp_path):
    target = tmp_path / "after_tamper.txt"
    code = ("import __main__, sys\nhook = __main__._rlfactory_sandbox_hook\n"
            "for attr in ('__code__', '__defaults__'):\n"
            "    try:\n"
            "        setattr(hook, attr, (lambda *a: None).__code__ if attr == '__code__' else None)\n"
            "    except PermissionError as e:\n"
            "        print('refused', attr)\n"
            "__main__.DENY = frozenset()\n"  # rebinding globals does not change what the hook checks
            f"open({str(target)!r}, 'w').write('x')\n")
    out = await run(iso, code)
    assert "refused __code__\nrefused __defaults__" in out
    assert "not allowed outside the scratch directory" in out
    assert not target.exists()


async def test_concurrent_snippets_are_isolated(iso):
    codes = [f"import os\nopen('mine.txt', 'w').write('{i}')\nprint(open('mine.txt').read(), len(os.listdir('.')))"
             for i in range(4)]
    outs = await asyncio.gather(*(run(iso, c) for c in codes))
    # Each saw only its own scratch directory (main.py + mine.txt).
    assert outs == [f"exit code: 0\n--- stdout ---\n{i} 2\n" for i in range(4)]


def test_isolation_description(iso):
    text = iso.describe()
    assert text.startswith("audit hook, rlimits")
    if iso.namespace_prefix:
        assert "network+PID namespaces" in text
    assert ("filesystem view (" in text) == (iso.view is not None)
    assert ("no filesystem view" in text) == (iso.view is None)


async def test_odd_timeouts_fall_back_to_sane_values(iso):
    assert (await run(iso, "print(1)", timeout_s=float("nan"))).startswith("exit code: 0\n--- stdout ---\n1")
    out = await run(iso, "import time\ntime.sleep(5)", timeout_s=-3)  # raised to the 0.1 s floor
    assert "timed out after 0.1 s" in out


def _lines(out: str) -> list[str]:
    assert out.startswith("exit code: 0\n--- stdout ---\n"), out
    return out.split("--- stdout ---\n", 1)[1].split("--- stderr ---")[0].splitlines()


def _needed_under(view, parent: str) -> set[str]:
    """The entries of `parent` the view must show: the first step towards each bound path or recreated link."""
    paths = [b[0] for b in view.binds] + list(view.links)
    return {p[len(parent) + 1:].split("/")[0] for p in paths if p.startswith(parent.rstrip("/") + "/")}


async def test_host_files_outside_scratch_cannot_be_read(viewed, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    repo_file = Path(__file__).resolve()
    readable = [p for p in (str(secret), "/etc/hostname", "/etc/passwd", str(repo_file)) if os.path.isfile(p)]
    assert str(secret) in readable and str(repo_file) in readable  # the host itself can read these
    mounts_before = Path("/proc/self/mountinfo").read_text()
    code = (f"import os\nfor p in {readable!r}:\n"
            "    try:\n        open(p).read()\n        print('READ', p)\n"
            "    except OSError as e:\n        print('refused', type(e).__name__)\n")
    assert _lines(await run(viewed, code)) == ["refused FileNotFoundError"] * len(readable)
    # Folders show only the steps towards what the interpreter needs (here /root may hold pyenv's Python, the
    # project tree the venv): nothing else of them.
    folders = [p for p in ("/root", "/home", "/etc", str(tmp_path), str(repo_file.parents[2]),
                           os.path.dirname(sys.prefix)) if os.path.isdir(p)]
    code = (f"import os, json\nfor p in {folders!r}:\n"
            "    try:\n        print(json.dumps(sorted(os.listdir(p))))\n"
            "    except OSError as e:\n        print(json.dumps(None))\n")
    for folder, line in zip(folders, _lines(await run(viewed, code)), strict=True):
        shown = json.loads(line)
        needed = _needed_under(viewed.view, folder)
        assert (shown is None and not needed) or set(shown) == needed, (folder, shown, needed)
    assert json.loads(line) is not None and os.path.basename(sys.prefix) in json.loads(line)
    # The view's mounts live in the snippet's own mount namespace: the host's table is untouched.
    assert Path("/proc/self/mountinfo").read_text() == mounts_before


async def test_proc_shows_only_the_snippets_own_processes(viewed):
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "rlf-neighbour-marker"])
    try:
        code = ("import os, json\ntry:\n"
                "    pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
                "    own = open('/proc/self/status').read().count(f'\\nPid:\\t{os.getpid()}\\n')\n"
                "except FileNotFoundError:\n    pids, own = None, None\n"
                "print(json.dumps([pids, os.getpid(), own]))\n"
                f"for pid in ({os.getpid()}, {neighbour.pid}):\n"
                "    try:\n        print('READ', open(f'/proc/{pid}/cmdline').read())\n"
                "    except OSError as e:\n        print('refused', type(e).__name__)\n")
        lines = _lines(await run(viewed, code))
        pids, pid, own = json.loads(lines[0])
        if viewed.view is not None and not viewed.view.fresh_proc:
            assert pids is None  # no /proc could be mounted here (e.g. a user namespace in a container): none at all
        else:
            assert pids == [pid]  # nothing but the snippet itself
            assert own == 1  # and its own /proc entries work
        assert lines[1:] == ["refused FileNotFoundError", "refused FileNotFoundError"], lines  # test, neighbour
        assert neighbour.poll() is None
    finally:
        neighbour.kill()
        neighbour.wait()


async def test_interpreter_stdlib_and_site_packages_work_inside_the_view(contained):
    code = ("import os, sys, json, decimal, hashlib, sqlite3, ssl, zlib, lzma\n"
            "db = sqlite3.connect(':memory:')\nprint(db.execute('select 6 * 7').fetchone()[0])\n"
            "print(decimal.Decimal('0.1') + decimal.Decimal('0.2'), hashlib.sha256(b'x').hexdigest()[:8])\n"
            "open('/dev/null', 'w').write('dropped')\nprint(len(open('/dev/urandom', 'rb').read(16)))\n"
            "print(os.path.exists(sys.executable), os.path.isdir(sys.prefix))\n"
            "open('kept.txt', 'w').write('scratch ok')\nprint(open('kept.txt').read())\n")
    if importlib.util.find_spec("numpy") is not None:
        code += "import numpy\nprint(int(numpy.arange(10).sum()))\n"
    lines = _lines(await run(contained, code))
    assert lines[:5] == ["42", "0.3 2d711642", "16", "True True", "scratch ok"]
    if importlib.util.find_spec("numpy") is not None:
        assert lines[5] == "45"


async def test_the_view_is_read_only_except_the_scratch_directory(viewed):
    # statvfs reads the mount's own flags: the filesystem layer, independent of the audit hook.
    code = ("import os, sys\nro = lambda p: bool(os.statvfs(p).f_flag & os.ST_RDONLY)\n"
            "print(ro('/'), ro(sys.prefix), ro(os.path.dirname(os.__file__)), ro('.'))\n")
    assert _lines(await run(viewed, code)) == ["True True True False"]


async def test_without_a_view_the_hook_refuses_reading_host_files(tmp_path):
    iso = sandbox_run.Isolation(namespace_prefix=[], uid_base=None, readable=sandbox_probe.readable_paths())
    assert "reads limited to the interpreter's files" in iso.describe()
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    files = [str(secret), f"/proc/{os.getpid()}/cmdline", str(Path(__file__).resolve())]
    files += [p for p in ("/etc/hostname", "/etc/passwd") if os.path.isfile(p)]
    code = (f"import os\nfor p in {files!r}:\n"
            "    try:\n        open(p, 'rb').read()\n        print('READ', p)\n"
            "    except PermissionError as e:\n        print('refused', 'not allowed outside' in str(e))\n"
            f"for p in {['/root', str(tmp_path), '/proc']!r}:\n"
            "    try:\n        print('LISTED', os.listdir(p))\n"
            "    except PermissionError as e:\n        print('refused', 'not allowed outside' in str(e))\n"
            "print(open('main.py').read().count('secret') > 0, len(os.listdir('.')))\n")
    assert _lines(await run(iso, code)) == ["refused True"] * (len(files) + 3) + ["True 1"]


def test_start_up_log_line_names_the_active_layers():
    expected = sandbox_probe.probe_isolation().describe()
    out = subprocess.run([sys.executable, python_sandbox.__file__], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 0, out.stderr
    assert f"python sandbox isolation: {expected}" in " ".join(out.stderr.split())
