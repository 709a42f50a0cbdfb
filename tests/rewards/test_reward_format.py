"""rewards/format.py: tool-call / answer / thinking format checks and tool-use shaping."""
from __future__ import annotations

from rlfactory.rewards.format import (
    answer_tag_present,
    failed_tool_call_penalty,
    thinking_well_formed,
    too_many_tool_calls_penalty,
    tool_calls_well_formed,
    tool_success_per_turn,
    tool_use_required,
)
from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory, TurnSpan


def _traj(turn_texts: list[str], calls: list[ToolCallRecord] = ()) -> Trajectory:
    turns, pos = [], 0
    for i, text in enumerate(turn_texts):
        turns.append(TurnSpan(role="assistant", start=pos, end=pos + 2, text=text))
        pos += 2
        if i < len(turn_texts) - 1:
            turns.append(TurnSpan(role="tool", start=pos, end=pos + 3, text="<tool_response>r</tool_response>"))
            pos += 3
    return Trajectory(id="t", prompt_ids=[1], response_ids=list(range(pos)), loss_mask=[1] * pos,
                      logprobs=[0.0] * pos, turns=turns, tool_calls=list(calls))


def test_tool_calls_well_formed():
    good = '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'
    string_args = '<tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>'
    bad_json = "<tool_call>{name: calc}</tool_call>"
    no_name = '<tool_call>{"arguments": {}}</tool_call>'
    list_args = '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>'
    assert tool_calls_well_formed("no calls at all") == 1.0
    assert tool_calls_well_formed(good + string_args) == 1.0
    assert tool_calls_well_formed(good + bad_json) == 0.5
    assert tool_calls_well_formed(no_name + list_args) == 0.0
    assert tool_calls_well_formed(good + '<tool_call>{"name": "calc"') == 0.5  # unclosed counts as malformed


def test_answer_tag_present():
    assert answer_tag_present("so <answer>4</answer>") == 1.0
    assert answer_tag_present("<answer>  </answer>") == 0.0
    assert answer_tag_present("<answer>4") == 0.0
    assert answer_tag_present("") == 0.0


def test_thinking_well_formed():
    assert thinking_well_formed(_traj(["<think>a</think>x", "  <think>b</think>y"])) == 1.0
    assert thinking_well_formed(_traj(["x <think>a</think>", "<think>a"])) == 0.0
    assert thinking_well_formed(_traj(["</think><think>", "<think>a</think><think>b</think>"])) == 0.0
    assert thinking_well_formed(_traj(["plain", "<think>a</think>b"])) == 1.0
    assert thinking_well_formed(_traj(["plain", "<think>a</think>b"]), required=True) == 0.5


def test_penalties_and_bonuses():
    ok = ToolCallRecord(turn=0, name="calc", result="3")
    err = ToolCallRecord(turn=0, name="calc", is_error=True, error_kind="timeout")
    assert failed_tool_call_penalty([ok, err, err], penalty_per_call=-0.5) == -1.0
    assert failed_tool_call_penalty([ok]) == 0.0
    assert too_many_tool_calls_penalty([ok] * 6, max_calls=4, penalty_per_call=-0.25) == -0.5
    assert too_many_tool_calls_penalty([ok] * 4, max_calls=4) == 0.0
    required = {"prompt": "q", "metadata": {"requires_tool": True}}
    assert tool_use_required([], required, penalty=-1.0) == -1.0
    assert tool_use_required([ok], required, bonus=0.2) == 0.2
    assert tool_use_required([err], required, bonus=0.2) == 0.0
    assert tool_use_required([], {"prompt": "q"}) == 0.0
    assert tool_use_required([], {"prompt": "q", "requires_tool": True}) == -1.0


def test_tool_success_per_turn_is_one_score_per_assistant_turn():
    calls = [ToolCallRecord(turn=0, name="a"), ToolCallRecord(turn=1, name="a"),
             ToolCallRecord(turn=1, name="b", is_error=True)]
    assert tool_success_per_turn(_traj(["c", "c", "answer"], calls)) == [1.0, -1.0, 0.0]
