"""A generation engine that replays given assistant turns as token ids, one turn per call, whatever the prompt: for
tests that check a demonstration replayed through the real AgentLoop gives the SFT encoding token for token.

Left out: sampling, logprobs (None), anything a model does.
"""
from __future__ import annotations

from typing import Any

from rlfactory.rollout.engines.protocol import GenerationOutput


class ReplayEngine:
    """Emits `turns[0]`, then `turns[1]`, ... (a list of token-id lists); a VL loop's images are accepted and unused."""

    def __init__(self, turns: list[list[int]]):
        self.turns = list(turns)

    async def generate(self, prompt_ids: list[int], sampling: Any, request_id: str | None = None,
                       **images: Any) -> GenerationOutput:
        return GenerationOutput(token_ids=self.turns.pop(0), logprobs=None, finish_reason="stop")

    async def update_weights(self, state_dict: Any) -> None:
        pass

    async def close(self) -> None:
        pass
