"""BabyAI (minigrid) as a stateful MCP server (stdio), with text observations and named actions.

Run: `python -m rlfactory.envs.tools.babyai [--task-set rlfactory|agentgym] [--view text|pixels] [--max-episodes N]`
(levels of the rlfactory task set: env RLFACTORY_BABYAI_LEVELS). `--task-set agentgym`: AgentGym's 40 levels, seeds
and action words. `--view pixels`: the same tasks and actions, but each result shows the agent's view as a PNG image
(MCP `ImageContent`) after a text with the mission and the load. The rendering lives in `rlfactory/envs/babyai.py`.
"""
from __future__ import annotations

import os

from rlfactory.envs.babyai import ACTIONS, DEFAULT_LEVELS, TASK_SETS, VIEWS, BabyAIEnv
from rlfactory.envs.mcp_server import build_env_server, server_args

INSTRUCTIONS = (
    "BabyAI: a grid world seen in text. Call reset(task_id) to start; the observation gives the mission and what you "
    "see relative to you. Then call step(action) with one of: " + ", ".join(ACTIONS) + ". The episode ends when the "
    "mission is accomplished or the step limit is reached."
)

AGENTGYM_INSTRUCTIONS = (
    "BabyAI: a grid world seen in text. Call reset(task_id) to start; the observation gives your goal, what you see "
    "and the available actions. Then call step(action) with one of the available actions, written as listed. The "
    "episode ends when the goal is reached or the step limit is hit."
)


def main() -> None:
    # Levels come from the environment variable so an mcpServers entry can set them without changing args.
    levels = tuple(x for x in os.environ.get("RLFACTORY_BABYAI_LEVELS", ",".join(DEFAULT_LEVELS)).split(",") if x)
    args = server_args("BabyAI MCP server (levels: env RLFACTORY_BABYAI_LEVELS, comma-separated)",
                       task_sets=TASK_SETS, extra=lambda p: p.add_argument(
                           "--view", choices=VIEWS, default=VIEWS[0],
                           help="text: the view in words; pixels: a picture of the view with each result"))
    if args.task_set == "agentgym":
        instructions = AGENTGYM_INSTRUCTIONS
        reset_doc = ("Start BabyAI task `task_id` (AgentGym's numbering: level task_id % 40, seed task_id // 40). "
                     "Returns your goal, what you see and the available actions.")
        step_doc = ("Take one action, written as the observation's `Available actions` list writes it (e.g. "
                    "`move forward`, `go to red ball 1`, `pickup red ball 1`, `toggle`, `check available actions`). "
                    "Returns what you see, the reward and whether the episode is done.")
    else:
        instructions = INSTRUCTIONS
        reset_doc = (f"Start BabyAI task `task_id` (level = task_id modulo {len(levels)} levels, seeded by task_id). "
                     "Returns the mission and what you see.")
        step_doc = ("Take one action: " + ", ".join(f"`{a}`" for a in ACTIONS) + ". Returns what you see, the "
                    "reward and whether the episode is done.")
    if args.view == "pixels":
        instructions = instructions.replace("seen in text", "seen in pictures") + (
            " Each result shows what you see as a picture: you stand at its bottom centre, facing up.")
    es = build_env_server(
        "babyai", lambda: BabyAIEnv(levels, task_set=args.task_set, view=args.view), instructions=instructions,
        reset_doc=reset_doc, step_doc=step_doc,
        max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, inline=True, forkable=True)
    es.run()


if __name__ == "__main__":
    main()
