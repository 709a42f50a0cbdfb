"""Advantages of branched groups (algorithms/branch_credit.py) on hand-made trees: a baseline per branch point, the
shared prefix trained once, and the tokens each advantage lands on."""
from __future__ import annotations

import pytest
import torch

from rlfactory.algorithms.branch_credit import branch_advantages, token_advantages, train_prefix_once
from rlfactory.rollout.trajectory import Branch, Trajectory


def _leaf(k: int, root: int, child: int, reward: float, *, prefix: int = 3, length: int = 6,
          group: str = "g") -> Trajectory:
    return Trajectory(id=f"{group}/{k}", group_id=group, prompt_ids=[1], response_ids=list(range(length)),
                      loss_mask=[1] * length, logprobs=[-1.0] * length, reward=reward,
                      branch=Branch(root=root, child=child, prefix_tokens=prefix, prefix_turns=1))


def test_each_branch_point_has_its_own_baseline():
    tree = [_leaf(0, 0, 0, 1.0), _leaf(1, 0, 1, 0.0), _leaf(2, 1, 0, 0.0), _leaf(3, 1, 1, 0.0)]
    adv = branch_advantages(tree, norm_by_std=False)
    # root 0's branches average 0.5 against root 1's 0.0; within root 0 the branches differ by 1
    assert adv[0] == pytest.approx((0.5, 1.0)) and adv[1] == pytest.approx((0.5, -1.0))
    assert adv[2] == pytest.approx((-0.5, 0.0)) and adv[3] == pytest.approx((-0.5, 0.0))
    std = float(torch.tensor([1.0, 0.0, 0.0, 0.0]).std())
    scaled = branch_advantages(tree, norm_by_std=True)
    assert scaled[0] == pytest.approx((0.5 / (std + 1e-6), 1.0 / (std + 1e-6)))
    # one root: nothing to compare its prefix with
    assert branch_advantages(tree[:2], norm_by_std=False)[0] == pytest.approx((0.0, 1.0))


def test_groups_and_flat_trajectories_stay_apart():
    flat = [Trajectory(id=f"f/{k}", group_id="f", prompt_ids=[1], response_ids=[5, 6], loss_mask=[1, 1],
                       logprobs=[-1.0, -1.0], reward=float(k)) for k in range(3)]
    tree = [_leaf(0, 0, 0, 1.0), _leaf(1, 0, 1, 1.0)]
    adv = branch_advantages(flat + tree, norm_by_std=False)
    assert adv[0] == pytest.approx((-1.5, -1.5)) and adv[2] == pytest.approx((1.5, 1.5))  # GRPO's, leave-one-out
    assert adv[3] == pytest.approx((0.0, 0.0))


def test_the_shared_prefix_is_trained_once_and_each_advantage_lands_on_its_tokens():
    tree = [_leaf(0, 0, 0, 1.0), _leaf(1, 0, 1, 0.0), _leaf(2, 1, 0, 0.0), _leaf(3, 1, 1, 0.0)]
    kept = train_prefix_once(tree)
    assert kept[0].loss_mask == [1] * 6 and kept[1].loss_mask == [0, 0, 0, 1, 1, 1]
    assert tree[1].loss_mask == [1] * 6  # the trajectories themselves are left as they were
    mask = torch.tensor([t.loss_mask for t in kept], dtype=torch.float32)
    tok = token_advantages(kept, branch_advantages(kept, norm_by_std=False), (4, 6), mask)
    assert tok[0].tolist() == [0.5, 0.5, 0.5, 1.0, 1.0, 1.0]
    assert tok[1].tolist() == [0.0, 0.0, 0.0, -1.0, -1.0, -1.0]  # its copy of the prefix carries nothing
    # the prefix's trained tokens count once in the loss's normaliser: 6 + 3 + 6 + 3
    assert float(mask.sum()) == 18.0


