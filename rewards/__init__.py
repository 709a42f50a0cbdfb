"""Reward functions users read, use by name in a recipe, and copy as a starting point for their own.

Each is a plain function whose parameter names say what it needs (`completion`, `answer`, `tool_calls`, `task`,
`trajectory`, ...; see rlfactory/reward.py) and whose keyword arguments come from the recipe's `kwargs`:

    rewards:
      functions:
        - {function: exact_match, weight: 1.0}
        - {function: f1, weight: 0}                    # logged as reward/f1, not trained on
        - {function: failed_tool_call_penalty, weight: 1.0, kwargs: {penalty_per_call: -0.2}}
        - {function: my_rewards.py:brevity, weight: 0.1}   # your own, next to the recipe

qa.py: exact match, token F1, containment. format.py: tool-call/answer/thinking format and tool-use shaping.
judge.py: an LLM judge over any OpenAI-compatible endpoint.
"""
from rlfactory.rewards.format import (
    answer_tag_present,
    failed_tool_call_penalty,
    thinking_well_formed,
    too_many_tool_calls_penalty,
    tool_calls_well_formed,
    tool_success_per_turn,
    tool_use_required,
)
from rlfactory.rewards.judge import llm_judge, parse_score
from rlfactory.rewards.qa import contains, exact_match, extract_answer, f1, normalize_answer

__all__ = [
    "answer_tag_present", "contains", "exact_match", "extract_answer", "f1", "failed_tool_call_penalty",
    "llm_judge", "normalize_answer", "parse_score", "thinking_well_formed", "too_many_tool_calls_penalty",
    "tool_calls_well_formed", "tool_success_per_turn", "tool_use_required",
]
