"""Is a warmed-up model a usable start for GRPO? Roll it out through the real tools and measure.

GRPO learns only from groups whose rewards differ, and a tool-use reward needs the model to be able to form a
correct call and to copy the tool's result. So after SFT we roll out validation tasks (the AgentLoop, the HF engine
and the recipe's real tools, exactly as in training) and report:
- `call_rate`: share of trajectories that call a tool at all;
- `call_accuracy`: of those, the share whose first call equals the scripted policy's call for the task;
- `copy_accuracy`: of trajectories whose first call succeeded, the share whose `<answer>` is the tool's result (for
  a result that is a picture, such as `calculator_picture`'s, the task's answer, which the picture shows);
- `reward`: end-to-end exact match with the task's answer.
The start is usable when call and copy accuracy reach the configured bars (copying "switches on" at a step that
depends on the seed, so this is checked, not assumed) and the model neither always nor never calls the tool.

For environment tasks (rows naming `env: {server, task_id}`) the figures are instead `success` (the environment
finished the episode with a positive score), `turns_mean`, `well_formed` (share of turns whose call parsed) and
`errors`; the start is usable when the sampled success rate is neither 0 nor 1 (GRPO's groups must disagree).

Left out: judging tasks other than those the scripted policies know (call accuracy is then not measured).
"""
from __future__ import annotations

import logging
from typing import Any

from rlfactory.data.tasks import load_tasks
from rlfactory.envs.protocol import task_env
from rlfactory.models.vision import vision_of
from rlfactory.recipe.schema import Recipe
from rlfactory.recipe.sft import SFTCheckConfig
from rlfactory.rewards.env import env_success
from rlfactory.rewards.qa import extract_answer
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.warmup.demos import calculator_policy

logger = logging.getLogger(__name__)


def _answer(text: str) -> str:
    return extract_answer(text).strip()


def score_trajectories(trajs: list[Any], tool_name: str = "calculator") -> dict[str, float]:
    """The check's figures for finished trajectories (see the module docstring); `tool_name`: the tool the
    demonstrations called."""
    n = len(trajs)
    calls = [t for t in trajs if t.tool_calls]
    right_calls = 0
    for t in calls:
        try:
            expected = calculator_policy(t.task, tool_name)
        except ValueError:
            continue
        first = t.tool_calls[0]
        right_calls += first.name == expected["name"] and (first.arguments or {}) == expected["arguments"]
    ok_calls = [t for t in calls if not t.tool_calls[0].is_error]
    copies = sum(_answer(t.completion) == (t.tool_calls[0].result.strip() or str(t.task.get("answer", "")).strip())
                 for t in ok_calls)
    correct = sum(_answer(t.completion) == str(t.task.get("answer", "")).strip() for t in trajs)
    return {
        "trajectories": n,
        "call_rate": len(calls) / n if n else 0.0,
        "call_accuracy": right_calls / len(calls) if calls else 0.0,
        "copy_accuracy": copies / len(ok_calls) if ok_calls else 0.0,
        "reward": correct / n if n else 0.0,
        "errors": sum(t.finish_reason == "error" for t in trajs),
    }


def score_env_trajectories(trajs: list[Any]) -> dict[str, float]:
    """The check's figures for environment episodes."""
    n = len(trajs)
    turns = sum(t.num_turns for t in trajs)
    calls = sum(len(t.tool_calls) for t in trajs)
    return {
        "trajectories": n,
        # a positive final score: BabyAI scores a success below 1 (fewer steps, more score), TextCraft scores it 1
        "success": sum(env_success(t, threshold=1e-9) for t in trajs) / n if n else 0.0,
        "turns_mean": turns / n if n else 0.0,
        "well_formed": min(1.0, calls / turns) if turns else 0.0,
        "errors": sum(t.finish_reason == "error" for t in trajs),
    }


def _env_problems(figures: dict[str, Any]) -> list[str]:
    if figures["success"] in (0.0, 1.0):
        return [f"success rate {figures['success']:.2f}: GRPO groups would all agree"]
    return []


def check_tasks_file(recipe: Recipe, cfg: SFTCheckConfig) -> str | None:
    """The task file the check rolls out: the recipe's training or validation file, by `cfg.split`."""
    return recipe.data.train_file if cfg.split == "train" else recipe.data.val_file


async def usable_start_check(recipe: Recipe, cfg: SFTCheckConfig, model: Any, tokenizer: Any, manager: Any,
                             seed: int = 0, tool_name: str = "calculator") -> dict[str, Any]:
    """Roll out `cfg.tasks` validation tasks (one sample each, at `cfg.temperature`) and judge the start."""
    tasks = load_tasks(check_tasks_file(recipe, cfg), recipe.data, limit=cfg.tasks)
    chat = ChatFormat.for_rollout(tokenizer, manager.openai_schemas(), recipe.rollout)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=chat.stop_token_ids,
                      tokenizer=tokenizer, device=next(model.parameters()).device, vision=vision_of(tokenizer))
    try:
        loop = AgentLoop(engine, manager, chat, recipe.rollout)
        sampling = loop.default_sampling().model_copy(update={"temperature": cfg.temperature})
        trajs, _ = await loop.run_batch(tasks, samples_per_prompt=1, seed=seed, sampling=sampling)
    finally:
        await engine.close()
    if any(task_env(t) for t in tasks):
        figures = score_env_trajectories(trajs)
        figures["split"] = cfg.split
        figures["problems"] = _env_problems(figures)
        figures["usable"] = not figures["problems"]
        (logger.warning if figures["problems"] else logger.info)(
            "the warm-up %s a usable start for GRPO: success %.2f, %.1f turns per episode%s",
            "is NOT" if figures["problems"] else "is", figures["success"], figures["turns_mean"],
            f" ({'; '.join(figures['problems'])})" if figures["problems"] else "")
        return figures
    figures = score_trajectories(trajs, tool_name)
    problems = []
    if figures["call_accuracy"] < cfg.min_call_accuracy:
        problems.append(f"call accuracy {figures['call_accuracy']:.2f} < {cfg.min_call_accuracy}")
    if figures["copy_accuracy"] < cfg.min_copy_accuracy:
        problems.append(f"copy accuracy {figures['copy_accuracy']:.2f} < {cfg.min_copy_accuracy}")
    if figures["call_rate"] in (0.0, 1.0):
        problems.append(f"call rate {figures['call_rate']:.2f}: GRPO groups would all agree on calling")
    figures["usable"] = not problems
    figures["problems"] = problems
    if problems:
        logger.warning("the warm-up is NOT a usable start for GRPO: %s (train longer or change the seed)",
                       "; ".join(problems))
    else:
        logger.info("the warm-up is a usable start for GRPO: call rate %.2f, call accuracy %.2f, copy accuracy "
                    "%.2f, reward %.2f", figures["call_rate"], figures["call_accuracy"], figures["copy_accuracy"],
                    figures["reward"])
    return figures
