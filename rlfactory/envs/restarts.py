"""`RestartWatch`: what this host knows about the incarnations of one AgentGym-protocol server, shared by every
bridge process of the host that talks to it.

AgentGym's servers give no server identity and number their instances 0, 1, 2, ... under a lock; a restarted server
numbers them from 0 again, so an instance id held from before a restart names another episode's instance once the
new server has handed it out. The watch keeps an *epoch* (an opaque token) per server URL; an instance belongs to the
epoch in which it was created, and an instance of an earlier epoch is never acted on (`EnvClient` fails its episode
as an infrastructure failure). The epoch moves on:
- `restart`: a `create` answered an id not above the highest id this host had seen answered before the create was
  sent (the high-water mark). In one incarnation that cannot happen, so the server restarted: certain.
- `restart` too: the process's sentinel instance (`rlfactory/envs/sentinel.py`) no longer shows its observation.
- `suspect`: a request failed at the connection (refused, or the connection dropped under it; not a timeout): the
  server process went away, and a server that comes back has lost every instance. Not certain (a network fault
  looks the same), so an instance of a suspect epoch is still closed when its owner can show it is still its own.

The state lives in a small JSON file per server URL (`<state_dir>/agentgym-<hash>.json`, default under the system
temp folder, per user), replaced atomically and updated under an `flock`, so the bridge processes of one host (one
per trainer or worker, against one server) see each other's findings; without a usable folder the watch is per
process. A host does not see another host's creates: across hosts the epochs only move on connection failures, and
`EnvClient`'s ownership check is what is left (see `rlfactory/envs/client.py`).
Left out: any server-side identity (the real servers have none) and clean-up of instances of killed processes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: the watch stays per process
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

HISTORY = 64
"""Epochs remembered; an instance whose epoch has left the history counts as certainly gone (never closed)."""


def _token() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class WatchState:
    epoch: str
    high_water: int | None = None
    """The highest instance id answered by `create` in this epoch's incarnation (None: none seen yet)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Oldest first: {"epoch", "cause" ("start" | "restart" | "suspect"), "why", "at"}."""
    created: bool = False
    """Whether an instance was created in this epoch (another suspicion before one was would change nothing)."""

    @classmethod
    def fresh(cls) -> WatchState:
        epoch = _token()
        return cls(epoch=epoch, history=[{"epoch": epoch, "cause": "start", "why": "", "at": time.time()}])

    def bump(self, cause: str, why: str) -> None:
        self.epoch, self.created = _token(), False
        self.history = [*self.history, {"epoch": self.epoch, "cause": cause, "why": why, "at": time.time()}][-HISTORY:]

    def since(self, epoch: str) -> list[dict[str, Any]] | None:
        """The bumps after `epoch` (oldest first), or None when `epoch` is not in the history."""
        for i, entry in enumerate(self.history):
            if entry["epoch"] == epoch:
                return self.history[i + 1:]
        return None


@dataclass(frozen=True)
class Created:
    """Where a new instance stands: its epoch, or None when it cannot be placed (the server restarted while the
    create was in flight, and the id does not say on which side of the restart it was made)."""

    epoch: str | None
    restarted: bool = False
    why: str = ""


