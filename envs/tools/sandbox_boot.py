"""The code a python-sandbox snippet's interpreter runs first (`python -I -c ENTER + BOOT scratch cfg`): the
filesystem view (`sandbox_view.ENTER`, where the machine allows one), the per-snippet uid, rlimits, then an audit
hook that refuses what the sandbox forbids (processes, sockets, writes outside the scratch directory, signals to
other processes, tampering with the hook), and last the snippet itself as `__main__`.

It is text, not imported code: it runs inside the child, which reads `scratch` and the JSON `cfg` from its argv
(`sandbox_run.prepare` builds both)."""

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
PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                            "subprocess.Popen", "os.startfile"})
DENY = (frozenset() if cfg["allow_processes"] else PROCESS_EVENTS) | frozenset({
    "socket.__new__", "socket.socketpair", "socket.fromfd", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo",
    "os.killpg", "signal.pthread_kill",
    "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid", "os.chroot", "sys.remote_exec",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents"})
# ctypes stays importable (numpy needs it) but cannot look up the C functions that would sidestep the checks.
PROCESS_SYMBOLS = frozenset({"fork", "vfork", "clone", "clone3", "__clone", "_Fork", "execve", "execv", "execvp",
                             "execvpe", "execl", "execlp", "execle", "fexecve", "system", "popen", "posix_spawn",
                             "posix_spawnp"})
DENY_SYMBOLS = (frozenset() if cfg["allow_processes"] else PROCESS_SYMBOLS) | frozenset({
    "syscall", "socket",
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
    elif event == "import" and args[0] == "_posixsubprocess" and "os.fork" in DENY:
        # imported (and defused) before this hook: importing it again would build a fresh module with the real
        # fork_exec, which raises no audit event of its own
        raise PermissionError("sandbox: starting processes is not allowed")
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
if not cfg["allow_processes"]:
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
