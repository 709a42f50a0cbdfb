"""`GenerationEngine`: token ids in, token ids (+ logprobs) out. The only interface the AgentLoop needs.

Implementations: `hf.HFEngine` (transformers, dynamic batching) and `vllm.VLLMEngine` (vLLM async
engine, lazily imported). Engines never see text the policy produced as text: no decode-and-re-encode here.
A vision-language policy's requests also carry `images=` (the `ToolImage`s of the prompt's placeholder runs, in
order); the AgentLoop passes it only when a trajectory has images. `HFEngine` and `VLLMEngine` take it (vLLM only
where it can load the model: preflight refuses a VL policy on vLLM before start-up otherwise, and on verl always).
"""
from __future__ import annotations

from typing import Any, Literal, Mapping, Protocol, runtime_checkable

from pydantic import BaseModel, Field


class SamplingParams(BaseModel):
    """How to sample one continuation."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 = disabled."""
    max_new_tokens: int = 256
    stop_token_ids: list[int] = Field(default_factory=list)
    """Generation stops after emitting any of these (the stop token is included in the output)."""
    stop_strings: list[str] = Field(default_factory=list)
    """Generation stops once the decoded continuation ends with one of these (tokens kept as generated)."""
    seed: int | None = None


class GenerationOutput(BaseModel):
    token_ids: list[int]
    logprobs: list[float] | None = None
    """Logprob of each generated token under the sampling distribution's model (temperature-scaled)."""
    finish_reason: Literal["stop", "length", "abort"] = "stop"
    versions: list[int] | None = None
    """The policy version (optimizer steps taken) whose weights sampled each token; None when the engine does not
    track versions. Weights may change between two tokens of one request (asynchronous training)."""


@runtime_checkable
class GenerationEngine(Protocol):
    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> GenerationOutput: ...

    async def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load new policy weights (after an optimizer step)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class WeightSource(Protocol):
    """Pushed policy weights an engine follows while it generates: an asynchronous run's trainer publishes a new
    version after each optimizer step (the asynchronous wing's shared weights implement this)."""

    @property
    def version(self) -> int:
        """The newest published version (optimizer steps taken)."""
        ...

    def load_into(self, model: Any, have: int) -> int | None:
        """Copy the weights into `model`'s trainable parameters when newer than version `have`; the version
        loaded, or None when there was nothing newer."""
        ...

    def read(self, have: int) -> tuple[int, dict[str, Any]] | None:
        """(version, name -> CPU tensor copy) when newer than `have`, else None: for engines that load weights
        their own way (vLLM)."""
        ...


@runtime_checkable
class FollowsWeights(Protocol):
    """The weight-push contract: what an engine must do to be the generator of an asynchronous run."""

    policy_version: int
    """The version of the weights loaded now."""
    weight_loads: int
    """Pushed versions loaded so far."""
    weight_load_s: float
    """Seconds spent loading them."""

    async def follow_weights(self, source: WeightSource) -> None:
        """Load `source`'s current version now, and from then on each newer version between two decode steps.
        Requests in flight continue under the new weights with the keys/values they have (a partial rollout), and
        every sampled token is stamped (`GenerationOutput.versions`) with the version whose weights sampled it."""
        ...


ENGINE_COUNTERS = {"busy_s": "engine_busy_s", "prefill_s": "engine_prefill_s", "decode_steps": "engine_decode_steps",
                   "prefill_batches": "engine_prefills"}
"""The engine's cumulative counters (`EngineStats` fields) logged per step as `perf/<name>` (sync) or
`async/<name>` (the generator's engine, async): compute seconds (of which prefills), decode steps and prefill
forward passes. Fewer decode steps for the same tokens means larger batches: on a small model a step costs about
the same at 8 rows as at 64."""


def engine_counters(engine: Any) -> dict[str, float]:
    """The engine's cumulative counters under their metric names (zeros for an engine without `stats`)."""
    stats = getattr(engine, "stats", None)
    return {name: float(getattr(stats, field, 0.0)) for field, name in ENGINE_COUNTERS.items()}
