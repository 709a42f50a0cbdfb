"""Evaluation on the local engine: mean reward and pass@k on the validation tasks, with the trajectories saved as
transcripts (`evaluate_on`). Evaluation during training (`trainer.eval_every_steps`) and `rlfactory eval` of a model
or checkpoint (`evaluate_local`) are the same code. Left out: evaluation on the verl engine.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from rlfactory.data.seeds import mix_seed
from rlfactory.data.tasks import load_tasks
from rlfactory.errors import RLFactoryError
from rlfactory.recipe.schema import Recipe
from rlfactory.report.transcripts import save_transcripts
from rlfactory.reward import pass_at_k
from rlfactory.rollout.engines.protocol import SamplingParams
from rlfactory.rollout.horizon import max_horizon
from rlfactory.rollout_side import RolloutSide, open_rollout_side
from rlfactory.trainer.checkpoint import is_peft, model_dir_of
from rlfactory.trainer.policy import Policy


async def evaluate_on(side: RolloutSide, recipe: Recipe, tasks: list[dict[str, Any]], out: Path, *,
                      tag: str = "eval", k: int | None = None) -> dict[str, Any]:
    """Mean reward and pass@k of `side`'s current weights on `tasks` (`trainer.eval_samples_per_prompt` samples
    each at `trainer.eval_temperature`, the longest horizon); transcripts and figures saved under `out/eval`."""
    t = recipe.trainer
    k = k or t.eval_samples_per_prompt
    sampling: SamplingParams = side.loop.default_sampling().model_copy(update={"temperature": t.eval_temperature})
    trajs, roll_m = await side.loop.run_batch(tasks, k, max_horizon(recipe.rollout.horizon),
                                              seed=mix_seed(t.seed, 10**6, 3), sampling=sampling)
    rew_m = await side.rewards.score(trajs)
    res = pass_at_k(trajs, k, t.eval_success_threshold)
    res.update({"reward/mean": rew_m["reward/mean"], "tasks": len(tasks), "k": k,
                "rollout/tool_calls_mean": roll_m.get("rollout/tool_calls_mean", 0.0),
                "rollout/errors": roll_m.get("rollout/errors", 0)})
    save_transcripts(out / "eval" / f"{tag}.jsonl", trajs, t.log.transcript_image_bytes)
    (out / "eval" / f"{tag}.json").write_text(json.dumps(res, indent=1))
    return res


async def _evaluate_async(recipe: Recipe, checkpoint: str | Path | None, output_dir: str | Path | None) -> dict:
    src = model_dir_of(checkpoint) if checkpoint is not None else None
    full_model = src is not None and src.name != "adapter"
    policy = Policy.load(recipe, model_path=src if full_model else None, for_eval=True)
    out = Path(output_dir if output_dir is not None else recipe.trainer.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if src is not None and not full_model:
        if not is_peft(policy.model):
            raise RLFactoryError(f"{checkpoint} holds a LoRA adapter but the recipe has model.lora.enabled: false; "
                                 f"pass --set model.lora.enabled=true")
        from peft import set_peft_model_state_dict  # only for LoRA checkpoints: importing peft costs seconds

        set_peft_model_state_dict(policy.model, load_file(str(src / "adapter_model.safetensors")))
    r = recipe
    val_tasks = load_tasks(r.data.val_file, r.data, r.data.max_val_tasks) if r.data.val_file else []
    async with open_rollout_side(recipe, policy.model, policy.tokenizer, policy.device, out) as side:
        res = await evaluate_on(side, recipe, val_tasks, out, tag="eval")
    res["output_dir"] = str(out / "eval")
    return res


def evaluate_local(recipe: Recipe, checkpoint: str | Path | None = None,
                   output_dir: str | Path | None = None) -> dict[str, Any]:
    """`rlfactory eval`: mean reward and pass@k of a model/checkpoint on the recipe's validation set."""
    return asyncio.run(_evaluate_async(recipe, checkpoint, output_dir))
