"""Task rows (JSONL) for training on the environment servers: one row per environment task id.

    python -m rlfactory.envs.tasks [--out DIR]    (writes {env}_train.jsonl / {env}_val.jsonl, by default into
                                                   envs/tools/data/tasks)

Each row: `{"id", "prompt", "answer": null, "env": {"server", "task_id"}}`. The AgentLoop opens the episode itself
before the first turn (`env` names the server and task; rlfactory/rollout/env_glue.py) and shows the first
observation under the prompt, so the prompt only says how to act: which tool to call with which actions, and when
to stop. The reward comes from the environment (`rewards/env.py`), so there is no reference answer. For TextCraft and
Deep Search the prompt also carries the task itself (goal / question), which is deterministic per task id.
WebArena rows carry only the task id (its 812 task intents live with the user's AgentGym WebArena server).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlfactory.envs.deepsearch import load_questions
from rlfactory.envs.textcraft import TextCraftEnv
from rlfactory.envs.tools import DATA_DIR

# ScienceWorld's task names, in the simulator's order (so task ids match `rlfactory/envs/sciworld.py`).
SCIWORLD_TASKS = (
    "boil", "change-the-state-of-matter-of", "chemistry-mix", "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color", "find-animal", "find-living-thing", "find-non-living-thing", "find-plant",
    "freeze", "grow-fruit", "grow-plant", "identify-life-stages-1", "identify-life-stages-2",
    "inclined-plane-determine-angle", "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces", "lifespan-longest-lived", "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived", "measure-melting-point-known-substance", "measure-melting-point-unknown-substance",
    "melt", "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant", "power-component",
    "power-component-renewable-vs-nonrenewable-energy", "test-conductivity", "test-conductivity-of-unknown-substances",
    "use-thermometer",
)

# (train ids, val ids) per environment: disjoint ranges.
SPLITS: dict[str, tuple[range, range]] = {
    "textcraft": (range(0, 320), range(320, 352)),
    "babyai": (range(0, 512), range(10_000, 10_032)),
    "sciworld": (range(0, 300), range(3000, 3030)),
    "deepsearch": (range(0, 28), range(28, 36)),
    "webarena": (range(0, 700), range(700, 812)),
}


def textcraft_prompt(task_id: int) -> str:
    goal = TextCraftEnv().reset(task_id).info["goal"]
    return (f"TextCraft task {task_id}: craft {goal}. The crafting commands are below. "
            "Call step with one action at a time: `get <count> <item>`, "
            "`craft <count> <item> using <count> <item>, ...` or `inventory`. Stop when the goal is crafted.")


def babyai_prompt(task_id: int) -> str:
    return (f"BabyAI task {task_id}. Your mission and surroundings are below. Call "
            "step with one action at a time: turn left, turn right, go forward, pick up, drop, toggle, done. "
            "Stop when the mission is complete.")


def sciworld_prompt(task_id: int) -> str:
    name = SCIWORLD_TASKS[task_id % len(SCIWORLD_TASKS)]
    return (f"ScienceWorld task {task_id} ({name}). The task and the room are below. "
            "Call step with one text command at a time (e.g. `look around`, `go to kitchen`, "
            "`focus on OBJ`). Stop when the task is done.")


def deepsearch_prompt(task_id: int) -> str:
    question = load_questions()[task_id % len(load_questions())]["question"]
    return (f"Deep Search task {task_id}: {question}\nSearch as often as you "
            "need, then call answer with a short answer (that ends the task).")


def webarena_prompt(task_id: int) -> str:
    return (f"WebArena task {task_id}. The task and the first page are below. "
            "Call step with one browser action at a time (e.g. `click [id]`, `type [id] [text]`, `scroll [down]`, "
            "`stop [answer]`). Stop when the task is done.")


PROMPTS = {"textcraft": textcraft_prompt, "babyai": babyai_prompt, "sciworld": sciworld_prompt,
           "deepsearch": deepsearch_prompt, "webarena": webarena_prompt}


def task_rows(env: str, ids: range) -> list[dict[str, Any]]:
    return [{"id": f"{env}-{i}", "prompt": PROMPTS[env](i), "answer": None, "env": {"server": env, "task_id": i}}
            for i in ids]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(DATA_DIR / "tasks"))
    p.add_argument("--envs", default=",".join(SPLITS))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for env in args.envs.split(","):
        train, val = SPLITS[env]
        for split, ids in (("train", train), ("val", val)):
            path = out / f"{env}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in task_rows(env, ids)))


if __name__ == "__main__":
    main()
