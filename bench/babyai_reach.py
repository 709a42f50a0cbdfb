"""Which BabyAI held-out tasks can be solved at all within the eval's turns, in AgentGym's action words.

    python bench/babyai_reach.py --json out.json [--turns 6] [--tasks 10000-10031] [--limit-s 240]

Per task of the learning recipe's held-out set (AgentGym ids 10000-10031, levels 1-32), in-process on the real
environment (`BabyAIEnv`, task set `agentgym`): does the scripted demonstrator that made the warm start's
demonstrations (`BabyAIWords`, macro style: a macro for each part of the goal it covers, the planner's low-level steps
otherwise) solve it within `--turns` actions; and does a breadth-first search over every action word the
environment offers, on forks of the episode, find a solution within `--turns` (`babyai_shortest` in
rlfactory/envs/solvers.py: the fewest actions; states seen before are skipped; `--limit-s` per task). The search
sees nothing the policy does not see turn by turn, but it tries every branch: a solution it finds exists, though a
policy would have to guess which door hides the target (the `search` demonstration style plays these solutions).
Reported: the tasks each solves (`demonstrator_solved`, `search_solved`) and their shares, and per task the level,
the search's solution and the states it visited. Read beside `rlfactory eval --k K` (what the warm start reaches
when it samples): the gap between the two is what RL would have to find, not merely choose.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlfactory.envs.babyai import BabyAIEnv
from rlfactory.envs.solvers import BabyAIWords, babyai_shortest


def demonstrator_solves(task_id: int, turns: int) -> bool:
    env = BabyAIEnv(task_set="agentgym")
    env.reset(task_id)
    demo = BabyAIWords(task_id)
    try:
        for _ in range(turns):
            word = demo.next_action()
            result = env.step(word)
            demo.step(word)
            if result.done:
                return result.score > 0
        return False
    finally:
        env.close()


def _ids(spec: str) -> list[int]:
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--turns", type=int, default=6, help="actions allowed (the learning recipe's eval horizon: 6)")
    ap.add_argument("--tasks", default="10000-10031", help="task ids, LO-HI (default: the recipe's held-out set)")
    ap.add_argument("--limit-s", type=float, default=240.0, help="search time per task")
    args = ap.parse_args()
    tasks = _ids(args.tasks)
    rows = []
    for task_id in tasks:
        row = babyai_shortest(task_id, args.turns, max_states=None, limit_s=args.limit_s)
        row["demonstrator"] = demonstrator_solves(task_id, args.turns)
        rows.append(row)
        print(f"{task_id} {row['level']}: demonstrator {'solves' if row['demonstrator'] else 'fails'}; search "
              f"{row['solution'] or ('timed out' if row['stopped'] else 'none')} ({row['states']} states, "
              f"{row['seconds']} s)", flush=True)
    demo = [r["task_id"] for r in rows if r["demonstrator"]]
    found = [r["task_id"] for r in rows if r["solution"]]
    result = {"turns": args.turns, "tasks": len(rows), "demonstrator_share": round(len(demo) / len(rows), 4),
              "search_share": round(len(found) / len(rows), 4), "demonstrator_solved": demo,
              "search_solved": found, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
