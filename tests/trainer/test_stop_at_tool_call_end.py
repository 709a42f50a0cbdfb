"""`rollout.stop_at_tool_call_end` through the rollout side a run builds (rlfactory/rollout_side.py):
with the BabyAI learning
recipe, its shipped warm start and the real BabyAI MCP server, every assistant turn that calls a tool ends at its
`</tool_call>` token (a policy token), and the `<|im_end|>` after it belongs to the tool response (not trained on)."""
from __future__ import annotations

from pathlib import Path

from rlfactory.data.tasks import load_tasks
from rlfactory.models.loading import load_policy, load_tokenizer
from rlfactory.recipe.schema import Recipe
from rlfactory.rollout_side import open_rollout_side

REPO = Path(__file__).resolve().parents[2]


def _recipe(tmp_path: Path, stop: bool) -> Recipe:
    return Recipe.from_yaml(REPO / "recipes" / "babyai_learn.yaml",
                            [f"rollout.stop_at_tool_call_end={str(stop).lower()}", f"trainer.output_dir={tmp_path}"])


async def _rollouts(recipe: Recipe, run_dir: Path):
    model, tokenizer = load_policy(recipe, "cpu").eval(), load_tokenizer(recipe)
    tasks = load_tasks(recipe.data.train_file, recipe.data, limit=2)
    async with open_rollout_side(recipe, model, tokenizer, "cpu", run_dir) as side:
        trajs, _ = await side.loop.run_batch(tasks, 4, 3, seed=0)
        return trajs, side.chat


async def test_turns_end_at_their_tool_call(tmp_path):
    trajs, chat = await _rollouts(_recipe(tmp_path, True), tmp_path)
    assert chat.tool_call_end_id is not None and chat.tool_call_end_id in chat.stop_token_ids
    calling = 0
    for t in trajs:
        assert t.finish_reason != "error", t.error
        for turn, after in zip(t.turns, t.turns[1:]):
            if turn.role != "assistant":
                continue
            assert after.role == "tool"
            calling += 1
            assert t.response_ids[turn.end - 1] == chat.tool_call_end_id and t.loss_mask[turn.end - 1] == 1
            assert turn.text.rstrip().endswith("</tool_call>")
            assert t.response_ids[after.start] == chat.im_end_id and t.loss_mask[after.start] == 0
    assert calling >= len(trajs)  # the warm start calls the environment in its first turn


async def test_by_default_the_policy_closes_its_own_turns(tmp_path):
    trajs, chat = await _rollouts(_recipe(tmp_path, False), tmp_path)
    assert chat.tool_call_end_id is None
    closed = [t.response_ids[turn.end - 1] == chat.im_end_id
              for t in trajs for turn, after in zip(t.turns, t.turns[1:]) if turn.role == "assistant"]
    assert closed and any(closed)  # the policy's own <|im_end|>, a trained token