def test_a_branching_recipe_is_refused_before_any_work_where_it_cannot_branch(tmp_path):
    import json

    from rlfactory.errors import ConfigError
    from rlfactory.preflight import validate_recipe
    from rlfactory.recipe.schema import Recipe
    from rlfactory.rollout_side import check_can_branch
    from rlfactory.tools.types import ToolSpec

    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "answer": "1"}\n')
    recipe = {"name": "t", "model": {"path": "m"}, "data": {"train_file": "train.jsonl"},
              "rewards": {"functions": [{"function": "exact_match"}]},
              "rollout": {"samples_per_prompt": 6, "horizon": {"type": "fixed", "turns": 3},
                          "branching": {"width": 4, "at_turn": 3}},
              "algorithm": {"micro_batch_size": 6, "turn_credit": {"estimator": "returns"}}, "engine": "verl"}
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    text = "\n".join(validate_recipe(tmp_path / "r.yaml"))
    for words in ("rollout.branching.width (4) must divide rollout.samples_per_prompt (6)",
                  "engine verl samples each trajectory on its own",
                  "rollout.branching.at_turn (3) must be below the horizon (3 turns)"):
        assert words in text, text

    episode = {"type": "object", "properties": {"episode_id": {"type": "string"}}}
    step = ToolSpec(name="step", server="bridge", tool="step", input_schema=episode)
    fork = ToolSpec(name="fork", server="game", tool="fork", input_schema=episode, loop_only=True)
    calc = ToolSpec(name="calculator", server="calc", tool="calculator")
    recipe.update(engine="local", rollout={**recipe["rollout"], "samples_per_prompt": 8,
                                           "branching": {"width": 2, "at_turn": 1}},
                  algorithm={"micro_batch_size": 8})
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    loaded = Recipe.from_yaml(tmp_path / "r.yaml")
    with pytest.raises(ConfigError, match="environment server.s. bridge cannot fork"):
        check_can_branch(loaded, [step, calc], [fork])
    check_can_branch(loaded, [step.model_copy(update={"server": "game"}), calc], [fork])  # forks: fine
    check_can_branch(loaded, [calc], [])  # stateless tools: a branch shares its root's calls


def test_with_turn_credit_too_a_branch_gets_per_turn_advantages_on_its_own_turns():
    from rlfactory.algorithms import credit
    from rlfactory.algorithms.grpo import build_batch
    from rlfactory.recipe.training import AlgorithmConfig
    from rlfactory.rollout.trajectory import TurnSpan

    def leaf(k: int, root: int, child: int, reward: float, steps: list[float]) -> Trajectory:
        # turn 0 (2 tokens, the root's) | tool (1) | turn 1 (2) | tool (1) | turn 2 (2)
        t = _leaf(k, root, child, reward, prefix=3, length=8)
        spans = [("assistant", 0, 2), ("tool", 2, 3), ("assistant", 3, 5), ("tool", 5, 6), ("assistant", 6, 8)]
        return t.model_copy(update={"turns": [TurnSpan(role=r, start=a, end=b) for r, a, b in spans],
                                    "loss_mask": [1, 1, 0, 1, 1, 0, 1, 1], "step_rewards": steps})

    tree = [leaf(0, 0, 0, 1.0, [0.0, 0.5, 0.5]), leaf(1, 0, 1, 0.0, [0.0, 0.0, 0.0]),
            leaf(2, 1, 0, 0.0, [0.0, 0.0, 0.0]), leaf(3, 1, 1, 0.0, [0.0, 0.0, 0.0])]
    kept = train_prefix_once(tree)
    batch = build_batch(kept, pad_id=0)
    both = credit.advantages(kept, batch, AlgorithmConfig(norm_adv_by_std=False,
                                                          turn_credit={"estimator": "returns"}))
    tree_only = credit.advantages(kept, batch, AlgorithmConfig(norm_adv_by_std=False))
    assert both[0, :2].tolist() == tree_only[0, :2].tolist() == [0.5, 0.5]  # the shared turn: per branch point
    # leaf 0's own turns: returns-to-go 1.0 and 0.5 against the other leaves' 0
    assert both[0, 3:5].tolist() == [1.0, 1.0] and both[0, 6:8].tolist() == [0.5, 0.5]
    assert tree_only[0, 3:8].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert both[1, :2].tolist() == [0.0, 0.0]  # a copy of the shared turn carries nothing
