"""`Trajectory`: the one record of a finished rollout, shared by both engines, rewards, training and the viewer.

Conversion to verl's DataProto happens only at the verl boundary (`rlfactory/verl/`), not here.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from rlfactory.tools.types import ToolImage

FinishReason = Literal[
    "stop",  # the policy ended its turn without a tool call (its final answer)
    "max_turns",  # the horizon (assistant turns) was reached
    "token_budget",  # the total response-token budget ran out
    "context_length",  # the next turn would not fit in the model's context
    "env_done",  # an environment server said the episode is over (`done: true` in a tool result)
    "error",  # something failed; see `error`
]


class TurnSpan(BaseModel):
    """A contiguous span of `response_ids`: one assistant turn (policy tokens) or one tool/env turn."""

    role: Literal["assistant", "tool"]
    start: int
    """Index into response_ids (inclusive)."""
    end: int
    """Index into response_ids (exclusive)."""
    text: str = ""
    """Decoded text of the span, for viewing and rewards only (never re-encoded)."""


class ToolCallRecord(BaseModel):
    """One tool call made during the rollout, with its outcome."""

    turn: int
    """Index of the assistant turn that emitted the call."""
    name: str
    arguments: dict[str, Any] | None = None
    result: str = ""
    is_error: bool = False
    error_kind: str | None = None
    latency_s: float = 0.0
    cached: bool = False
    cache_origin: str | None = None
    """For a cache hit: which ToolManager stored the result (see `ToolResult.cache_origin`)."""
    images: list[str] = Field(default_factory=list)
    """The sha256 of each image the result held, in order (the images themselves: `Trajectory.images`)."""
    structured: dict[str, Any] | None = None
    """The tool result's structured content, if any (environment servers put `reward`, `score`, `done` here)."""
    infra: bool = False
    """It failed for infrastructure reasons (`ToolResult.infra`): the trajectory is kept out of the loss."""
    retried: bool = False
    """It was run again after its server came back (idempotent tools)."""


class SavedImage(ToolImage):
    """An image a trajectory keeps: the bytes (base64, as the tool or the task gave them) and where it came from."""

    turn: int | None = None
    """The assistant turn whose tool call returned it; None for an image of the prompt (the task's, a reset's)."""
    tool: str | None = None
    """The tool that returned it; None for the prompt's."""
    omitted: str | None = None
    """Saved transcripts only (report/transcript_images.py): why `data_b64` is empty there: `repeat` (an earlier
    record of the trajectory holds the same sha256's bytes) or the note of the transcript's image cap. Always None in
    a trajectory the loop made."""


class TrajectoryImage(SavedImage):
    """An image the policy saw, and where its placeholder tokens sit. The token arrays hold only the `<|image_pad|>`
    ids; the pixels live here, once."""

    start: int
    """Index of its first placeholder token in prompt_ids + response_ids."""
    tokens: int
    """How many placeholder tokens it takes (its patch grid / the merge size squared)."""


class Branch(BaseModel):
    """Where a trajectory sits in its group's tree (`rollout.branching`): the first `prefix_tokens` of its response
    (`prefix_turns` assistant turns and their tool results) are its root's, generated once and shared by the root's
    branches; branch 0 goes on in the root's own episodes, the others in forks of them."""

    root: int
    child: int
    prefix_tokens: int
    prefix_turns: int

    @property
    def trains_prefix(self) -> bool:
        """Whether the shared prefix is trained in this trajectory (branch 0: once per root, not once per branch)."""
        return self.child == 0


class Trajectory(BaseModel):
    """A finished multi-turn rollout, token-exact.

    Invariants: len(response_ids) == len(loss_mask) == len(logprobs) (== len(policy_versions) when recorded);
    loss_mask is 1 exactly on tokens the policy generated and 0 on tool/env/template tokens; the spans in `turns`
    tile response_ids in order.
    """

    id: str
    task_id: str | None = None
    sample_index: int = 0
    group_id: str | None = None
    """Trajectories sampled from the same prompt share a group id (GRPO groups)."""
    prompt_ids: list[int]
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    """Behaviour-policy logprob of each response token (0.0 where loss_mask is 0)."""
    policy_versions: list[int] = Field(default_factory=list)
    """The policy version that sampled each response token (-1 where loss_mask is 0): non-decreasing over a
    trajectory's policy tokens, several versions in one trajectory when weights changed mid-rollout (asynchronous
    training). Empty for trajectories made before versions were recorded."""
    turns: list[TurnSpan] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    finish_reason: FinishReason = "stop"
    error: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The conversation as chat messages (for rewards, judges and the viewer)."""
    task: dict[str, Any] = Field(default_factory=dict)
    """The data row this rollout came from (prompt, answer, metadata)."""
    horizon: int | None = None
    reward: float | None = None
    reward_components: dict[str, float] = Field(default_factory=dict)
    reward_failed: bool = False
    step_rewards: list[float] | None = None
    """Optional per-assistant-turn rewards (process rewards), placed on each turn's last token."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds spent: generate_s, tools_s, total_s."""
    branch: Branch | None = None
    """Its place in a branched group's tree; None in a flat group."""
    images: list[TrajectoryImage] = Field(default_factory=list)
    """The images the policy saw (a vision-language policy's prompt and tool results), in token order: what the
    engine and the update turn into pixel inputs, and what saved trajectories show."""
    unseen_images: list[SavedImage] = Field(default_factory=list)
    """With `rollout.keep_unseen_images`: the images a reset or a tool returned that the policy was not shown (a
    text-only policy read a note for each), kept for the transcript viewer only; never pixel inputs."""

    @property
    def group_key(self) -> str:
        """The GRPO group it is compared within: its `group_id`, else its task's id (advantages and baselines group
        by this, grpo.py and the credit estimators alike)."""
        return self.group_id if self.group_id is not None else f"{self.task_id}"

    @property
    def infra_failed(self) -> bool:
        """Hit by an infrastructure failure (a tool call that failed for one, or a rollout that raised): no training
        signal, so the trainer keeps it out of the loss and of its group's statistics."""
        return self.finish_reason == "error" or any(c.infra for c in self.tool_calls)

    @property
    def num_turns(self) -> int:
        return sum(1 for t in self.turns if t.role == "assistant")

    @property
    def completion(self) -> str:
        """The assistant's text over all turns (what most reward functions score)."""
        return "".join(t.text for t in self.turns if t.role == "assistant")

    @property
    def final_response(self) -> str:
        """The text of the last assistant turn."""
        for t in reversed(self.turns):
            if t.role == "assistant":
                return t.text
        return ""


def groups_of(trajectories: list[Trajectory]) -> dict[str, list[Trajectory]]:
    """A batch's GRPO groups, keyed by `Trajectory.group_key`, in the order they first appear."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_key, []).append(t)
    return groups
