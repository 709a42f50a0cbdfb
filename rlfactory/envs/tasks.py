"""Task rows (JSONL) for training on the environment servers: one row per environment task id.

    python -m rlfactory.envs.tasks [--out DIR] [--task-set agentgym]
        (writes {env}_train.jsonl / {env}_val.jsonl, or {env}_agentgym_*.jsonl, by default into envs/tools/data/tasks;
        `rlfactory envs tasks` writes rows for any ids, optionally reading each goal off a running server)

Each row: `{"id", "prompt", "answer": null, "env": {"server", "task_id"}}`. The AgentLoop opens the episode itself
before the first turn (`env` names the server and task; rlfactory/rollout/env_glue.py) and shows the first
observation under the prompt, so the prompt only says how to act: which tool to call with which actions, and when
to stop. The reward comes from the environment (`rewards/env.py`), so there is no reference answer. For TextCraft and
Deep Search the prompt also carries the task itself (goal / question), which is deterministic per task id.
WebArena rows carry only the task id (its 812 task intents live with the user's AgentGym WebArena server).

Task set `agentgym` (TextCraft, BabyAI): ids as AgentGym's servers number them, with neutral prompts that name no
goal and no action the server does not know, so the same rows fit AgentGym's real server behind the bridge and our
own servers started with `--task-set agentgym`. `server_task_rows` reads each task's goal off a running server
instead (`rlfactory envs tasks --server URL`), so the prompt can name it.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from rlfactory.envs.deepsearch import load_questions
from rlfactory.envs.textcraft import TextCraftEnv
from rlfactory.envs.tools import DATA_DIR

# ScienceWorld's task names in the simulator's order (its task ids 1-1, 1-2, ..., 10-2), so that task ids match
# `rlfactory/envs/sciworld.py`, which takes them from the simulator.
SCIWORLD_TASKS = (
    "boil", "melt", "freeze", "change-the-state-of-matter-of", "use-thermometer",
    "measure-melting-point-known-substance", "measure-melting-point-unknown-substance", "power-component",
    "power-component-renewable-vs-nonrenewable-energy", "test-conductivity",
    "test-conductivity-of-unknown-substances", "find-living-thing", "find-non-living-thing", "find-plant",
    "find-animal", "grow-plant", "grow-fruit", "chemistry-mix", "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color", "lifespan-longest-lived", "lifespan-shortest-lived",
    "lifespan-longest-lived-then-shortest-lived", "identify-life-stages-1", "identify-life-stages-2",
    "inclined-plane-determine-angle", "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces", "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant",
)

# (train ids, val ids) per environment: disjoint ranges.
SPLITS: dict[str, tuple[range, range]] = {
    "textcraft": (range(0, 320), range(320, 352)),
    "babyai": (range(0, 512), range(10_000, 10_032)),
    "sciworld": (range(0, 300), range(3000, 3030)),
    "deepsearch": (range(0, 28), range(28, 36)),
    "webarena": (range(0, 700), range(700, 812)),
}


TEXTCRAFT_AGENTGYM_GOALS = 533
"""Goals of our recipe set in the agentgym task set (task id % 533 names the goal)."""
TEXTCRAFT_AGENTGYM_VAL = (27, 63, 70, 83, 112, 126, 140, 143, 145, 154, 178, 201, 215, 254, 258, 284, 296, 310, 316,
                          325, 338, 374, 393, 411, 418, 419, 424, 429, 485, 513, 518, 519)
"""The agentgym TextCraft task set's held-out goals: 32 drawn at random (`random.Random(17).sample(range(533), 32)`).
AgentGym numbers goals by crafting depth and then by name, so a contiguous block of ids (the 320-351 used before)
is one depth band of alphabetically adjacent names, a shift of distribution rather than a held-out sample."""
TEXTCRAFT_SFT_ROUNDS = 5
"""The demonstration pool plays each training goal this many times, as task ids g, g + 533, ...: the same goal
with other distractors in another order."""


def _textcraft_agentgym_split(split: str) -> list[int]:
    val = set(TEXTCRAFT_AGENTGYM_VAL)
    if split == "val":
        return list(TEXTCRAFT_AGENTGYM_VAL)
    rounds = 1 if split == "train" else TEXTCRAFT_SFT_ROUNDS
    return [i for i in range(TEXTCRAFT_AGENTGYM_GOALS * rounds) if i % TEXTCRAFT_AGENTGYM_GOALS not in val]


BABYAI_AGENTGYM_SFT = range(1000, 9192)
"""The BabyAI demonstration pool of `recipes/babyai_learn_namer_sft.yaml`: 8,192 task ids (AgentGym's levels 0-39 with
seeds 25-229) that neither GRPO's training ids (0-511: seeds 0-12) nor the held-out ids (10000-10031: seed 250)
share, so the warm-up sees many more layouts than GRPO trains on and none of those it is evaluated on."""

AGENTGYM_SPLITS: dict[str, dict[str, list[int]]] = {
    "textcraft": {split: _textcraft_agentgym_split(split) for split in ("train", "val", "sft")},
    "babyai": {"sft": list(BABYAI_AGENTGYM_SFT)},
}
"""Where the agentgym task set splits differently from `SPLITS`, or adds a split: TextCraft's train (every other
goal), val and sft (the demonstration pool of `recipes/textcraft_learn_sft.yaml`: the training goals, 5 times each)
ids; BabyAI's sft (the demonstration pool of `recipes/babyai_learn_namer_sft.yaml`)."""


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


