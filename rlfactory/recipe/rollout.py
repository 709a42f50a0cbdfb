"""The `rollout:` section of a recipe: engine, sampling, limits, horizon schedule.

Read by rlfactory/rollout/; `schema.py` assembles it into the Recipe.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from rlfactory.recipe.section import Section


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature for training rollouts (0 = greedy)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling; -1 disables it."""
    max_new_tokens_per_turn: int = Field(512, ge=1)
    """Most tokens the policy may generate in one assistant turn."""


class FixedHorizon(Section):
    type: Literal["fixed"] = "fixed"
    """A constant horizon."""
    turns: int = Field(4, ge=1)
    """Maximum assistant turns per trajectory."""


class ScalingInterHorizon(Section):
    type: Literal["scaling_inter"] = "scaling_inter"
    """AgentGym-RL's ScalingInter-RL: the horizon grows in stages as training goes on."""
    horizons: list[int] = Field(min_length=1)
    """Horizon (max assistant turns) of each stage, e.g. [10, 20, 30]."""
    interval_steps: int = Field(ge=1)
    """Training steps per stage: the stage advances every `interval_steps` steps, then stays on the last."""

    @model_validator(mode="after")
    def _positive(self) -> "ScalingInterHorizon":
        if any(h < 1 for h in self.horizons):
            raise ValueError("every entry of horizons must be >= 1")
        return self


HorizonConfig = Annotated[Union[FixedHorizon, ScalingInterHorizon], Field(discriminator="type")]


class BranchingConfig(Section):
    """`rollout.branching`: a training group grown as a tree (rlfactory/rollout/agent_loop.py, `run_group`)."""

    width: int = Field(1, ge=1)
    """Branches per root: `samples_per_prompt / width` roots play the first `at_turn` turns, then each root's episode
    is forked (the environment servers' `fork`) into `width` branches that play on from the same state. 1 = no
    branching: every sample starts from the task's first observation."""
    at_turn: int = Field(1, ge=1)
    """Assistant turns (with their tool results) the roots play before they branch (at most, with `uncertain`)."""
    when: Literal["at_turn", "uncertain"] = "at_turn"
    """`at_turn`: every root branches after `at_turn` turns. `uncertain`: a root branches after the first turn
    (before `at_turn`) whose sampled tokens surprised the policy: mean -logprob >= `uncertainty` (the surprisal of
    sampled tokens estimates the policy's entropy there), else at `at_turn`."""
    uncertainty: float = Field(1.0, ge=0.0)
    """`when: uncertain`: the mean surprisal (nats per token) of a turn that makes its root branch after it."""

    def roots(self, samples: int, of: str = "the group's samples") -> int:
        """How many roots a group of `samples` has (each branches into `width` of them). ValueError, naming `of` (where
        the count comes from) and the fix, when `width` does not divide it: the one place that rule is written."""
        if samples % self.width:
            raise ValueError(f"rollout.branching.width ({self.width}) must divide {of}: each root branches into "
                             f"`width` samples of the group; use a multiple of {self.width}, or "
                             f"rollout.branching.width: 1")
        return samples // self.width


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: `hf` (transformers, CPU or one GPU) or `vllm` (needs the gpu or cpu-vllm extra)."""
    vllm_gpu_memory_utilization: float = Field(0.4, gt=0.0, le=1.0)
    """`vllm` engine of a local run on a GPU: the share of the GPU's memory vLLM takes for its weights and KV cache
    (the trainer shares the GPU and uses the rest)."""
    prefix_cache: bool = True
    """`hf` engine: run a group's shared prompt through the model once, and keep each finished turn's keys/values
    so the conversation's next turn prefills only the tool response (the same maths up to float summation order;
    vLLM has its own prefix caching). false = prefill every request's whole prompt."""
    samples_per_prompt: int = Field(8, ge=1)
    """Trajectories sampled per prompt (the GRPO group size)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling settings for training rollouts."""
    horizon: HorizonConfig = Field(default_factory=FixedHorizon)
    """Maximum assistant turns per trajectory: `fixed` or `scaling_inter`."""
    max_tool_calls_per_turn: int = Field(4, ge=1)
    """Tool calls beyond this in one turn are not run; the model is told so."""
    stop_at_tool_call_end: bool = False
    """End each assistant turn at its first `</tool_call>` (a stop token; the chat template's `<|im_end|>` then
    closes the turn as part of the tool response, not trained on). With one call a turn, the policy cannot write on
    past its call to the token cap, which nothing in the reward discourages otherwise. Rollouts and evaluation."""
    max_response_tokens: int = Field(2048, ge=1)
    """Total token budget of the response (policy + tool tokens) per trajectory."""
    max_context_tokens: int = Field(4096, ge=16)
    """Prompt + response never exceed this (set it to the model's maximum or below)."""
    tool_response_max_tokens: int = Field(512, ge=1)
    """Each tool response is truncated to this many tokens."""
    tool_error_max_tokens: int = Field(64, ge=1)
    """An error's text (a failed call, a bad argument, a server being restarted) keeps at least this many tokens,
    whatever `tool_response_max_tokens` is, so the model can read what went wrong."""
    tool_response_truncation: Literal["left", "right", "middle"] = "right"
    """Which part of an over-long tool response is cut: `right` keeps the start, `left` keeps the end, `middle` both."""
    enable_thinking: bool = False
    """Qwen3's thinking switch in the chat template."""
    system_prompt: str | None = None
    """Optional system prompt placed before the tool descriptions."""
    keep_unseen_images: bool = False
    """Keep the images a reset or a tool returned that the policy was not shown (a text-only policy reads a note
    instead: a web server's `--view pixels` screenshots, say) on the trajectory (`unseen_images`), so the transcript
    viewer and the dashboard show them at their turns. The policy's tokens are unchanged; the images cost memory
    until the step ends, and transcript bytes within `trainer.log.transcript_image_bytes`."""
    max_concurrent_trajectories: int = Field(256, ge=1)
    """Upper bound on trajectories in flight at once; lowered to the fewest episodes an environment server of the
    recipe holds open (its `--max-episodes`, rlfactory/rollout/gate.py)."""
    branching: BranchingConfig = Field(default_factory=BranchingConfig)
    """Training groups as trees: roots that branch from forked environment states (local engine; `width: 1`, the
    default, is off). docs/algorithms.md, "Branched groups"."""
