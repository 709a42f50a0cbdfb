"""TextCraft as a stateful MCP server (stdio): `reset(task_id)`, `step(action)`, `observe()`, `close()`.

Run: `python -m rlfactory.envs.tools.textcraft [--task-set rlfactory|agentgym] [--goal-order FILE]
[--shuffle-names] [--max-episodes N] [--idle-timeout-s S]`. The game itself is `rlfactory/envs/textcraft.py` (our recipe set:
envs/tools/data/textcraft_recipes.json); `--task-set agentgym` numbers the tasks as AgentGym's server does.
"""
from __future__ import annotations

from rlfactory.envs.mcp_server import build_env_server, server_args
from rlfactory.envs.textcraft import TASK_SETS, TextCraftEnv

INSTRUCTIONS = (
    "TextCraft: craft a goal item from base items. Call reset(task_id) to start; the observation lists the crafting "
    "commands and the goal. Then call step(action) with `get <count> <item>`, "
    "`craft <count> <item> using <count> <item>, ...` or `inventory`. The episode ends when the goal is crafted."
)


def main() -> None:
    def extra(p):
        p.add_argument("--goal-order", default=None,
                       help="agentgym task set: JSON file of AgentGym's goal names by task id")
        p.add_argument("--shuffle-names", action="store_true",
                       help="rename the items of every episode, drawn from its task id (demonstrations that teach "
                            "reading the crafting commands rather than recalling a goal's plan)")

    args = server_args("TextCraft MCP server", task_sets=TASK_SETS, extra=extra)

    def make() -> TextCraftEnv:
        return TextCraftEnv(task_set=args.task_set, goal_order=args.goal_order, shuffle_names=args.shuffle_names)

    make()  # a bad option fails here, not per episode
    es = build_env_server(
        "textcraft", make,
        instructions=INSTRUCTIONS,
        reset_doc="Start TextCraft task `task_id` (any integer; the same id is always the same goal). Returns the "
                  "crafting commands available and the goal item.",
        step_doc="Play one TextCraft action: `get <count> <item>` for a base item, "
                 "`craft <count> <item> using <count> <item>, <count> <item>` exactly as a crafting command lists "
                 "it, or `inventory`. Returns the observation, reward and whether the task is done.",
        max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, inline=True, forkable=True)
    es.run()


if __name__ == "__main__":
    main()
