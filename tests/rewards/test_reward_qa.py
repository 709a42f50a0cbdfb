"""rewards/qa.py: answer extraction, SQuAD normalisation, exact match, F1, containment."""
from __future__ import annotations

import pytest

from rlfactory.rewards.qa import contains, exact_match, extract_answer, f1, normalize_answer


def test_last_answer_tag_wins():
    text = "<answer>Paris</answer> wait, no <answer> Lyon </answer>"
    assert extract_answer(text) == "Lyon"
    assert exact_match(text, "lyon") == 1.0
    assert exact_match(text, "paris") == 0.0


def test_without_tag_the_final_response_without_think_and_tool_blocks_is_the_answer():
    completion = '<tool_call>{"name": "c", "arguments": {}}</tool_call>The answer is 42'
    final = "<think>let me see</think>42"
    assert extract_answer(completion, final) == "42"
    assert exact_match(completion, 42, final_response=final) == 1.0
    # a tag anywhere in the completion beats the untagged final response
    assert extract_answer("<answer>7</answer>" + completion, final) == "7"


def test_normalisation_is_squad_style_and_unicode_aware():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffel tower"
    assert normalize_answer("¿Qué tal?") == "qué tal"
    assert normalize_answer("Ｔｏｋｙｏ") == "tokyo"  # full-width letters fold (NFKC)
    assert exact_match("<answer>an apple</answer>", "Apple.") == 1.0
    assert exact_match("<answer>北京</answer>", "北京") == 1.0
    assert exact_match("<answer>Zürich</answer>", "zurich") == 0.0  # accents are kept on purpose


@pytest.mark.parametrize("pred,ref,expected", [
    ("14118627", 14118627, 1.0), ("1,000", "1000", 1.0), ("3.0", 3, 1.0), ("-2", "-2.00", 1.0),
    ("3.5", "35", 0.0), ("1e3", "1000", 1.0), ("12", "123", 0.0),
])
def test_numbers_compare_numerically(pred, ref, expected):
    assert exact_match(f"<answer>{pred}</answer>", ref) == expected


def test_empty_answers():
    assert exact_match("<answer></answer>", "paris") == 0.0
    assert exact_match("<answer>  </answer>", "") == 1.0  # two empty answers agree (SQuAD)
    assert f1("<answer></answer>", "paris") == 0.0
    assert f1("<answer>the</answer>", "a") == 1.0  # both normalise to nothing
    assert contains("<answer>anything</answer>", "") == 0.0  # an empty reference never counts
    assert exact_match("", "x") == 0.0


def test_missing_reference_answer_raises_rather_than_scoring_zero():
    with pytest.raises(ValueError, match="no reference 'answer'"):
        exact_match("<answer>x</answer>", None)
    with pytest.raises(ValueError, match="empty list"):
        f1("<answer>x</answer>", [])


def test_aliases_take_the_best():
    assert exact_match("<answer>NYC</answer>", ["New York City", "nyc"]) == 1.0
    assert f1("<answer>new york</answer>", ["Boston", "New York City"]) == pytest.approx(0.8)


def test_token_f1_values():
    assert f1("<answer>red green blue</answer>", "green blue yellow") == pytest.approx(2 / 3)
    assert f1("<answer>cat cat</answer>", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # repeated tokens count once
    assert f1("<answer>dog</answer>", "cat") == 0.0


def test_contains_respects_word_boundaries():
    assert contains("<answer>It is 14 apples</answer>", "14") == 1.0
    assert contains("<answer>It is 14 apples</answer>", "4") == 0.0
    assert contains("<answer>It is 14 apples</answer>", "4", whole_words=False) == 1.0
    assert contains("I think the capital is Paris, France.", ["Lyon", "paris france"]) == 1.0
