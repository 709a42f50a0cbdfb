"""SharedWeights: the trainer's pushes reach a model in another (spawned) process through shared memory, only
newer versions load, and only trainable parameters travel."""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from rlfactory.trainer.asynchronous.weights import SharedWeights


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    m[0].bias.requires_grad_(False)  # frozen: never pushed
    return m


def _load_in_child(lock, inbox, out) -> None:
    weights = inbox.recv().with_lock(lock)  # sent as a message, as the trainer's Setup is
    m = _model(1)
    got = weights.load_into(m, have=0)
    out.put((got, {k: v.tolist() for k, v in m.state_dict().items()}))  # plain data: the child exits


def test_a_push_reaches_a_spawned_process_and_only_trainable_weights_travel():
    ctx = mp.get_context("spawn")
    trainer = _model(0)
    lock = ctx.Lock()
    weights = SharedWeights.from_model(trainer, lock, version=0)
    assert set(weights.buffers) == {"0.weight", "2.weight", "2.bias"}
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(1.0)
    assert weights.publish(trainer, 3) >= 0 and weights.version == 3
    out = ctx.Queue()
    inbox, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_load_in_child, args=(lock, inbox, out))
    child.start()
    send.send(weights)
    version, state = out.get(timeout=120)
    child.join(30)
    assert version == 3
    for name in ("0.weight", "2.weight", "2.bias"):
        assert torch.equal(torch.tensor(state[name]), trainer.state_dict()[name])
    assert not torch.equal(torch.tensor(state["0.bias"]), trainer.state_dict()["0.bias"])  # the child's own frozen bias


def test_only_newer_versions_load_and_a_mismatched_model_is_named():
    trainer, gen = _model(0), _model(1)
    weights = SharedWeights.from_model(trainer, version=2)
    assert weights.load_into(gen, have=2) is None
    assert weights.load_into(gen, have=1) == 2 and torch.equal(gen[2].weight, trainer[2].weight)
    other = torch.nn.Sequential(torch.nn.Linear(4, 8))
    with pytest.raises(RuntimeError, match="lacks"):
        weights.load_into(other, have=0)
