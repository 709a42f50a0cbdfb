"""ScienceWorld as a stateful MCP server (stdio). Each open episode owns a JVM, started lazily on its first reset.

Run: `python -m rlfactory.envs.tools.sciworld [--max-episodes 8] [--task-set agentgym]`. Restrict tasks with env
RLFACTORY_SCIWORLD_TASKS (comma-separated ScienceWorld task names; not with agentgym) and add simplifications with
RLFACTORY_SCIWORLD_SIMPLIFICATIONS (e.g. `easy`). The wrapper lives in `rlfactory/envs/sciworld.py`.
"""
from __future__ import annotations

import os

from rlfactory.envs.mcp_server import build_env_server, server_args
from rlfactory.envs.sciworld import TASK_SETS, SciWorldEnv

INSTRUCTIONS = (
    "ScienceWorld: a text simulator of elementary-school science tasks. Call reset(task_id) to start; the "
    "observation gives the task and the room. Then call step(action) with text commands such as `look around`, "
    "`open door to kitchen`, `go to kitchen`, `pick up thermometer`, `focus on OBJ`. An unknown command is answered "
    "with the valid templates. The score rises as sub-goals are reached; the episode ends on success or failure."
)


def main() -> None:
    tasks = [t for t in os.environ.get("RLFACTORY_SCIWORLD_TASKS", "").split(",") if t] or None
    # Each episode is a JVM (~300 MB): keep the bound low unless the machine has room.
    args = server_args("ScienceWorld MCP server", max_episodes=8, task_sets=TASK_SETS)
    if args.task_set == "agentgym":
        SciWorldEnv(tasks, task_set="agentgym")  # RLFACTORY_SCIWORLD_TASKS with agentgym fails here, not per episode
        reset_doc = ("Start ScienceWorld task `task_id` as AgentGym numbers them (its flat list of task "
                     "variations). Returns the task description and the first room.")
    else:
        reset_doc = ("Start ScienceWorld task `task_id`: task = one of the 30 ScienceWorld tasks (task_id modulo the "
                     "task count), variation = the quotient. Returns the task description and the first room.")
    es = build_env_server(
        "sciworld", lambda: SciWorldEnv(tasks, task_set=args.task_set), instructions=INSTRUCTIONS,
        reset_doc=reset_doc,
        step_doc="Send one text command to ScienceWorld (e.g. `look around`, `go to kitchen`, `focus on OBJ`). "
                 "Returns the observation, reward (score change, 0-1), score so far and whether it is done.",
        max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, forkable=True)
    es.run()


if __name__ == "__main__":
    main()