def web_prompt(task_id: int) -> str:
    return (f"Web task {task_id}, on a shop, a forum and a wiki. The task and the first page are below. Call step "
            "with one browser action at a time (e.g. `click [id]`, `type [id] [text] [1]`, `scroll [down]`); when "
            "the task is done call step with `stop [answer]` (the answer if the task asks a question).")


PROMPTS = {"textcraft": textcraft_prompt, "babyai": babyai_prompt, "sciworld": sciworld_prompt,
           "deepsearch": deepsearch_prompt, "webarena": webarena_prompt, "web": web_prompt}


def textcraft_agentgym_prompt(task_id: int, goal: str | None = None) -> str:
    what = f": craft {goal}" if goal else ""
    return (f"TextCraft task {task_id}{what}. The crafting commands and the goal are below. Call step with one "
            "action at a time: `get <count> <item>`, `craft <count> <item> using <count> <item>, ...` or "
            "`inventory`. Stop when the goal is crafted.")


def babyai_agentgym_prompt(task_id: int, goal: str | None = None) -> str:
    what = f": {goal}" if goal else ""
    return (f"BabyAI task {task_id}{what}. Your goal, what you see and the available actions are below. Call step "
            "with one action at a time, written as the available actions list it (e.g. `move forward`, "
            "`go to red ball 1`, `check available actions`). Stop when the goal is reached.")


def sciworld_agentgym_prompt(task_id: int, goal: str | None = None) -> str:
    what = f": {goal}" if goal else ""
    return (f"ScienceWorld task {task_id}{what}. The task and the room are below. Call step with one text command at "
            "a time (e.g. `look around`, `go to kitchen`, `focus on OBJ`). Stop when the task is done.")


AGENTGYM_PROMPTS = {"textcraft": textcraft_agentgym_prompt, "babyai": babyai_agentgym_prompt,
                    "sciworld": sciworld_agentgym_prompt}
TASK_SETS = ("rlfactory", "agentgym")
# What names the task in a reset observation, per environment (ours with the agentgym task set, and AgentGym's).
GOAL_PATTERNS = {"textcraft": re.compile(r"Goal: craft (.+?)\.\s*$", re.M),
                 "babyai": re.compile(r"^Your goal: (.+)$", re.M)}


def task_rows(env: str, ids: range | list[int], task_set: str = "rlfactory", server: str | None = None,
              goals: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Rows for `ids` of `env` (`server`: the mcpServers name in `env.server`, default `env`; `goals`: task id ->
    goal to name in agentgym prompts)."""
    if task_set not in TASK_SETS:
        raise ValueError(f"task set {task_set!r}: use one of {', '.join(TASK_SETS)}")
    if task_set == "agentgym" and env not in AGENTGYM_PROMPTS:
        raise ValueError(f"task set agentgym: only {', '.join(AGENTGYM_PROMPTS)} have one, not {env!r}")
    rows = []
    for i in ids:
        prompt = PROMPTS[env](i) if task_set == "rlfactory" else AGENTGYM_PROMPTS[env](i, (goals or {}).get(i))
        rows.append({"id": f"{env}-{i}", "prompt": prompt, "answer": None,
                     "env": {"server": server or env, "task_id": i}})
    return rows


def server_goals(env: str, url: str, ids: range | list[int], **client_kwargs: Any) -> dict[int, str]:
    """Each task's goal as a running AgentGym-protocol server states it in its reset observation."""
    from rlfactory.envs.client import EnvClient  # here: only this reads a server

    if env not in GOAL_PATTERNS:
        raise ValueError(f"reading goals off a server: only {', '.join(GOAL_PATTERNS)}, not {env!r}")
    goals: dict[int, str] = {}
    with EnvClient(env, url, **client_kwargs) as client:
        for i in ids:
            observation = client.reset(i).observation
            m = GOAL_PATTERNS[env].search(observation)
            if m is None:
                raise ValueError(f"{url}: the reset observation of task {i} names no goal "
                                 f"(expected {GOAL_PATTERNS[env].pattern!r}): {observation[:200]!r}")
            goals[i] = m.group(1).strip()
    return goals


def write_splits(out: Path, envs: list[str], task_set: str = "rlfactory") -> list[Path]:
    """Write each env's train/val rows (`SPLITS`; for the agentgym task set, `AGENTGYM_SPLITS` where it has the env)
    into `out`: `{env}_{split}.jsonl`, or `{env}_agentgym_{split}.jsonl` for the agentgym task set."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for env in envs:
        train, val = SPLITS[env]
        tag = "" if task_set == "rlfactory" else f"_{task_set}"
        splits: dict[str, Any] = {"train": train, "val": val}
        if task_set == "agentgym":
            splits.update(AGENTGYM_SPLITS.get(env, {}))
        for split, ids in splits.items():
            path = out / f"{env}{tag}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in task_rows(env, ids, task_set)))
            written.append(path)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(DATA_DIR / "tasks"))
    p.add_argument("--envs", default=None, help="comma-separated (default: every env of the task set)")
    p.add_argument("--task-set", choices=TASK_SETS, default="rlfactory")
    args = p.parse_args()
    default = SPLITS if args.task_set == "rlfactory" else AGENTGYM_PROMPTS
    envs = args.envs.split(",") if args.envs else list(default)
    write_splits(Path(args.out), envs, args.task_set)


if __name__ == "__main__":
    main()
