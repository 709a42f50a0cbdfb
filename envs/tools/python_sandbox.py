"""Python sandbox MCP server (server name `python`): run a snippet in a contained subprocess.

Run: `python -m rlfactory.envs.tools.python_sandbox` (stdio) or `--http --port N` (streamable HTTP on 127.0.0.1).
Options: `--memory-mb`, `--max-timeout-s`, `--max-output-chars`, `--file-size-mb`, `--disable LAYER` (cgroup,
namespaces or uid; repeatable: for a machine where one misbehaves), `--allow-processes` (snippets may start
processes, e.g. a compiler: the audit hook's ban is off; they are still confined and end with the call).

Each call runs `python -I` in a fresh scratch directory (its cwd, deleted afterwards) and returns the exit code,
stdout and stderr. Containment, in layers (the start-up log line says which are active):
- wall clock: the snippet is stopped `timeout_s` after it starts; RLIMIT_CPU stops busy loops as well. A call
  returns when the snippet's main process ends (or is stopped), whoever still holds its output pipes.
- process lifetime: every process a snippet starts ends with its call, however it detaches (`setsid`, a double
  fork, closed pipes, an ignored SIGTERM, a fork bomb): by `cgroup.kill` on a cgroup v2 of the call's own where
  the machine allows one; otherwise by killing the PID namespace's init (the kernel then kills the namespace), all
  processes of the snippet's uid, and a sweep of the wrapper's process tree, of processes carrying the call's
  marker in their environment and of orphans this server adopts as a child subreaper (`sandbox_procs.py`).
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
  (ctypes itself stays importable: numpy needs it) — CPython-level, so a snippet that gets around it is still
  held by the process-lifetime layer above; with a per-snippet uid (below) RLIMIT_NPROC caps processes too.
- network: a new network namespace (`unshare -n`, needs root or unprivileged user namespaces) when available, and
  in every case the audit hook refuses creating sockets and name lookups (no DNS leaks).
- signals: the hook refuses kill()/killpg() of any process but the snippet's own.
When the server runs as root and an unprivileged uid can run this Python (always inside the filesystem view, whose
folders on the way to the interpreter are world-traversable; without it, e.g. /usr/bin/python3 or a venv outside
/root), each snippet drops to a uid of its own once the view is set up, which makes RLIMIT_NPROC and file
permissions bite, and takes away the privileges that could undo the view.
The server is this file; a snippet's run is `sandbox_run.py`, the code its interpreter starts with (rlimits, the
audit hook) `sandbox_boot.py`, the start-up probe of what the machine allows `sandbox_probe.py`, the filesystem
view `sandbox_view.py`, and ending a call's processes `sandbox_procs.py`.
Not a boundary against a determined attacker with a kernel exploit: audit hooks are CPython-level; run the server in
a container or VM for hostile code. Not idempotent and not read-only (snippets may print time or random numbers).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

try:
    from .sandbox_probe import LAYERS, probe_isolation
    from .sandbox_procs import enable_subreaper
    from .sandbox_run import Isolation, Limits, run_snippet
except ImportError:  # run as a file (`python envs/tools/python_sandbox.py`): its folder is sys.path[0]
    from sandbox_probe import LAYERS, probe_isolation
    from sandbox_procs import enable_subreaper
    from sandbox_run import Isolation, Limits, run_snippet

log = logging.getLogger("rlfactory.envs.tools.python_sandbox")

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
    parser.add_argument("--disable", action="append", choices=LAYERS, default=[], metavar="LAYER",
                        help=f"switch off an isolation layer ({', '.join(LAYERS)}); repeatable")
    parser.add_argument("--allow-processes", action="store_true",
                        help="snippets may start processes (still confined, and ended with their call)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)  # the MCP server has already set up the root logger at WARNING
    _limits.memory_mb, _limits.max_timeout_s = args.memory_mb, args.max_timeout_s
    _limits.max_output_chars, _limits.file_size_mb = args.max_output_chars, args.file_size_mb
    _limits.allow_processes = args.allow_processes
    enable_subreaper()  # orphans of snippets come here, where the sweep finds them, instead of to init
    _isolation = probe_isolation(args.disable)
    log.info("python sandbox isolation: %s", _isolation.describe())
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
