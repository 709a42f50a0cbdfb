"""Off-policy correction of asynchronous GRPO (algorithms/off_policy.py): truncated importance weights and masking
by hand on a small batch, the weights reaching verl's policy loss, and the staleness bookkeeping."""
from __future__ import annotations

import math

import pytest
import torch

from rlfactory.algorithms.grpo import actor_config, policy_loss, set_global_batch
from rlfactory.algorithms.off_policy import CorrectionTotals, correct, oldest_version, staleness_metrics
from rlfactory.recipe.training import AlgorithmConfig, OffPolicyConfig
from rlfactory.rollout.trajectory import Trajectory

# two rows, four tokens; row 1's last token is padding. log(pi_old / mu) per token:
LOG_RATIO = torch.tensor([[0.0, math.log(3.0), math.log(0.25), math.log(1.5)],
                          [math.log(2.5), math.log(0.8), 0.0, 5.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float32)


def test_truncated_weights_and_masking_by_hand():
    behaviour = torch.full((2, 4), -1.0)
    proximal = behaviour + LOG_RATIO
    totals = CorrectionTotals()
    w, mask = correct(OffPolicyConfig(is_cap=2.0, mask_outside=(0.5, 2.2)), proximal, behaviour, MASK, totals)
    ratio = LOG_RATIO.exp()
    assert torch.allclose(w * MASK, ratio.clamp(max=2.0) * MASK, atol=1e-6)  # min(pi_old / mu, cap)
    # outside [0.5, 2.2]: ratio 3 and 0.25 in row 0, 2.5 in row 1; padding stays untrained
    assert mask.tolist() == [[1, 0, 0, 1], [0, 1, 1, 0]]
    m = totals.metrics()
    assert m["off_policy/tokens"] == 7 and m["off_policy/tokens_clipped"] == 2 and m["off_policy/tokens_masked"] == 3
    real = LOG_RATIO[MASK.bool()]
    assert m["off_policy/logprob_gap"] == pytest.approx(float(real.abs().mean()), rel=1e-6)
    assert m["off_policy/is_weight_mean"] == pytest.approx(float(real.exp().clamp(max=2.0).mean()), rel=1e-6)
    # verl's k3 estimate of KL(mu || pi_old) from the samples: mean of exp(r) - r - 1 over r = log(pi_old / mu)
    assert m["off_policy/kl"] == pytest.approx(float((real.exp() - real - 1).mean()), rel=1e-4)


def test_no_weights_no_masking_leaves_the_batch_alone():
    behaviour = torch.full((2, 4), -1.0)
    totals = CorrectionTotals()
    w, mask = correct(OffPolicyConfig(is_cap=None), behaviour + LOG_RATIO, behaviour, MASK, totals)
    assert w is None and torch.equal(mask, MASK)
    assert totals.metrics()["off_policy/tokens_masked"] == 0


def test_weights_scale_the_policy_gradient_token_by_token():
    """With pi = pi_old (one update), the PPO ratio is 1 and each token's gradient is -A * w / tokens."""
    cfg = actor_config(AlgorithmConfig(micro_batch_size=2, loss_agg_mode="token-mean"), samples_per_prompt=2,
                       mini_batch_prompts=1)
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    weights = LOG_RATIO.exp().clamp(max=2.0)

    class MB:
        response_mask = MASK

    set_global_batch(cfg, MB)
    loss, _ = policy_loss(cfg, log_prob=logp, old_log_prob=logp.detach(), advantages=adv, response_mask=MASK,
                          rollout_is_weights=weights)
    loss.backward()
    assert torch.allclose(logp.grad, -adv * weights * MASK / MASK.sum(), atol=1e-6)


def _traj(versions: list[int], mask: list[int]) -> Trajectory:
    return Trajectory(id="g/0", task_id="g", group_id="g", sample_index=0, prompt_ids=[1], response_ids=[2] * len(mask),
                      loss_mask=mask, logprobs=[0.0] * len(mask), policy_versions=versions)


def test_staleness_per_token_and_per_trajectory():
    a = _traj([3, 3, -1, 4, 4], [1, 1, 0, 1, 1])  # a partial rollout: versions 3 then 4
    b = _traj([4, 4, 4], [1, 1, 1])
    m = staleness_metrics([a, b], step=4)
    assert m["async/staleness_token_mean"] == pytest.approx(2 / 7) and m["async/staleness_token_max"] == 1
    assert m["async/staleness_traj_mean"] == pytest.approx(0.5) and m["async/staleness_traj_max"] == 1
    assert m["async/versions_per_trajectory_max"] == 2
    assert oldest_version([a, b]) == 3 and oldest_version([_traj([-1], [0])]) is None
