"""The python sandbox: normal runs, and escape attempts (network, files outside scratch, fork bombs, huge output,
infinite loops, memory hogs, signals, tampering with the sandbox) — each one contained."""
from __future__ import annotations

import asyncio
import glob
import os
import socket
import subprocess
import tempfile

import pytest
from mcp_helpers import child_pids

from envs.tools import python_sandbox as sandbox


@pytest.fixture(scope="module", params=["probed", "hook_only"])
def iso(request) -> sandbox.Isolation:
    """Every test runs twice: with what this machine allows (namespaces, per-snippet uid when root), and with the
    audit hook and rlimits alone — what a machine without unshare/setpriv gets."""
    if request.param == "hook_only":
        return sandbox.Isolation(namespace_prefix=[], uid_base=None)
    return sandbox.probe_isolation()


async def run(iso, code: str, timeout_s: float = 10, **limits) -> str:
    return await sandbox.run_snippet(code, timeout_s, sandbox.Limits(**limits), iso)


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
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'sleep 100'])",
    ]
    for code in bombs:
        out = await run(iso, code, timeout_s=5)
        assert out.startswith("exit code: 1"), (code, out)
        assert "sandbox:" in out and "not allowed" in out, (code, out)
    assert child_pids() == before


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


async def test_odd_timeouts_fall_back_to_sane_values(iso):
    assert (await run(iso, "print(1)", timeout_s=float("nan"))).startswith("exit code: 0\n--- stdout ---\n1")
    out = await run(iso, "import time\ntime.sleep(5)", timeout_s=-3)  # raised to the 0.1 s floor
    assert "timed out after 0.1 s" in out
