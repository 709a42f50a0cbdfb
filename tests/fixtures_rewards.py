"""Fixture for reward and scoring tests: a small builder of token-exact trajectories (`make_traj`)."""
from __future__ import annotations

import pytest

from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan


def build_trajectory(turn_texts: list[str], *, answer=None, calls=(), tid: str = "t0", assistant_len: int = 3,
                     tool_len: int = 2, task: dict | None = None) -> Trajectory:
    """Assistant turns of `assistant_len` policy tokens, separated by tool turns of `tool_len` masked tokens."""
    turns, mask, pos = [], [], 0
    for i, text in enumerate(turn_texts):
        turns.append(TurnSpan(role="assistant", start=pos, end=pos + assistant_len, text=text))
        mask += [1] * assistant_len
        pos += assistant_len
        if i < len(turn_texts) - 1:
            turns.append(TurnSpan(role="tool", start=pos, end=pos + tool_len, text="<tool_response>r</tool_response>"))
            mask += [0] * tool_len
            pos += tool_len
    row = dict(task) if task is not None else {"prompt": "What is 6*7?", "answer": answer}
    return Trajectory(id=tid, prompt_ids=[1, 2], response_ids=list(range(100, 100 + pos)), loss_mask=mask,
                      logprobs=[0.0] * pos, turns=turns, tool_calls=[ToolCallRecord(**c) for c in calls],
                      task=row, messages=[{"role": "user", "content": row.get("prompt", "")}])


@pytest.fixture
def make_traj():
    return build_trajectory
