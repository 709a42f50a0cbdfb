"""RewardSet: load reward functions by name / dotted path / file path, weight them, score trajectories.

A reward function is a plain sync or async function that asks for what it needs by parameter name:

    trajectory      the whole `Trajectory`
    completion      the assistant's text over all turns     final_response  the last assistant turn's text
    answer          the task's reference answer (row field) task            the data row
    tool_calls      `trajectory.tool_calls` (ToolCallRecord) messages        the conversation as chat messages
    metadata        the row's `metadata` dict (or {})       cache           the run's ToolCache (LLM judges), or None

plus the spec's `kwargs`. It returns one of
    a float (bool/int accepted)         the function's score;
    a dict of named floats              every entry is logged as `<name>/<key>`; the trained value is its "score"
                                        key (required unless the weight is 0);
    a list with one float per assistant turn (a step / process reward) — its sum is the function's score, and the
                                        weighted per-turn values land in `trajectory.step_rewards`, placed on each
                                        turn's last token by `token_level_rewards`.
The trained reward is the weighted sum; weight 0 = a metric only. A function that raises (or returns something
else) is counted in `reward/errors`, logged with the trajectory id, and its sample gets `failure_value` and
`reward_failed = True`: never a silent 0.

Also here: finding the functions (a registered name, a dotted path `pkg.mod:func`, or `file.py:func` beside the
recipe) with every signature problem reported at once, and pass@k over scored trajectories. The registered names point
at `rlfactory.rewards` (the top-level rewards/ folder), imported only when a recipe names them, so one broken
optional module cannot break the others.

What is left out: reward normalisation and advantages (rlfactory/algorithms/), and the reward functions themselves
(rewards/).

Modules: `functions.py` (finding and checking the functions), `reward_set.py` (`RewardSet`, scoring, token-level
rewards), `metrics.py` (a batch's reward metrics from per-trajectory ones, pass@k).
"""
from __future__ import annotations

from rlfactory.reward.functions import INJECTABLE, REGISTRY, RewardFn, load_reward_functions, resolve_function
from rlfactory.reward.metrics import combine_reward_metrics, pass_at_k
from rlfactory.reward.reward_set import RewardSet, RewardValueError, token_level_rewards

__all__ = ["INJECTABLE", "REGISTRY", "RewardFn", "RewardSet", "RewardValueError", "combine_reward_metrics",
           "load_reward_functions", "pass_at_k", "resolve_function", "token_level_rewards"]
