"""`EpisodeRegistry`: the open episodes of one stateful environment server, keyed by episode id.

An environment server holds one live environment object per trajectory. Keys come from the caller (an explicit
`episode_id` argument or the MCP request's `_meta["rlfactory/episode_id"]`) or, failing that, from the MCP session.
The registry bounds how many episodes are open (least recently used is evicted when full), expires idle ones, and
closes an episode on request (`close` tool, trajectory end) or when its session goes away. It remembers the keys of
the latest episodes it evicted or expired (`lost`), so that a later call on one is answered as the server's doing,
not as a call on an episode never opened.

Thread-safe: MCP servers run sync tools on worker threads. Each episode also carries its own lock, so two calls on
the same episode never interleave. It knows nothing about MCP; `rlfactory/envs/mcp_server.py` does the wiring.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterator, TypeVar

logger = logging.getLogger(__name__)

E = TypeVar("E")
LOST_KEPT = 1024
"""The fewest lost keys (evicted or expired) a registry remembers."""


@dataclass
class Episode(Generic[E]):
    key: str
    env: E
    last_used_s: float
    steps: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    owner: int | None = None
    """The connection that opened it (an id), when the server ties episodes to connections."""


class EpisodeRegistry(Generic[E]):
    """Open episodes by key. `factory()` builds a fresh environment object; `closer(env)` releases it."""

    def __init__(
        self,
        factory: Callable[[], E],
        *,
        closer: Callable[[E], None] | None = None,
        max_episodes: int = 256,
        idle_timeout_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_episodes < 1:
            raise ValueError("max_episodes must be >= 1")
        self._factory = factory
        self._closer = closer or (lambda env: getattr(env, "close", lambda: None)())
        self.max_episodes = max_episodes
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._episodes: OrderedDict[str, Episode[E]] = OrderedDict()  # LRU order: oldest first
        self._lost: OrderedDict[str, str] = OrderedDict()  # key -> "evicted" / "expired", oldest first
        self._lost_kept = max(LOST_KEPT, 4 * max_episodes)
        self._lock = threading.Lock()
        self._drained = False  # the server is stopping: no episode opens any more
        self.opened_total = 0
        self.closed_total = 0
        self.evicted_total = 0
        self.expired_total = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._episodes

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._episodes)

    def open(self, key: str) -> Episode[E]:
        """The episode under `key`, created if absent (callers reset it). Expires idle episodes first, then evicts
        the least recently used one if the registry is still full."""
        self.expire()
        with self._lock:
            if self._drained:
                raise RuntimeError("the environment server is shutting down: no new episode opens")
            ep = self._touch_locked(key)
            if ep is not None:
                return ep
            self._lost.pop(key, None)  # opened again: no longer lost
            doomed = self._evict_locked()
        for old in doomed:
            logger.warning("episode registry full (%d): evicting least recently used episode %r",
                           self.max_episodes, old.key)
            self._release(old)
        env = self._factory()  # outside the lock: building an env can be slow (a JVM for SciWorld)
        ep = Episode(key=key, env=env, last_used_s=self._clock())
        with self._lock:
            raced = self._episodes.get(key)
            drained = self._drained
            if raced is None and not drained:
                self._episodes[key] = ep
                self.opened_total += 1
        if drained or raced is not None:  # never registered: released here, not counted as opened or closed
            try:
                self._closer(env)
            except Exception:  # a broken env must not take the registry down
                logger.exception("closing an unused environment for %r failed", key)
        if drained:  # shutdown began while the env was being built: it would never be closed
            raise RuntimeError("the environment server is shutting down: no new episode opens")
        if raced is not None:  # another thread opened the same key meanwhile; keep theirs
            return raced
        return ep

    def adopt(self, key: str, env: E, *, owner: int | None = None, steps: int = 0) -> Episode[E]:
        """Register `env` (a fork of another episode) under `key`, a key no open episode has; evicts the least
        recently used episode when full, as `open` does. Raises KeyError when `key` is taken, RuntimeError when the
        registry is drained (`env` is not closed: the caller still owns it then)."""
        self.expire()
        with self._lock:
            if self._drained:
                raise RuntimeError("the environment server is shutting down: no new episode opens")
            if key in self._episodes:
                raise KeyError(key)
            self._lost.pop(key, None)
            doomed = self._evict_locked()
            ep = Episode(key=key, env=env, last_used_s=self._clock(), steps=steps, owner=owner)
            self._episodes[key] = ep
            self.opened_total += 1
        for old in doomed:
            logger.warning("episode registry full (%d): evicting least recently used episode %r",
                           self.max_episodes, old.key)
            self._release(old)
        return ep

    def _evict_locked(self) -> list[Episode[E]]:
        """Make room for one more episode (least recently used first); caller holds the lock and releases them."""
        doomed = []
        while len(self._episodes) >= self.max_episodes:
            _, old = self._episodes.popitem(last=False)
            doomed.append(old)
            self.evicted_total += 1
            self._remember_locked(old.key, "evicted")
        return doomed

    def _remember_locked(self, key: str, how: str) -> None:
        self._lost[key] = how
        self._lost.move_to_end(key)
        while len(self._lost) > self._lost_kept:
            self._lost.popitem(last=False)

    def lost(self, key: str) -> str | None:
        """"evicted" or "expired" when the server itself closed the episode under `key` (one of its latest
        `4 * max_episodes`, at least `LOST_KEPT`), else None (never opened, or closed on request)."""
        with self._lock:
            return self._lost.get(key)

    def get(self, key: str) -> Episode[E] | None:
        """The open episode under `key` (and mark it used), or None."""
        with self._lock:
            return self._touch_locked(key)

    def _touch_locked(self, key: str) -> Episode[E] | None:
        """The episode under `key`, marked as just used (most recent for eviction); caller holds the lock."""
        ep = self._episodes.get(key)
        if ep is not None:
            ep.last_used_s = self._clock()
            self._episodes.move_to_end(key)
        return ep

    def close(self, key: str) -> bool:
        """Close the episode under `key`; False if there was none."""
        with self._lock:
            ep = self._episodes.pop(key, None)
        if ep is None:
            return False
        self._release(ep)
        return True

    def close_prefix(self, prefix: str) -> int:
        """Close every episode whose key starts with `prefix` (all episodes of one MCP session)."""
        with self._lock:
            keys = [k for k in self._episodes if k.startswith(prefix)]
            eps = [self._episodes.pop(k) for k in keys]
        for ep in eps:
            self._release(ep)
        return len(eps)

    def expire(self) -> int:
        """Close episodes idle longer than `idle_timeout_s`; returns how many."""
        now = self._clock()
        with self._lock:
            stale = [k for k, ep in self._episodes.items() if now - ep.last_used_s > self.idle_timeout_s]
            eps = [self._episodes.pop(k) for k in stale]
            self.expired_total += len(eps)
            for k in stale:
                self._remember_locked(k, "expired")
        for ep in eps:
            logger.info("episode %r expired after %.0f s idle", ep.key, now - ep.last_used_s)
            self._release(ep)
        return len(eps)

    def close_all(self) -> int:
        with self._lock:
            eps = list(self._episodes.values())
            self._episodes.clear()
        for ep in eps:
            self._release(ep)
        return len(eps)

    def drain(self) -> list[Episode[E]]:
        """Take every open episode out (the caller closes them) and refuse new ones from now on: the server is
        stopping."""
        with self._lock:
            self._drained = True
            eps = list(self._episodes.values())
            self._episodes.clear()
            self.closed_total += len(eps)
        return eps

    def __iter__(self) -> Iterator[Episode[E]]:
        with self._lock:
            return iter(list(self._episodes.values()))

    def stats(self) -> dict[str, int]:
        with self._lock:
            open_now = len(self._episodes)
        return {"open": open_now, "opened_total": self.opened_total, "closed_total": self.closed_total,
                "evicted_total": self.evicted_total, "expired_total": self.expired_total,
                "max_episodes": self.max_episodes}

    def _release(self, ep: Episode[E]) -> None:
        # Wait for an in-flight step on this episode before closing its env under it.
        with ep.lock:
            try:
                self._closer(ep.env)
            except Exception:  # a broken env must not take the registry down
                logger.exception("closing episode %r failed", ep.key)
        with self._lock:
            self.closed_total += 1
