"""Plain records that cross the tool layer's boundary: a tool's spec, a call, a result.

Nothing here imports mcp: the adapter (`mcp_client.py`) converts SDK objects into these.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

HEALTH_URI = "rlfactory://health"
"""A server may publish this resource (JSON `{"ok": bool, "detail": str}`) to say whether what it fronts is usable
(e.g. the AgentGym bridge's upstream HTTP server); `rlfactory setup-mcp` reads it and fails the server when not ok.
A resource, not a tool, so the policy never sees it."""
INFRA_KEY = "rlfactory/infra"
"""A server marks an error result as an infrastructure failure (not the tool's answer to these arguments, e.g. the
AgentGym server behind the bridge is unreachable) with structured content `{INFRA_KEY: true}`; the client adapter
turns it into `ToolResult.infra`, so the trainer keeps the trajectory out of the loss."""


LOOP_ONLY_META = "rlfactory/loop_only"
"""A tool's `_meta` key saying the rollout loop calls it and the policy must not see it (`ToolSpec.loop_only`)."""
MAX_EPISODES_META = "rlfactory/max_episodes"
"""A tool's `_meta` key: how many episodes its environment server holds open at once (`ToolSpec.max_episodes`)."""


class ToolSpec(BaseModel):
    """A tool as the policy sees it. `name` is what the model must call: the bare tool name when unique across
    servers, else the qualified `server.tool`."""

    name: str
    server: str
    tool: str
    """The tool's own name on its server."""
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    read_only: bool = False
    idempotent: bool = False
    loop_only: bool = False
    """The rollout loop calls it, the policy never sees it (`_meta["rlfactory/loop_only"]: true` in the server's
    tool list; an environment's `fork`)."""
    max_episodes: int | None = None
    """How many episodes the tool's environment server holds open at once (`_meta["rlfactory/max_episodes"]`);
    rollouts keep no more trajectories in flight than that (rlfactory/rollout/gate.py)."""

    def to_openai(self) -> dict[str, Any]:
        """The function-calling schema that chat templates (Qwen3, Hermes) render into the system turn."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }


class ToolCall(BaseModel):
    """One call the policy asked for."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None
    """Optional caller id (e.g. trajectory id + index), carried into the result for bookkeeping."""


class ToolImage(BaseModel):
    """One image a tool returned (MCP `ImageContent`), checked by `images.decode_image`: a format PIL reads, within
    the server's `max_image_bytes` / `max_image_pixels`. The bytes stay base64 (as MCP sends them), so a result
    round-trips through JSON (the cache, saved trajectories) unchanged."""

    mime_type: str
    """The format PIL found in the bytes (e.g. image/png), whatever the server claimed."""
    data_b64: str
    width: int
    height: int
    sha256: str
    """Of the decoded bytes: names the image in trajectories and in the engine's prefix cache."""

    @property
    def num_bytes(self) -> int:
        """The decoded size (from the base64 length, without decoding)."""
        pad = self.data_b64[-2:].count("=")
        return len(self.data_b64) * 3 // 4 - pad


class ToolResult(BaseModel):
    """A normalised tool result. Failures are results too (`is_error`), never exceptions."""

    name: str
    text: str
    is_error: bool = False
    error_kind: str | None = None
    """None on success; else one of: parse, unknown_tool, bad_arguments, timeout, server_error, tool_error."""
    infra: bool = False
    """The failure came from the infrastructure (the server was lost under the call, is down, or did not come back
    from a restart in time), not from the tool on these arguments: the trainer keeps such trajectories out of the
    loss. A call that times out is the tool's own behaviour (feedback), not an infrastructure failure."""
    retried: bool = False
    """The call was run again after its server was restarted (idempotent tools only)."""
    latency_s: float = 0.0
    cached: bool = False
    server: str | None = None
    id: str | None = None
    structured: dict[str, Any] | None = None
    images: list[ToolImage] = Field(default_factory=list)
    """The images the tool returned, in order (their place in the text is not kept: the chat format renders them
    after the text, as Qwen-VL's templates do for a message's image parts)."""
    cache_origin: str | None = None
    """Which ToolManager stored this result in the cache (its `origin`, e.g. a Ray node id); None when unlabelled.
    On a hit it names the writer, so a run can tell hits that crossed machines."""
