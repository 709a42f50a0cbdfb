"""When the asynchronous generator may start another group (generator.may_start): the staleness bound, and the first
step's groups running alone before the first weights push; and what wakes its serve loop to start them (the
trainer's wake byte after each push)."""
from __future__ import annotations

import asyncio
import multiprocessing as mp

from rlfactory.trainer.generator import Generator, may_start
from rlfactory.trainer.generator_launch import GeneratorLaunch


def test_the_bound_allows_k_plus_one_steps_of_groups_per_push():
    P, k = 4, 1
    # after one push: up to (1 + k + 1) * P = 12 live groups, whatever is still running
    assert may_start(1, 11, running=11, per_step=P, k=k)
    assert not may_start(1, 12, running=0, per_step=P, k=k)
    assert may_start(3, 19, running=5, per_step=P, k=2)  # (3 + 2 + 1) * 4 = 24
    assert not may_start(3, 24, running=5, per_step=P, k=2)


def test_before_the_first_push_the_first_steps_groups_run_alone():
    P, k = 4, 1
    for live in range(P):  # the first step's groups start at once
        assert may_start(0, live, running=live, per_step=P, k=k)
    assert not may_start(0, P, running=1, per_step=P, k=k)  # one of them still runs: wait
    assert may_start(0, P, running=0, per_step=P, k=k)  # all done: the next step's groups start
    assert may_start(0, P + 2, running=2, per_step=P, k=k)  # and run together, up to the bound
    assert not may_start(0, 2 * P, running=0, per_step=P, k=k)


def test_after_the_first_push_the_next_steps_groups_start_beside_running_ones():
    assert may_start(1, 5, running=3, per_step=4, k=1)


def test_no_group_starts_past_the_runs_last_step():
    P, k = 4, 1
    assert may_start(29, 116, running=4, per_step=P, k=k, steps_left=30)  # the last step's groups
    assert not may_start(29, 120, running=4, per_step=P, k=k, steps_left=30)  # the bound allows 124: none trains
    assert may_start(29, 119, running=0, per_step=P, k=k, steps_left=30)  # a dropped group is made up for
    assert not may_start(0, 0, running=0, per_step=P, k=k, steps_left=0)  # a resumed run that is already done


def test_the_trainers_wake_byte_wakes_the_serve_loop_and_a_closed_pipe_stops_being_watched():
    rd, wr = mp.get_context("spawn").Pipe(duplex=False)
    gen = Generator.__new__(Generator)  # only its wake pipe is used here
    gen.wake_in = rd
    launch = GeneratorLaunch.__new__(GeneratorLaunch)
    launch._wake_out = wr

    async def serve_loop_side() -> None:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        loop.add_reader(rd.fileno(), gen._on_wake, loop, wake)
        launch.wake()
        launch.wake()  # two pushes before the loop looked: one wake-up, both bytes read
        await asyncio.wait_for(wake.wait(), 60)  # nothing polls here: only the byte can set it
        assert not rd.poll()
        wake.clear()
        wr.close()  # the trainer is gone
        await asyncio.wait_for(wake.wait(), 60)  # woken once more by the end of the pipe ...
        assert not loop.remove_reader(rd.fileno())  # ... and no longer watched

    asyncio.run(serve_loop_side())
    launch.wake()  # a closed pipe is not an error on the trainer's side (the generator's exit is reported)
    rd.close()
