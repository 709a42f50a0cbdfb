"""The staleness rule of an asynchronous run (trainer/asynchronous/staleness.py), asked by both processes: which
groups the generator may start (the bound, the first step's groups alone, never past the last step) and must cancel,
and which finished groups a step takes (`trainer.stale_groups`: drop / wait); the data position a checkpoint keeps
(groups.py)."""
from __future__ import annotations

import multiprocessing as mp

from rlfactory.recipe.training import TrainerConfig
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.trainer.asynchronous.groups import GroupQueue
from rlfactory.trainer.asynchronous.messages import GroupResult
from rlfactory.trainer.asynchronous.staleness import Staleness

CTX = mp.get_context("spawn")


def rule(k: int = 1, per_step: int = 4, policy: str = "drop", total_steps: int = 1000) -> Staleness:
    trainer = TrainerConfig(max_staleness_steps=k, prompts_per_step=per_step, stale_groups=policy,
                            total_steps=total_steps)
    return Staleness(trainer, CTX.Value("q", 0))


def group(index: int, *versions: int) -> GroupResult:
    """A group of one trajectory per version given (each trajectory sampled by that version alone)."""
    trajs = [Trajectory(id=f"{index}/{k}", task_id="t", group_id=str(index), sample_index=k, prompt_ids=[1],
                        response_ids=[2, 3], loss_mask=[1, 0], logprobs=[0.0, 0.0], policy_versions=[v, -1])
             for k, v in enumerate(versions)]
    return GroupResult(index, trajs, [], 0, None)


# ------------------------------------------------------------------------------------------------ admission
def admits(s: Staleness, pushes: int, live: int, running: int) -> bool:
    return s.may_admit(version=pushes, start_version=0, started=live, dropped=0, running=running)


def test_the_bound_allows_k_plus_one_steps_of_groups_per_push():
    s = rule(k=1, per_step=4)
    assert admits(s, 1, 11, running=11)  # after one push: up to (1 + k + 1) * P = 12 live groups
    assert not admits(s, 1, 12, running=0)
    s2 = rule(k=2, per_step=4)
    assert admits(s2, 3, 19, running=5) and not admits(s2, 3, 24, running=5)  # (3 + 2 + 1) * 4 = 24


def test_before_the_first_push_the_first_steps_groups_run_alone():
    s = rule(k=1, per_step=4)
    for live in range(4):  # the first step's groups start at once
        assert admits(s, 0, live, running=live)
    assert not admits(s, 0, 4, running=1)  # one of them still runs: wait
    assert admits(s, 0, 4, running=0)  # all done: the next step's groups start
    assert admits(s, 0, 6, running=2)  # and run together, up to the bound
    assert not admits(s, 0, 8, running=0)


def test_no_group_starts_past_the_runs_last_step_and_released_groups_are_made_up_for():
    s = rule(k=1, per_step=4, total_steps=30)
    assert admits(s, 29, 116, running=4)  # the last step's groups
    assert not admits(s, 29, 120, running=4)  # the bound allows 124: none of them would be trained
    s.release(1)  # the trainer dropped one (or skipped its step): its place is free again
    assert admits(s, 29, 120, running=4)
    # a resumed run that is already done
    assert not rule(total_steps=5).may_admit(version=5, start_version=5, started=0, dropped=0, running=0)


def test_groups_in_flight_past_the_bound_are_cancelled_under_drop_only():
    drop, wait = rule(k=1), rule(k=1, policy="wait")
    assert drop.must_cancel(oldest=2, version=4) and not drop.must_cancel(oldest=3, version=4)
    assert not drop.must_cancel(oldest=None, version=4)  # no token sampled yet
    assert not wait.must_cancel(oldest=0, version=9)


