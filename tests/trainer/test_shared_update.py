"""An asynchronous step whose micro-batches are shared with the generator (trainer/asynchronous/shared_update.py)
takes the same optimizer step, with the same metrics, as the whole-batch update; every job runs once, on one side.
Here both sides run in this process, in turn, through the same shared structures and messages the two processes
use (the generator side's thread is not started: the test drives it)."""
from __future__ import annotations

import copy
import queue
import threading
from types import SimpleNamespace

import pytest
import torch
from test_streamed_step import VOCAB, Host, _groups

from rlfactory import api
from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.recipe.training import AlgorithmConfig, OffPolicyConfig
from rlfactory.trainer.asynchronous import shared_update
from rlfactory.trainer.asynchronous.shared_update import GeneratorSide, SharedUpdate
from rlfactory.trainer.asynchronous.streamed import StreamedStep
from rlfactory.trainer.asynchronous.update_jobs import GENERATOR_DONE, TRAINER, UpdateJobs
from rlfactory.trainer.asynchronous.weights import SharedWeights


class Results(list):
    """The generator's results queue. With `jobs` set, notes whether an update_part's gradient was already posted
    when its message was sent (the trainer, waiting for both, must find it posted when the message comes)."""

    jobs: UpdateJobs | None = None
    posted_when_sent: bool | None = None

    def put(self, msg):
        if self.jobs is not None and msg[0] == "update_part":
            self.posted_when_sent = self.jobs.posted(msg[1].step)
        self.append(msg)


def _sides(algorithm: AlgorithmConfig, base: torch.nn.Module, version: int):
    """The trainer's update and share, and the generator's side with weights 0.5 off until it loads the pushed ones."""
    trainer = Host(copy.deepcopy(base), algorithm)
    channels = SimpleNamespace(helper_lock=threading.Lock(), helper_messages=queue.Queue(), results=Results())
    share = SharedUpdate()
    share.messages, share._model = channels.helper_messages, trainer.policy.model
    share.jobs = UpdateJobs.from_model(trainer.policy.model, channels.helper_lock)
    share.messages.put(("jobs", share.jobs))
    weights = SharedWeights.from_model(trainer.policy.model, version=version)
    stale = copy.deepcopy(base)
    with torch.no_grad():
        for p in stale.parameters():
            p.add_(0.5)
    recipe = SimpleNamespace(algorithm=algorithm, rollout=trainer.recipe.rollout,
                             trainer=SimpleNamespace(prompts_per_step=4))
    side = GeneratorSide(channels, recipe, stale, trainer.policy.tokenizer, torch.device("cpu"), weights, None)
    channels.results.jobs = share.jobs
    return trainer, share, side, channels.results


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_a_step_shared_with_the_generator_takes_the_whole_batch_step(mode, monkeypatch):
    monkeypatch.setattr(shared_update, "JOB_ROWS", 2)  # jobs of 2 rows: many, for 16 trajectories
    algorithm = AlgorithmConfig(loss_agg_mode=mode, micro_batch_size=3, off_policy=OffPolicyConfig(is_cap=1.5))
    base = build_tiny_qwen3(VOCAB, seed=0)
    whole = Host(copy.deepcopy(base), algorithm)
    groups = _groups()
    m_whole = whole.whole_batch([t for grp in groups for t in grp], algorithm.off_policy)

    trainer, share, side, results = _sides(algorithm, base, version=3)
    for i, grp in enumerate(groups):
        side.keep(i, grp)
    share.open_step(3, 0)
    step = StreamedStep(trainer, algorithm.off_policy, share)
    for arrival in ([2], [0, 3], [1]):  # out of order, in uneven batches
        step.plan([t for i in arrival for t in groups[i]], arrival)
    side._take_messages()
    n = int(share.jobs.header[1])
    assert n >= 4
    assert step.run_next()  # the trainer runs its first micro-batch
    stolen = 0
    while side._run_one():  # the generator takes from the end while any is open
        stolen += 1
    while step.run_next():  # the trainer runs the rest, finding the jobs taken
        pass
    assert share.close_step()
    assert not results  # nothing is posted before the step is closed
    side._post_due()
    (kind, part), = results
    assert kind == "update_part" and part.step == 3 and part.jobs == stolen and share.jobs.posted(3)
    assert results.posted_when_sent  # the gradient first, then the message announcing it
    states = share.jobs.state[:n].tolist()
    assert states.count(GENERATOR_DONE) == stolen and states.count(TRAINER) == n - stolen and stolen >= 1
    assert share.take_message(kind, part) and share.ready(3)
    other, other_totals, share_m = share.collect(3)
    assert share_m["async/generator_update_jobs"] == stolen
    m_shared = step.finish(other, other_totals)

    for p, q in zip(whole.policy.params, trainer.policy.params):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5)
    assert set(m_whole) == set(m_shared)
    for k in m_whole:
        assert m_shared[k] == pytest.approx(m_whole[k], rel=1e-4, abs=1e-6), k
    assert all(p.grad is None for p in side.update.policy.params)  # posted and cleared for the next step


def test_the_generator_takes_nothing_it_cannot_compute():
    """No job of another step's weights, none without its description, none the trainer claimed, and none once the
    step is closed."""
    algorithm = AlgorithmConfig(micro_batch_size=2)
    base = build_tiny_qwen3(VOCAB, seed=0)
    trainer, share, side, _ = _sides(algorithm, base, version=3)
    groups = _groups()
    for i, grp in enumerate(groups):
        side.keep(i, grp)
    share.open_step(4, 0)  # the trainer's step 4, but version 3 is what is pushed so far: not this step's weights
    step = StreamedStep(trainer, algorithm.off_policy, share)
    step.plan([t for grp in groups for t in grp], [0, 1, 2, 3])
    side._take_messages()
    assert not side._run_one()
    side.weights._version[0] = 4
    side.descriptions.clear()  # undescribed jobs
    assert not side._run_one()
    share.open_step(4, 0)
    offered = [(rows, job) for _, rows, job in step.todo if job is not None]
    for rows, job in offered:
        share.messages.put(("job", 4, job, (0, 1, 2, 3), rows))
    side._take_messages()
    share.jobs.close()
    assert not side._run_one()  # closed
    share.jobs.open(4)
    for _, job in offered:
        share.jobs.add_job(job)
    for _, job in offered[:-1]:
        assert share.jobs.claim(job)
    assert side._run_one()  # the one left open
    assert not share.jobs.claim(offered[-1][1])
    assert not side._run_one()  # none left


def test_the_api_names_the_generators_side_as_the_module_defines_it():
    assert api.SHARED_UPDATE_HELPER == shared_update.HELPER.factory
