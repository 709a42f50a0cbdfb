"""An asynchronous step built group by group as groups arrive (trainer/asynchronous/streamed.py) takes the same
optimizer step as the whole-batch update (`Update.whole_batch`), and reports the same metrics."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from rlfactory.algorithms.grpo import actor_config
from rlfactory.models.tiny import build_tiny_qwen3
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.recipe.training import AlgorithmConfig, OffPolicyConfig
from rlfactory.rollout.trajectory import Trajectory
from rlfactory.trainer.asynchronous.streamed import StreamedStep, streams
from rlfactory.trainer.policy import Policy
from rlfactory.trainer.update import Update

VOCAB = 300


def Host(model: torch.nn.Module, algorithm: AlgorithmConfig) -> Update:  # noqa: N802 - reads as the type it makes
    """The update over a tiny random Qwen3, with SGD so the parameters move by the (clipped) gradient."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1.0)
    policy = Policy(recipe=SimpleNamespace(algorithm=algorithm, rollout=RolloutConfig()), model=model,
                    tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=1), device=torch.device("cpu"),
                    params=params, optimizer=optimizer,
                    scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), reference=None,
                    actor_cfg=actor_config(algorithm, samples_per_prompt=4, mini_batch_prompts=4))
    return Update(policy)


def _groups(seed: int = 0) -> list[list[Trajectory]]:
    """4 groups of 4: prompts and responses of varied lengths, a tool span (mask 0) in some, behaviour logprobs off
    the current policy (so the importance weights vary and some are capped); one group all-equal reward."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(4):
        prompt = torch.randint(5, VOCAB, (3 + 2 * gi,), generator=g).tolist()
        group = []
        for k in range(4):
            n = 4 + (gi + 3 * k) % 7
            resp = torch.randint(5, VOCAB, (n,), generator=g).tolist()
            mask = [0 if (k % 2 and 1 <= i <= 2) else 1 for i in range(n)]
            lps = (-4 - torch.rand(n, generator=g) * 4).tolist()  # around log(1/300): some weights capped
            reward = 1.0 if gi == 3 else float((k + gi) % 3 == 0)
            group.append(Trajectory(id=f"{gi}/{k}", task_id=str(gi), group_id=str(gi), sample_index=k,
                                    prompt_ids=prompt, response_ids=resp, loss_mask=mask,
                                    logprobs=[lp if m else 0.0 for lp, m in zip(lps, mask)], reward=reward,
                                    policy_versions=[3 if m else -1 for m in mask]))
        groups.append(group)
    return groups


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_group_by_group_takes_the_whole_batch_step(mode):
    algorithm = AlgorithmConfig(loss_agg_mode=mode, micro_batch_size=3, off_policy=OffPolicyConfig(is_cap=1.5))
    base = build_tiny_qwen3(VOCAB, seed=0)
    whole, streamed = Host(copy.deepcopy(base), algorithm), Host(copy.deepcopy(base), algorithm)
    groups = _groups()
    flat = [t for grp in groups for t in grp]

    m_whole = whole.whole_batch(flat, algorithm.off_policy)
    step = StreamedStep(streamed, algorithm.off_policy)
    for arrival in ([groups[2]], [groups[0], groups[3]], [groups[1]]):  # out of order, in uneven batches
        step.add([t for grp in arrival for t in grp])
    m_streamed = step.finish()

    moved = max(float((p - q).detach().abs().max()) for p, q in zip(whole.policy.params, base.parameters()))
    assert moved > 1e-4  # the step did something
    for p, q in zip(whole.policy.params, streamed.policy.params):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5)
    assert set(m_whole) == set(m_streamed)
    for k in m_whole:
        assert m_streamed[k] == pytest.approx(m_whole[k], rel=1e-4, abs=1e-6), k
    assert m_whole["off_policy/tokens_clipped"] > 0 and m_whole["rollout/groups_all_same_reward"] == 1.0
    assert all(p.grad is None for p in streamed.policy.params)  # nothing is left for the next step


def test_a_step_with_no_signal_still_steps_and_infra_failures_stay_out():
    algorithm = AlgorithmConfig(micro_batch_size=8)
    base = build_tiny_qwen3(VOCAB, seed=1)
    whole, streamed = Host(copy.deepcopy(base), algorithm), Host(copy.deepcopy(base), algorithm)
    groups = _groups(seed=1)
    groups[0][1] = groups[0][1].model_copy(update={"finish_reason": "error"})
    assert groups[0][1].infra_failed
    flat = [t for grp in groups for t in grp]
    m_whole = whole.whole_batch(flat, algorithm.off_policy)
    step = StreamedStep(streamed, algorithm.off_policy)
    for grp in groups:
        step.add(grp)
    m_streamed = step.finish()
    assert m_streamed["rollout/trained_on_infra_failures"] == m_whole["rollout/trained_on_infra_failures"] == 0
    assert m_streamed["rollout/trained_tokens"] == m_whole["rollout/trained_tokens"]
    for p, q in zip(whole.policy.params, streamed.policy.params):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5)

    nothing = Host(copy.deepcopy(base), algorithm)
    step = StreamedStep(nothing, algorithm.off_policy)
    step.add(groups[3])  # all rewards equal: no row has signal
    m = step.finish()
    assert m["rollout/rows_with_signal"] == 0 and m["loss/pg"] == 0.0


def test_which_recipes_stream():
    def recipe(**algorithm):
        return SimpleNamespace(algorithm=AlgorithmConfig(**algorithm))

    assert streams(recipe())
    assert not streams(recipe(ppo_epochs=2))
    assert not streams(recipe(mini_batches_per_step=2))
    assert not streams(recipe(off_policy=OffPolicyConfig(mask_outside=(0.5, 2.0))))
