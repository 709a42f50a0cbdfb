"""An asynchronous step whose micro-batches are shared with the generator (trainer/update_jobs.py,
trainer/update_helper.py) takes the same optimizer step, with the same metrics, as the whole-batch update; every
job runs once, on one side. Here both sides run in this process, in turn, through the same shared structures and
messages the two processes use."""
from __future__ import annotations

import copy
import queue
from types import SimpleNamespace

import pytest
import torch
from test_streamed_update import VOCAB, Host, _groups

from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.recipe.training import AlgorithmConfig, OffPolicyConfig
from rlfactory.trainer.streamed_update import StreamedStep
from rlfactory.trainer.update_helper import UpdateHelper
from rlfactory.trainer.update_jobs import GENERATOR_DONE, TRAINER, UpdateJobs
from rlfactory.trainer.weight_push import SharedWeights, trainable_parameters


class Results(list):
    """The generator's results queue. With `jobs` set, notes whether an update_part's gradient was already posted
    when its message was sent (the trainer, waiting for both, must find it posted when the message comes)."""

    jobs: UpdateJobs | None = None
    posted_when_sent: bool | None = None

    def put(self, msg):
        if self.jobs is not None and msg[0] == "update_part":
            self.posted_when_sent = self.jobs.posted(msg[1].step)
        self.append(msg)


def _helper(host: Host, base: torch.nn.Module, jobs: UpdateJobs, weights: SharedWeights, messages, results):
    recipe = SimpleNamespace(algorithm=host.recipe.algorithm, rollout=host.recipe.rollout,
                             trainer=SimpleNamespace(prompts_per_step=4))
    stale = copy.deepcopy(base)
    with torch.no_grad():
        for p in stale.parameters():
            p.add_(0.5)  # the generator's own weights are not the step's until it loads the pushed ones
    return UpdateHelper(recipe, stale, host.tokenizer, torch.device("cpu"), jobs, weights, messages, results)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_a_step_shared_with_the_generator_takes_the_whole_batch_step(mode, monkeypatch):
    monkeypatch.setattr("rlfactory.trainer.streamed_update.JOB_ROWS", 2)  # jobs of 2 rows: many, for 16 trajectories
    algorithm = AlgorithmConfig(loss_agg_mode=mode, micro_batch_size=3, off_policy=OffPolicyConfig(is_cap=1.5))
    base = build_tiny_qwen3(VOCAB, seed=0)
    whole, shared = Host(copy.deepcopy(base), algorithm), Host(copy.deepcopy(base), algorithm)
    groups = _groups()
    m_whole = whole._update([t for grp in groups for t in grp], algorithm.off_policy)

    weights = SharedWeights.from_model(shared.model, version=3)
    jobs = UpdateJobs.from_model(shared.model)
    messages, results = queue.Queue(), Results()
    results.jobs = jobs
    helper = _helper(shared, base, jobs, weights, messages, results)
    for i, grp in enumerate(groups):
        helper.keep(i, grp)
    jobs.open(3)
    messages.put(("open", 3, 0))
    step = StreamedStep(shared, algorithm.off_policy, jobs,
                        lambda j, gi, rows: messages.put(("job", 3, j, tuple(gi), list(rows))))
    for arrival in ([2], [0, 3], [1]):  # out of order, in uneven batches
        step.plan([t for i in arrival for t in groups[i]], arrival)
    helper.take_messages()
    n = int(jobs.header[1])
    assert n >= 4
    assert step.run_next()  # the trainer takes the first job
    stolen = 0
    while helper.run_one():  # the generator takes from the end while any is open
        stolen += 1
    assert stolen == n - 1
    assert not step.run_next()  # the trainer finds the others taken
    assert jobs.close() == stolen
    assert not results  # nothing is posted before the step is closed
    helper.post_due()
    (kind, part), = results
    assert kind == "update_part" and part.step == 3 and part.jobs == stolen and jobs.posted(3)
    assert results.posted_when_sent  # the gradient first, then the message announcing it
    states = jobs.state[:n].tolist()
    assert states.count(GENERATOR_DONE) == stolen and states.count(TRAINER) == n - stolen  # each job once
    jobs.add_posted_into(trainable_parameters(shared.model))
    m_shared = step.finish(part)

    for p, q in zip(whole.params, shared.params):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5)
    assert set(m_whole) == set(m_shared)
    for k in m_whole:
        assert m_shared[k] == pytest.approx(m_whole[k], rel=1e-4, abs=1e-6), k
    assert all(p.grad is None for p in helper.params)  # posted and cleared for the next step


def test_the_generator_takes_nothing_it_cannot_compute():
    """No job of another step's weights, none without its description, none the trainer claimed, and none once the
    step is closed."""
    algorithm = AlgorithmConfig(micro_batch_size=2)
    base = build_tiny_qwen3(VOCAB, seed=0)
    host = Host(copy.deepcopy(base), algorithm)
    weights = SharedWeights.from_model(host.model, version=3)
    jobs = UpdateJobs.from_model(host.model)
    messages, results = queue.Queue(), Results()
    helper = _helper(host, base, jobs, weights, messages, results)
    groups = _groups()
    for i, grp in enumerate(groups):
        helper.keep(i, grp)
    jobs.open(4)  # the trainer's step 4, but version 3 is what is pushed so far: not this step's weights
    step = StreamedStep(host, algorithm.off_policy, jobs,
                        lambda j, gi, rows: messages.put(("job", 4, j, tuple(gi), list(rows))))
    step.plan([t for grp in groups for t in grp], [0, 1, 2, 3])
    helper.take_messages()
    assert not helper.run_one()
    weights._version[0] = 4
    helper.descriptions.clear()  # undescribed jobs
    assert not helper.run_one()
    messages.put(("open", 4, 0))
    for j in range(int(jobs.header[1])):
        messages.put(("job", 4, j, (0, 1, 2, 3), step.todo[j][1]))
    helper.take_messages()
    jobs.close()
    assert not helper.run_one()  # closed
    jobs.open(4)
    for j in range(len(step.todo)):
        jobs.add_job(j)
    for j in range(len(step.todo) - 1):
        assert jobs.claim(j)
    assert helper.run_one()  # the one left open
    assert not jobs.claim(len(step.todo) - 1)
    assert not helper.run_one()  # none left
