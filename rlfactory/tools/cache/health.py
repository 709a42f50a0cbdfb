"""How a Redis behind a cache is doing, told apart by what went wrong, and what the log says about it.

A backend reports each operation's outcome here (a read or a write; it succeeded, or raised). A failure is one of:
- `unreachable`: no answer (a refused or reset socket, a timeout). Reads and writes are skipped for
  `retry_interval_s`, then tried again; any answer ends it.
- `full`: Redis answered `OOM command not allowed` (it reached `maxmemory` under the `noeviction` policy). It still
  serves what it holds, so only writes are skipped between tries, and only a write that succeeds ends it: a read
  that succeeds proves nothing about room.
- `refusing`: any other error reply (MISCONF when it cannot save, READONLY on a replica, NOPERM): operations of the
  kind that failed are skipped between tries; one of that kind that succeeds ends it.

The log follows changes of condition, not operations: one warning when a condition starts, one info line when it
ends. The same condition starting again within `quiet_s` of its last warning (a Redis hovering at `maxmemory` while
entries expire, a server restarting in a loop) is counted at debug level, not warned about, and the next warning
says how often it came and went meanwhile.

Left out: the Redis operations themselves and the hit / miss counters (`redis_backend.py`, `decorator.py`).
"""
from __future__ import annotations

import logging
import time
from typing import Literal

from redis.exceptions import OutOfMemoryError, ResponseError

Kind = Literal["read", "write"]
Condition = Literal["ok", "unreachable", "full", "refusing"]

_BOTH: frozenset[str] = frozenset(("read", "write"))


def classify(error: BaseException) -> Condition:
    """The condition an operation's exception shows."""
    if isinstance(error, OutOfMemoryError) or (isinstance(error, ResponseError) and str(error).startswith("OOM")):
        return "full"
    if isinstance(error, ResponseError):
        return "refusing"  # Redis answered: it is there, it said no
    return "unreachable"


class BackendHealth:
    """The condition of one Redis as its operations see it: what to skip, and the log lines on changes.

    `what` names the cache in log lines ("tool cache", "@redis_cache: Redis"); `fallback` says what callers do
    meanwhile ("tool calls run uncached"). Not thread-safe beyond what the GIL gives: at worst a line is logged twice.
    """

    def __init__(self, what: str, where: str, fallback: str, logger: logging.Logger, *, retry_interval_s: float,
                 quiet_s: float = 60.0) -> None:
        self.what, self.where, self.fallback = what, where, fallback
        self.logger = logger
        self.retry_interval_s = retry_interval_s
        self.quiet_s = quiet_s
        self.condition: Condition = "ok"
        self._blocks: frozenset[str] = frozenset()
        self._last_failure = 0.0
        self._warned_at: dict[str, float] = {}
        self._repeats: dict[str, int] = {}
        self._announced = False  # the current condition was warned about, so its end gets an info line
        self.changes = 0
        """Condition changes seen (each start and each end), logged or not."""

    @property
    def unreachable(self) -> bool:
        return self.condition == "unreachable"

    def allows(self, kind: Kind) -> bool:
        """Whether to try a `kind` operation now: not while the condition blocks it, until `retry_interval_s` has
        passed since the last failure."""
        if kind not in self._blocks:
            return True
        return time.monotonic() - self._last_failure >= self.retry_interval_s

    def failed(self, kind: Kind, error: BaseException) -> None:
        self._last_failure = time.monotonic()
        condition = classify(error)
        if condition == "unreachable" or (condition == "refusing" and kind == "read"):
            blocks = _BOTH
        else:
            blocks = frozenset(("write",)) if condition == "full" else frozenset((kind,))
        if condition == self.condition:
            self._blocks |= blocks
            return
        self.condition, self._blocks = condition, blocks
        self.changes += 1
        self._started(condition, kind, error)

    def succeeded(self, kind: Kind) -> None:
        if self.condition == "ok" or kind not in self._blocks:
            return  # e.g. a read served by a full Redis: it says nothing about room for writes
        ended, self.condition, self._blocks = self.condition, "ok", frozenset()
        self.changes += 1
        if not self._announced:
            self.logger.debug("%s at %s: %s ended", self.what, self.where, ended)
            return
        self._announced = False
        if ended == "unreachable":
            self.logger.info("%s at %s is reachable again", self.what, self.where)
        elif ended == "full":
            self.logger.info("%s at %s stores results again (it has room)", self.what, self.where)
        else:
            self.logger.info("%s at %s accepts %ss again", self.what, self.where, kind)

    def _started(self, condition: Condition, kind: Kind, error: BaseException) -> None:
        now = time.monotonic()
        last = self._warned_at.get(condition)
        if last is not None and now - last < self.quiet_s:
            self._repeats[condition] = self._repeats.get(condition, 0) + 1
            self._announced = False
            self.logger.debug("%s at %s is %s again (%s: %s)", self.what, self.where, condition,
                              type(error).__name__, error)
            return
        self._warned_at[condition] = now
        self._announced = True
        repeats = self._repeats.pop(condition, 0)
        again = (f" It was {condition} and recovered {repeats} more time(s) since the last warning."
                 if repeats else "")
        cause = f"{type(error).__name__}: {error}"
        if condition == "unreachable":
            self.logger.warning("%s at %s is unreachable (%s); %s, and it is tried again every %.1f s.%s",
                                self.what, self.where, cause, self.fallback, self.retry_interval_s, again)
        elif condition == "full":
            self.logger.warning(
                "%s at %s is full (%s): it still serves what it holds but stores nothing new. Give it room: raise "
                "its maxmemory (CONFIG SET maxmemory 4gb), or let it evict old entries instead of refusing writes "
                "(CONFIG SET maxmemory-policy allkeys-lru).%s", self.what, self.where, cause, again)
        else:
            self.logger.warning("%s at %s refuses %ss (%s); %s until it accepts them (tried again every %.1f s).%s",
                                self.what, self.where, kind, cause, self.fallback, self.retry_interval_s, again)