class RestartWatch:
    """The epochs of the server at `base_url`. Thread-safe; cheap to ask (`epoch()` stats the file, and reads it
    only when another process changed it)."""

    def __init__(self, base_url: str, state_dir: str | os.PathLike | None = None):
        self.base_url = base_url.rstrip("/")
        self._lock = threading.Lock()
        self._state = WatchState.fresh()
        self._stamp: tuple[int, int, int] | None = None
        self.path: Path | None = None
        folder = Path(state_dir) if state_dir else Path(tempfile.gettempdir()) / f"rlfactory-{_uid()}" / "agentgym"
        name = hashlib.sha256(self.base_url.encode()).hexdigest()[:16]
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.path = folder / f"agentgym-{name}.json"
            with self._locked():
                self._load()
                if self._stamp is None:  # no file yet: this process starts the record
                    self._save()
        except OSError as e:
            self.path = None
            logger.warning("%s: cannot keep the restart record in %s (%s); each bridge process watches alone",
                           self.base_url, folder, e)

    # ---- asking --------------------------------------------------------------------------------------------
    def epoch(self) -> str:
        with self._lock:
            self._load()
            return self._state.epoch

    def gone_for_sure(self, epoch: str) -> bool:
        """Whether an instance of `epoch` certainly died with its server (a restart was seen since, or the epoch is
        too old to tell); False when only suspect bumps followed it."""
        with self._lock:
            self._load()
            later = self._state.since(epoch)
        return later is None or any(e["cause"] == "restart" for e in later)

    def why_gone(self, epoch: str) -> str:
        """What moved the epoch on since `epoch` (for error messages)."""
        with self._lock:
            self._load()
            later = self._state.since(epoch)
        if later is None:
            return "its server's record moved on since it was created"
        whys = [e["why"] for e in later if e["cause"] == "restart"] or [e["why"] for e in later]
        return whys[-1] if whys else "its server's record moved on since it was created"

    # ---- telling -------------------------------------------------------------------------------------------
    def before_create(self) -> WatchState:
        """A copy of the state as a `create` is sent (pass it to `created`)."""
        with self._lock:
            self._load()
            s = self._state
            return WatchState(s.epoch, s.high_water, list(s.history), s.created)

    def created(self, before: WatchState, env_id: Any) -> Created:
        """Record the id a `create` answered; returns the new instance's epoch (bumped when the id shows a restart)."""
        if not isinstance(env_id, int) or isinstance(env_id, bool):
            return Created(self.epoch())  # ids that are not counters say nothing about restarts
        with self._locked():
            self._load()
            s = self._state
            shows_restart = before.high_water is not None and env_id <= before.high_water
            moved = s.epoch != before.epoch
            if shows_restart:
                why = (f"a new instance got id {env_id}, not above the {before.high_water} seen before it: "
                       "the server restarted and numbers its instances from 0 again")
                later = s.since(before.epoch) or []
                if moved and any(e["cause"] == "restart" for e in later):
                    # Another create already recorded this restart: the new id belongs to the current incarnation.
                    s.high_water = env_id if s.high_water is None else max(s.high_water, env_id)
                    s.created = True
                    self._save()
                    return Created(s.epoch, restarted=True, why=why)
                s.bump("restart", why)
                s.high_water, s.created = env_id, True
                self._save()
                logger.warning("%s: %s; instances created before are gone, and their ids now name other episodes' "
                               "instances", self.base_url, why)
                return Created(s.epoch, restarted=True, why=why)
            if moved and any(e["cause"] == "restart" for e in (s.since(before.epoch) or [{"cause": "restart"}])):
                # A restart was recorded while this create was in flight, and the id does not show which server
                # made the instance: it cannot be used safely (nor closed: the id may be another's).
                return Created(None, why="the server restarted while this instance was being created")
            s.high_water = env_id if s.high_water is None else max(s.high_water, env_id)
            s.created = True
            self._save()
            return Created(s.epoch)

    def restarted(self, epoch: str, why: str) -> None:
        """Something shows the server restarted since `epoch` (a sentinel instance changed): record it, unless a
        restart since `epoch` is already recorded (instances created after that one are the new server's)."""
        with self._locked():
            self._load()
            later = self._state.since(epoch)
            if later is not None and any(e["cause"] == "restart" for e in later):
                return
            self._state.bump("restart", why)
            self._state.high_water = None  # the new incarnation's ids are unknown
            self._save()
        logger.warning("%s: %s", self.base_url, why)

    def connection_lost(self, why: str) -> None:
        """A request failed at the connection: instances created so far may be gone (a suspect bump)."""
        with self._locked():
            self._load()
            s = self._state
            if s.history and s.history[-1]["cause"] == "suspect" and not s.created:
                return  # the server is still away: nothing was created since the last suspicion
            s.bump("suspect", why)
            self._save()
        logger.warning("%s: %s; the episodes opened before it are ended (their instances may be gone, and a restarted "
                       "server reuses their ids)", self.base_url, why)

    # ---- the file ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            if self.path is None or fcntl is None:
                yield
                return
            with open(self.path.with_suffix(".lock"), "a") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _load(self) -> None:
        """Refresh the state from the file when another writer replaced it (caller holds `_lock`)."""
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            doc = json.loads(self.path.read_text())
            state = WatchState(epoch=str(doc["epoch"]), high_water=doc.get("high_water"),
                               history=list(doc.get("history") or []), created=bool(doc.get("created")))
        except (OSError, ValueError, KeyError, TypeError) as e:
            # A damaged record: start a new epoch, which ends every episode opened before (the safe side).
            logger.warning("%s: damaged restart record %s (%s); starting a new one", self.base_url, self.path, e)
            state = WatchState.fresh()
            state.history[0]["cause"] = "restart"
        self._state, self._stamp = state, stamp

    def _save(self) -> None:
        if self.path is None:
            return
        s = self._state
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"url": self.base_url, "epoch": s.epoch, "high_water": s.high_water,
                                   "created": s.created, "history": s.history}))
        os.replace(tmp, self.path)
        st = os.stat(self.path)
        self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)


_WATCHES: dict[tuple[str, str], RestartWatch] = {}
_WATCHES_LOCK = threading.Lock()


def watch_for(base_url: str, state_dir: str | os.PathLike | None = None) -> RestartWatch:
    """The process's one watch of `base_url` (every client of that server in this process shares it)."""
    key = (base_url.rstrip("/"), str(state_dir or ""))
    with _WATCHES_LOCK:
        watch = _WATCHES.get(key)
        if watch is None:
            watch = _WATCHES[key] = RestartWatch(base_url, state_dir)
        return watch


def _uid() -> str:
    getuid = getattr(os, "getuid", None)
    return str(getuid()) if getuid else os.environ.get("USERNAME", "user")
