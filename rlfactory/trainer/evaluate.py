"""`rlfactory eval`: mean reward and pass@k of the recipe's model (or a checkpoint) on the validation set, with
the trajectories saved as transcripts. Uses the local trainer's rollout side and its `evaluate`, so evaluation
during training and after it are the same code. Left out: evaluation on the verl engine.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from rlfactory.errors import RLFactoryError
from rlfactory.recipe.schema import Recipe
from rlfactory.trainer.checkpoint import is_peft, model_dir_of
from rlfactory.trainer.loop import LocalTrainer
from rlfactory.trainer.wiring import open_rollout_side


async def _evaluate_async(recipe: Recipe, checkpoint: str | Path | None, output_dir: str | Path | None) -> dict:
    src = model_dir_of(checkpoint) if checkpoint is not None else None
    full_model = src is not None and src.name != "adapter"
    trainer = LocalTrainer(recipe, progress=False, model_path=src if full_model else None, for_eval=True)
    if output_dir is not None:
        trainer.out = Path(output_dir).resolve()
    trainer.out.mkdir(parents=True, exist_ok=True)
    if src is not None and not full_model:
        if not is_peft(trainer.model):
            raise RLFactoryError(f"{checkpoint} holds a LoRA adapter but the recipe has model.lora.enabled: false; "
                                 f"pass --set model.lora.enabled=true")
        from peft import set_peft_model_state_dict  # only for LoRA checkpoints: importing peft costs seconds

        set_peft_model_state_dict(trainer.model, load_file(str(src / "adapter_model.safetensors")))
    async with open_rollout_side(recipe, trainer.model, trainer.tokenizer, trainer.device, trainer.out) as side:
        res = await trainer.evaluate(side, tag="eval")
    res["output_dir"] = str(trainer.out / "eval")
    return res


def evaluate_local(recipe: Recipe, checkpoint: str | Path | None = None,
                   output_dir: str | Path | None = None) -> dict[str, Any]:
    """`rlfactory eval`: mean reward and pass@k of a model/checkpoint on the recipe's validation set."""
    return asyncio.run(_evaluate_async(recipe, checkpoint, output_dir))
