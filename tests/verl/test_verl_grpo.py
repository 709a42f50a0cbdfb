"""GRPO numbers: for the same batch, the local engine's advantages, loss and gradients
(rlfactory/algorithms/grpo.py, our
padded batch and forward pass) equal verl's: `compute_advantage` on a DataProto (verl's trainer) and `ppo_loss` (verl's
actor loss) fed verl's no-padding log-prob layout, with the ActorConfig verl builds from our translated config."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
VOCAB = 48


def _trajectories(seed: int):
    """Two GRPO groups of four multi-turn trajectories (assistant / tool / assistant spans, tool tokens masked)."""
    from rlfactory.rollout.trajectory import Trajectory, TurnSpan

    rng = random.Random(seed)
    out = []
    for g in range(2):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 7))]
        for k in range(4):
            t = Trajectory(id=f"{g}/{k}", group_id=f"g{g}", prompt_ids=prompt)
            spans = [("assistant", rng.randint(2, 6)), ("tool", rng.randint(1, 4)), ("assistant", rng.randint(1, 5))]
            for role, n in spans[: rng.choice([1, 3])]:
                start = len(t.response_ids)
                t.response_ids += [rng.randrange(1, VOCAB) for _ in range(n)]
                t.loss_mask += [int(role == "assistant")] * n
                t.logprobs += [-rng.uniform(0.5, 5.0) if role == "assistant" else 0.0 for _ in range(n)]
                t.turns.append(TurnSpan(role=role, start=start, end=start + n))
            t.reward = float(k % 2) + rng.random() * 0.1  # every group has spread
            out.append(t)
    return out


def _verl_actor_config(tmp_path: Path, overrides: list[str]):
    """verl's ActorConfig as verl builds it from the config our translation composes."""
    from verl.utils.config import omega_conf_to_dataclass

    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.config import VerlFiles, verl_settings
    from rlfactory.verl.hydra_config import compose, to_overrides

    r = Recipe.from_yaml(REPO / "recipes" / "quickstart.yaml",
                         ["engine=verl", "verl.gpus_per_node=1", f"trainer.output_dir={tmp_path}"] + overrides)
    files = VerlFiles(tmp_path, tmp_path / "recipe.yaml", tmp_path, tmp_path / "t.parquet", None, tmp_path / "a.yaml")
    cfg = compose(to_overrides(verl_settings(r, files, train_rows=100)))
    return r, omega_conf_to_dataclass(cfg.actor_rollout_ref.actor), cfg


@pytest.mark.parametrize("overrides", [
    ["algorithm.clip_ratio_high=0.28"],
    ["algorithm.loss_agg_mode=seq-mean-token-mean", "algorithm.norm_adv_by_std=false",
     "algorithm.kl.use_reference=true", "algorithm.kl.coef=0.05"],
])
def test_local_grpo_equals_verl(tmp_path, overrides):
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils import tensordict_utils as tu
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.utils.losses import ppo_loss

    from rlfactory.algorithms.grpo import (
        actor_config,
        build_batch,
        compute_advantages,
        policy_loss,
        response_logprobs,
        set_global_batch,
    )
    from rlfactory.models.tiny import build_tiny_qwen3

    recipe, verl_cfg, cfg = _verl_actor_config(tmp_path, overrides)
    a, temperature = recipe.algorithm, recipe.rollout.sampling.temperature
    trajs = _trajectories(seed=len(overrides))
    model = build_tiny_qwen3(VOCAB, seed=0, hidden_size=32, num_layers=2, heads=2, kv_heads=1)
    params = [p for p in model.parameters() if p.requires_grad]

    # ---- local engine
    batch = build_batch(trajs, pad_id=0)
    adv = compute_advantages(batch, norm_adv_by_std=a.norm_adv_by_std)  # [N, T]
    ours = actor_config(a, samples_per_prompt=4, mini_batch_prompts=2)
    set_global_batch(ours, batch)
    logp, _ = response_logprobs(model, batch, temperature=temperature)  # [N, T]
    ref = (batch.old_log_probs - 0.3) * batch.response_mask  # a stand-in reference policy, same for both sides
    loss, _ = policy_loss(ours, log_prob=logp, old_log_prob=batch.old_log_probs, advantages=adv,
                          response_mask=batch.response_mask, ref_log_prob=ref)
    grads = torch.autograd.grad(loss, params)

    # ---- verl: trainer-side advantages on a DataProto
    p_len = batch.prompt_len
    resp_lens = batch.attention_mask[:, p_len:].sum(-1)
    rm_scores = torch.zeros_like(batch.response_mask)  # verl puts the sample's reward on its last response token
    rm_scores[torch.arange(len(trajs)), resp_lens - 1] = torch.tensor([t.reward for t in trajs])
    data = DataProto.from_dict(
        tensors={"prompts": batch.input_ids[:, :p_len], "responses": batch.responses,
                 "attention_mask": batch.attention_mask, "response_mask": batch.response_mask.long(),
                 "token_level_rewards": rm_scores},
        non_tensors={"uid": np.array([t.group_id for t in trajs], dtype=object)})
    data = compute_advantage(data, AdvantageEstimator.GRPO,
                             norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
    torch.testing.assert_close(data.batch["advantages"] * batch.response_mask, adv, rtol=1e-6, atol=1e-7)

    # ---- verl: actor-side loss, model output in verl's no-padding layout (one unpadded forward per sequence)
    flat = []
    for i in range(len(trajs)):
        ids = batch.input_ids[i][batch.attention_mask[i].bool()]
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float() / temperature
        flat.append(logprobs_from_logits(logits, torch.roll(ids, shifts=-1)))  # position j scores token j + 1
    td = TensorDict({"prompts": batch.input_ids[:, :p_len], "responses": batch.responses,
                     "attention_mask": batch.attention_mask, "response_mask": batch.response_mask.long(),
                     "old_log_probs": batch.old_log_probs, "advantages": data.batch["advantages"],
                     "ref_log_prob": ref}, batch_size=len(trajs))
    tu.assign_non_tensor_data(td, "dp_size", 1)
    tu.assign_non_tensor_data(td, "batch_num_tokens", float(batch.response_mask.sum()))
    tu.assign_non_tensor_data(td, "global_batch_size", float(len(trajs)))  # verl: mini-batch prompts x n
    verl_loss, _ = ppo_loss(verl_cfg, {"log_probs": torch.cat(flat)}, td)
    verl_grads = torch.autograd.grad(verl_loss, params)

    torch.testing.assert_close(verl_loss, loss, rtol=1e-5, atol=1e-6)
    assert float(loss.detach().abs()) > 1e-4  # a real signal, not two zeros
    for g_ours, g_verl in zip(grads, verl_grads):
        torch.testing.assert_close(g_ours, g_verl, rtol=1e-4, atol=1e-6)
    assert verl_cfg.use_kl_loss == ("algorithm.kl.coef=0.05" in overrides)
