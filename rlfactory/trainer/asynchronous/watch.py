"""The asynchronous trainer's watchdog over its generator process: what a step waits for, said at intervals, and a
clear error when the generator stalls.

The generator sends a pulse (`messages.Pulse`) on its results queue every `PULSE_S`: its pid, when it was sent (on
CLOCK_MONOTONIC, which every process of the machine shares), what it is doing (groups and tool calls in flight,
whether the staleness bound holds it back, the policy version it has) and its progress counters (decode steps,
prefills, tool results, groups finished, a helper's seconds of work, weight loads).
Every message is a sign of life; a group, a dropped group,
or a pulse whose counters moved, is progress.

While a step waits on the generator (`check`), this logs every `trainer.generator_watchdog_s` what the step waits
for, how long it has, and what the generator last did; and it raises `GeneratorStalled` when, for
`trainer.generator_stall_timeout_s`, the generator has not been heard from (a stopped process: SIGSTOP, a
debugger; or one frozen), or has made no progress with no tool call in flight (a tool call ends by its own timeout,
so one in flight is progress on its way). The trainer's own work does not count against the generator: progress
is measured from the start of the step's wait, so a long update never looks like a stall, nor does a long step
whose generator keeps generating.

Left out: a generator that exits (the loop sees its process end, loop.py); start-up (its own timeout).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rlfactory.errors import RLFactoryError
from rlfactory.trainer.asynchronous.messages import PROGRESS_NAMES, Pulse

logger = logging.getLogger(__name__)

PULSE_S = 1.0
"""How often the generator sends a pulse."""


class GeneratorStalled(RLFactoryError):
    """The generator process was silent, or made no progress, for `trainer.generator_stall_timeout_s`."""


def doing(pulse: Pulse | None) -> str:
    """What a pulse says the generator was doing, in words."""
    if pulse is None:
        return "nothing reported yet"
    parts = []
    if pulse.groups:
        parts.append(f"generating {pulse.groups} group(s)")
    if pulse.tool_calls:
        parts.append(f"{pulse.tool_calls} tool call(s) in flight")
    if pulse.gated:
        parts.append(f"held back by the staleness bound at policy version {pulse.version}")
    return ", ".join(parts) or "idle, with nothing in flight"


class GeneratorWatch:
    """Fed every message from the generator (`heard`); `begin` at the start of each step's wait, `check` while it
    waits."""

    def __init__(self, pid: int | None, log_every_s: float, stall_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.pid, self.log_every_s, self.stall_s, self.clock = pid, log_every_s, stall_s, clock
        now = clock()
        self.last_heard = self.last_progress = now
        self.pulse: Pulse | None = None
        self._began = now
        self._next_log = now + log_every_s
        self._logged_counters: tuple[float, ...] | None = None

    def heard(self, kind: str, body: Any) -> None:
        now = self.clock()
        if kind != "pulse":  # a group, a dropped group: progress
            self.last_heard = self.last_progress = now
            return
        sent = min(float(body.sent), now)
        self.last_heard = max(self.last_heard, sent)
        if self.pulse is not None and tuple(body.progress) != tuple(self.pulse.progress):
            self.last_progress = max(self.last_progress, sent)
        if self.pulse is None or sent >= self.pulse.sent:
            self.pulse = body

    def begin(self) -> None:
        """A step starts waiting on the generator."""
        self._began = self.clock()
        self._next_log = self._began + self.log_every_s
        self._logged_counters = tuple(self.pulse.progress) if self.pulse else None

    def check(self, waiting_for: str) -> None:
        """While waiting for `waiting_for` (words, e.g. "the groups of step 3 (1 of 4 here)"): log at intervals;
        raise GeneratorStalled past the stall timeout."""
        now = self.clock()
        silent = now - self.last_heard
        still = now - max(self.last_progress, self._began)
        pid = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        if silent >= self.stall_s or (still >= self.stall_s and not (self.pulse and self.pulse.tool_calls)):
            what = (f"has not been heard from for {silent:.0f} s" if silent >= self.stall_s
                    else f"has made no progress for {still:.0f} s (no token generated, no tool result, no group or "
                         f"update job finished, no tool call in flight)")
            raise GeneratorStalled(
                f"the generator process ({pid}) {what} while the trainer waited {now - self._began:.0f} s for "
                f"{waiting_for}; it last reported: {doing(self.pulse)}. Was it stopped (SIGSTOP, a debugger), or is it "
                f"frozen or starved of memory? The run stops here; continue from the last checkpoint with --resume, "
                f"and raise trainer.generator_stall_timeout_s "
                f"({self.stall_s:g} s) if the generator is legitimately that slow.")
        if now < self._next_log:
            return
        self._next_log = now + self.log_every_s
        if silent >= self.log_every_s:
            state = (f"not heard from it for {silent:.0f} s (it last reported: {doing(self.pulse)}): is it stopped "
                     f"(SIGSTOP, a debugger) or starved of CPU? The run stops if it stays silent for "
                     f"{self.stall_s:g} s (trainer.generator_stall_timeout_s)")
        else:
            state = f"heard from it {silent:.1f} s ago: {doing(self.pulse)}{self._progress_since_log()}"
        logger.warning("waited %.0f s for %s from the generator process (%s); %s", now - self._began, waiting_for,
                       pid, state)

    def _progress_since_log(self) -> str:
        if self.pulse is None:
            return ""
        now = tuple(self.pulse.progress)
        before, self._logged_counters = self._logged_counters, now
        if before is None or len(before) != len(now):
            return ""
        moved = [f"{name} +{b - a:g}" for name, a, b in zip(PROGRESS_NAMES, before, now) if b != a]
        return f"; since the last line: {', '.join(moved) if moved else 'no progress'}"
