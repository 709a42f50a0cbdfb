"""The asynchronous trainer's watchdog over its generator (generator_watch.py):
- a generator stopped with SIGSTOP mid-run: the waiting trainer logs what it waits for, naming the generator's pid
  and how long, then stops the run with a clear error (no traceback), and no process of the run is left;
- the rule itself on a clock the test moves: silence and no progress end the run, a tool call in flight or a
  trainer busy with its own work does not, and the log line says what the generator was doing."""
from __future__ import annotations

import logging
import os
import re
import signal
import uuid

import pytest
from env_outage import REPO, TRACEBACK, TrainRun
from test_train_async import SMALL, processes_with, wait_gone

from rlfactory.trainer.asynchronous.messages import Pulse

pytestmark = pytest.mark.timeout(600)


def test_a_stopped_generator_is_reported_while_the_trainer_waits_then_ends_the_run(tmp_path):
    marker = uuid.uuid4().hex
    sets = [*SMALL, "trainer.total_steps=4", "trainer.max_staleness_steps=1", "trainer.save_every_steps=1",
            "trainer.log.transcripts_per_step=0", "trainer.generator_watchdog_s=1",
            "trainer.generator_stall_timeout_s=8"]
    run = TrainRun(REPO / "recipes" / "quickstart.yaml", tmp_path / "run", sets, env={"RLF_TEST_MARKER": marker})
    try:
        pid = int(run.wait_for_log(r"generator process (\d+) ready", "the generator's start").group(1))
        run.wait_until(lambda: len(run.rows()) >= 1, "the first step")
        os.kill(pid, signal.SIGSTOP)
        line = run.wait_for_log(rf"waited \d+ s for the[^\n]*from the generator process \(pid {pid}\); not heard "
                                rf"from it for \d+ s[^\n]*", "the watchdog's line", timeout_s=120)
        code = run.finish()
    finally:
        run.stop()
    log = run.log()
    assert "SIGSTOP" in line.group(0) and "it last reported" in line.group(0), line.group(0)
    assert code != 0 and TRACEBACK not in log, log[-4000:]
    assert re.search(rf"error: the generator process \(pid {pid}\) has not been heard from for \d+ s", log), \
        log[-3000:]
    assert "generator_stall_timeout_s" in log and "--resume" in log
    assert not wait_gone(marker), f"processes of the run outlived it: {processes_with(marker)}"


# ---------------------------------------------------------------------------------------------- the rule itself
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pulse(clock: Clock, *, progress: tuple = (0, 0, 0, 0, 0, 0), tool_calls: int = 0, groups: int = 2,
          gated: bool = False) -> Pulse:
    return Pulse(pid=42, sent=clock.now, groups=groups, tool_calls=tool_calls, gated=gated, version=3,
                 progress=progress)


def test_silence_ends_the_wait_and_the_log_says_what_it_waited_for(caplog):
    from rlfactory.trainer.asynchronous.watch import GeneratorStalled, GeneratorWatch

    clock = Clock()
    watch = GeneratorWatch(42, log_every_s=30, stall_s=300, clock=clock)
    watch.heard("pulse", pulse(clock, tool_calls=1))
    watch.begin()
    with caplog.at_level(logging.WARNING, logger="rlfactory.trainer.asynchronous.watch"):
        clock.now += 31
        watch.check("the groups of step 5 (1 of 4 here)")
        clock.now += 300
        with pytest.raises(GeneratorStalled, match=r"\(pid 42\) has not been heard from for 331 s while the trainer "
                                                   r"waited 331 s for the groups of step 5 \(1 of 4 here\)"):
            watch.check("the groups of step 5 (1 of 4 here)")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("waited 31 s for the groups of step 5 (1 of 4 here) from the generator process (pid 42); "
                           "not heard from it for 31 s (it last reported: generating 2 group(s), 1 tool call(s) in "
                           "flight)"), line


def test_progress_or_a_tool_call_in_flight_keeps_a_long_wait_going(caplog):
    from rlfactory.trainer.asynchronous.watch import GeneratorStalled, GeneratorWatch

    clock = Clock()
    watch = GeneratorWatch(42, log_every_s=60, stall_s=100, clock=clock)
    watch.heard("pulse", pulse(clock))
    clock.now += 500  # the trainer's own long update: the generator, gated meanwhile, still pulses
    watch.heard("pulse", pulse(clock, gated=True, groups=0))
    watch.begin()
    with caplog.at_level(logging.WARNING, logger="rlfactory.trainer.asynchronous.watch"):
        for i in range(1, 10):  # 450 s of a long step: decode steps keep coming
            clock.now += 50
            watch.heard("pulse", pulse(clock, progress=(i * 100, 1, 0, 0, 0, 0)))
            watch.check("the 4 groups of step 2")
        assert any("decode steps +" in r.getMessage() for r in caplog.records)
        for _ in range(4):  # a tool call in flight for 200 s: its own timeout bounds it
            clock.now += 50
            watch.heard("pulse", pulse(clock, progress=(900, 1, 0, 0, 0, 0), tool_calls=1))
            watch.check("the 4 groups of step 2")
        clock.now += 50
        watch.heard("pulse", pulse(clock, progress=(900, 1, 1, 0, 0, 0)))
        watch.check("the 4 groups of step 2")
        clock.now += 60  # alive, but nothing moves and nothing is in flight
        watch.heard("pulse", pulse(clock, progress=(900, 1, 1, 0, 0, 0)))
        watch.check("the 4 groups of step 2")
        clock.now += 60
        watch.heard("pulse", pulse(clock, progress=(900, 1, 1, 0, 0, 0)))
        with pytest.raises(GeneratorStalled, match=r"has made no progress for 120 s"):
            watch.check("the 4 groups of step 2")


def test_a_group_is_progress():
    from rlfactory.trainer.asynchronous.watch import GeneratorWatch

    clock = Clock()
    watch = GeneratorWatch(42, log_every_s=10, stall_s=100, clock=clock)
    watch.begin()
    clock.now += 99
    watch.heard("group", object())
    clock.now += 99
    watch.check("the groups of step 1")  # 198 s of waiting and no pulse, but a group came 99 s ago
    assert watch.last_progress == watch.last_heard == clock.now - 99