# ------------------------------------------------------------------------------------------------ taking groups
def test_drop_takes_the_oldest_ready_groups_and_drops_those_past_the_bound():
    s, q = rule(k=1, per_step=2), GroupQueue()
    q.add(group(1, 0, 0))
    assert s.take(q, 1, 2, whole=True) == []  # group 0 is a straggler, still running: one group ready is too few
    q.add(group(2, 0, 1))
    q.add(group(3, 1, 1))
    assert [g.index for g in s.take(q, 1, 2, whole=True)] == [1, 2]
    assert q.watermark == 0 and q.done_above == {1, 2}  # group 0 is neither trained nor dropped yet
    q.add(group(0, 0, 2))  # the straggler arrives with a token of version 0: at step 2 that is 2 > k versions old
    q.add(group(4, 2, 2))
    s.begin_step()
    assert [g.index for g in s.take(q, 2, 2, whole=True)] == [3, 4]
    assert s.dropped_this_step == 2 and int(s.released.value) == 1  # its place under the bound is free again
    assert q.dropped_trajectories == 2 and q.watermark == 5 and q.done_above == set() and not q.pending


def test_wait_takes_groups_in_start_order_and_never_drops():
    s, q = rule(k=1, per_step=2, policy="wait"), GroupQueue()
    for g in (group(1, 0), group(2, 0), group(3, 1)):
        q.add(g)
    assert s.take(q, 1, 2, whole=True) == []  # group 0 holds the step
    q.add(group(0, 0))
    assert [g.index for g in s.take(q, 1, 2, whole=True)] == [0, 1]
    assert [g.index for g in s.take(q, 2, 2, whole=True)] == [2, 3] and q.dropped_trajectories == 0


def test_a_step_built_as_groups_arrive_takes_what_is_ready_in_the_policys_order():
    s, q = rule(k=1, per_step=3), GroupQueue()
    assert s.take(q, 1, 3) == []
    q.add(group(2, 1))
    q.add(group(0, 0, 1))
    assert [g.index for g in s.take(q, 1, 3)] == [0, 2]
    q.add(group(5, 0))  # too old at step 2: dropped, not given
    q.add(group(4, 2))
    q.add(group(3, 1))
    assert [g.index for g in s.take(q, 2, 1)] == [3] and s.dropped_this_step == 1 and list(q.pending) == [4]
    w, wq = rule(k=1, per_step=3, policy="wait"), GroupQueue()
    for g in (group(0, 0), group(2, 0)):
        wq.add(g)
    assert [g.index for g in w.take(wq, 1, 3)] == [0]  # group 1 is missing: group 2 waits behind it
    wq.add(group(1, 0))
    assert [g.index for g in w.take(wq, 1, 2)] == [1, 2] and wq.watermark == 3


def test_a_group_the_generator_cancelled_is_counted_without_being_released_twice():
    s, q = rule(k=1), GroupQueue()
    s.dropped_by_generator(q, 0, 8)
    assert q.watermark == 1 and q.dropped_trajectories == 8 and s.dropped_this_step == 8
    assert int(s.released.value) == 0  # the generator counted it as dropped itself


def test_state_round_trips_and_wait_skips_groups_done_before_a_resume():
    s, q = rule(k=1, per_step=1), GroupQueue()
    q.add(group(1, 0))
    s.take(q, 0, 1, whole=True)
    q.drop(3, 4)
    state = q.state()
    assert state == {"watermark": 0, "done_above": [1, 3], "dropped_total": 4}
    resumed = GroupQueue()
    resumed.load_state(state)
    resumed.add(group(0, 5))
    resumed.add(group(2, 5))
    assert [g.index for g in rule(k=1, per_step=2, policy="wait").take(resumed, 5, 2, whole=True)] == [0, 2]
    assert resumed.watermark == 4


def test_group_i_draws_the_task_the_synchronous_sampler_draws_i_th():
    from rlfactory.data.tasks import TaskSampler

    draws = TaskSampler(7, seed=3).next(30)  # crosses four epochs
    s = TaskSampler(7, seed=3)
    assert [s.at(i) for i in (29, 3, 15, 0, 22, 8)] == [draws[i] for i in (29, 3, 15, 0, 22, 8)]
    assert s.next(5) == draws[:5]  # `at` never moves the position
    s.seek(12)
    assert s.absolute_position() == 12 and s.next(10) == draws[12:22]
