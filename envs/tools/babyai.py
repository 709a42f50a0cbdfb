"""BabyAI (minigrid) as a stateful MCP server (stdio), with text observations and named actions.

Run: `python -m rlfactory.envs.tools.babyai [--levels BabyAI-GoToLocal-v0,BabyAI-PickupLoc-v0] [--max-episodes N]`.
The text rendering lives in `rlfactory/envs/babyai.py`.
"""
from __future__ import annotations

import os

from rlfactory.envs.babyai import ACTIONS, DEFAULT_LEVELS, BabyAIEnv
from rlfactory.envs.mcp_server import build_env_server, server_args

INSTRUCTIONS = (
    "BabyAI: a grid world seen in text. Call reset(task_id) to start; the observation gives the mission and what you "
    "see relative to you. Then call step(action) with one of: " + ", ".join(ACTIONS) + ". The episode ends when the "
    "mission is accomplished or the step limit is reached."
)


def main() -> None:
    # Levels come from the environment variable so an mcpServers entry can set them without changing args.
    levels = tuple(x for x in os.environ.get("RLFACTORY_BABYAI_LEVELS", ",".join(DEFAULT_LEVELS)).split(",") if x)
    args = server_args("BabyAI MCP server (levels: env RLFACTORY_BABYAI_LEVELS, comma-separated)")
    es = build_env_server(
        "babyai", lambda: BabyAIEnv(levels), instructions=INSTRUCTIONS,
        reset_doc=f"Start BabyAI task `task_id` (level = task_id modulo {len(levels)} levels, seeded by task_id). "
                  "Returns the mission and what you see.",
        step_doc="Take one action: " + ", ".join(f"`{a}`" for a in ACTIONS) + ". Returns what you see, the reward "
                 "and whether the episode is done.",
        max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, inline=True)
    es.run()


if __name__ == "__main__":
    main()
