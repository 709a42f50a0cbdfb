"""Which finished groups an asynchronous step takes (trainer.stale_groups: drop / wait), and the data position a
checkpoint keeps."""
from __future__ import annotations

from dataclasses import dataclass

from rlfactory.rollout.trajectory import Trajectory
from rlfactory.trainer.group_queue import GroupQueue


@dataclass
class Group:
    index: int
    trajectories: list


def group(index: int, *versions: int) -> Group:
    """A group of one trajectory per version given (each trajectory sampled by that version alone)."""
    return Group(index, [Trajectory(id=f"{index}/{k}", task_id="t", group_id=str(index), sample_index=k,
                                    prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 0], logprobs=[0.0, 0.0],
                                    policy_versions=[v, -1]) for k, v in enumerate(versions)])


def test_drop_takes_the_oldest_ready_groups_and_drops_those_past_the_bound():
    q = GroupQueue(need=2, k=1, policy="drop")
    q.add(group(1, 0, 0))
    assert q.take(1) == (None, 0)  # group 0 is a straggler, still running: one group ready is too few
    q.add(group(2, 0, 1))
    q.add(group(3, 1, 1))
    taken, dropped = q.take(1)
    assert [g.index for g in taken] == [1, 2] and dropped == 0
    assert q.watermark == 0 and q.done_above == {1, 2}  # group 0 is neither trained nor dropped yet
    q.add(group(0, 0, 2))  # the straggler arrives with a token of version 0: at step 2 that is 2 > k versions old
    q.add(group(4, 2, 2))
    taken, dropped = q.take(2)
    assert [g.index for g in taken] == [3, 4] and dropped == 1
    assert q.dropped_trajectories == 2 and q.watermark == 5 and q.done_above == set() and not q.pending


def test_wait_takes_groups_in_start_order_and_never_drops():
    q = GroupQueue(need=2, k=1, policy="wait")
    for g in (group(1, 0), group(2, 0), group(3, 1)):
        q.add(g)
    assert q.take(1) == (None, 0)  # group 0 holds the step
    q.add(group(0, 0))
    taken, _ = q.take(1)
    assert [g.index for g in taken] == [0, 1]
    taken, _ = q.take(2)
    assert [g.index for g in taken] == [2, 3] and q.dropped_trajectories == 0


def test_state_round_trips_and_wait_skips_groups_done_before_a_resume():
    q2 = GroupQueue(need=1, k=1, policy="drop")
    q2.add(group(1, 0))
    q2.take(0)
    q2.drop(3, 4)
    state = q2.state()
    assert state == {"watermark": 0, "done_above": [1, 3], "dropped_total": 4}
    resumed = GroupQueue(need=2, k=1, policy="wait")
    resumed.load_state(state)
    resumed.add(group(0, 5))
    resumed.add(group(2, 5))
    taken, _ = resumed.take(5)
    assert [g.index for g in taken] == [0, 2] and resumed.watermark == 4


def test_group_i_draws_the_task_the_synchronous_sampler_draws_i_th():
    from rlfactory.data.tasks import TaskSampler

    draws = TaskSampler(7, seed=3).next(30)  # crosses four epochs
    s = TaskSampler(7, seed=3)
    assert [s.at(i) for i in (29, 3, 15, 0, 22, 8)] == [draws[i] for i in (29, 3, 15, 0, 22, 8)]
    assert s.next(5) == draws[:5]  # `at` never moves the position
    s.seek(12)
    assert s.absolute_position() == 12 and s.next(10) == draws[12:22]


def test_take_ready_gives_what_is_ready_in_the_policys_order():
    q = GroupQueue(need=3, k=1, policy="drop")
    assert q.take_ready(1, 3) == ([], 0)
    q.add(group(2, 1))
    q.add(group(0, 0, 1))
    got, dropped = q.take_ready(1, 3)
    assert [g.index for g in got] == [0, 2] and dropped == 0
    q.add(group(5, 0))  # too old at step 2: dropped, not given
    q.add(group(4, 2))
    q.add(group(3, 1))
    got, dropped = q.take_ready(2, 1)
    assert [g.index for g in got] == [3] and dropped == 1 and list(q.pending) == [4]

    w = GroupQueue(need=3, k=1, policy="wait")
    for g in (group(0, 0), group(2, 0)):
        w.add(g)
    got, _ = w.take_ready(1, 3)
    assert [g.index for g in got] == [0]  # group 1 is missing: group 2 waits behind it
    w.add(group(1, 0))
    got, _ = w.take_ready(1, 2)
    assert [g.index for g in got] == [1, 2] and w.watermark == 3
