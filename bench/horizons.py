"""ScalingInter-RL against fixed horizons: one environment, the same steps, three horizon schedules.

    python bench/horizons.py --json bench/results/horizons.json [--env babyai] [--steps 30] [--seed 0]
                             [--schedules fixed_short,fixed_long,scaling_inter]

Each schedule trains the environment's learning recipe (recipes/<env>_learn.yaml) from the same warm start for the
same number of GRPO steps, with only `rollout.horizon` changed:
- `fixed_short`: the schedule's first horizon for every step;
- `fixed_long`: its last horizon for every step;
- `scaling_inter`: the recipe's own schedule (short first, growing every `interval_steps`: the AgentGym-RL paper's
  shape, scaled down).
Then the commands a user runs evaluate the last checkpoint on the held-out tasks, greedy (`rlfactory eval`) and
sampled (`rlfactory eval --k 4`, temperature 1). Reported per schedule:
- `success`: greedy success rate (pass@1);
- `turns_mean`: mean turns per greedy episode, and the share of greedy first actions in the style
  bench/env_learning.py reports for the environment (BabyAI: macros; TextCraft: a `get` of the goal);
- `distinct_sequences_per_task`: of 4 sampled episodes per task, how many distinct action sequences (1 = the policy
  collapsed onto one behaviour, 4 = all differ);
- `reward_best` / `reward_last5` and `collapsed`: whether the training reward (5-step mean, full windows) fell more
  than 0.2 below its best;
- `grpo_minutes`.
`--schedules` runs some of the three (e.g. one per process, side by side on a machine with the cores for it).
This is a measurement, not a pass/fail test; docs/environments.md says what it shows beside the paper's claim.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_learning import RECIPES, _run, evaluate, share_key  # noqa: E402


def schedules(recipe: Path) -> dict[str, dict[str, Any]]:
    horizon = yaml.safe_load(recipe.read_text())["rollout"]["horizon"]
    if horizon.get("type") != "scaling_inter":
        raise SystemExit(f"{recipe}: rollout.horizon is not a scaling_inter schedule")
    return {"fixed_short": {"type": "fixed", "turns": horizon["horizons"][0]},
            "fixed_long": {"type": "fixed", "turns": horizon["horizons"][-1]},
            "scaling_inter": horizon}


def five_step_means(rewards: list[float]) -> list[float]:
    """The training reward's 5-step means, over full windows only: a partial window at the start is one or two lucky
    batches, and a best taken there would flag a collapse that never happened."""
    if len(rewards) < 5:
        return [statistics.fmean(rewards)] if rewards else [0.0]
    return [statistics.fmean(rewards[i - 4: i + 1]) for i in range(4, len(rewards))]


def distinct_sequences(eval_dir: Path) -> float:
    by_task: dict[str, set[tuple[str, ...]]] = {}
    for line in (eval_dir / "eval" / "eval.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            seq = tuple(str((c.get("arguments") or {}).get("action", "")) for c in r["tool_calls"])
            by_task.setdefault(str(r["task_id"]), set()).add(seq)
    return round(statistics.fmean(len(s) for s in by_task.values()), 3) if by_task else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--env", default="babyai", choices=sorted(RECIPES))
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per schedule (default: the recipe's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", type=Path, default=None)
    ap.add_argument("--schedules", default="fixed_short,fixed_long,scaling_inter",
                    help="which schedules to run, comma-separated (default: all three)")
    args = ap.parse_args()
    recipe = RECIPES[args.env]
    every = schedules(recipe)
    chosen = [n for n in args.schedules.split(",") if n]
    unknown = [n for n in chosen if n not in every]
    if unknown or not chosen:
        raise SystemExit(f"--schedules {args.schedules!r}: use some of {', '.join(every)}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="horizons_"))
    result: dict[str, Any] = {"env": args.env, "seed": args.seed, "schedules": {}}
    for name, horizon in ((n, every[n]) for n in chosen):
        out = work / name
        cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(recipe), "--output-dir", str(out / "train"),
               "--set", f"trainer.seed={args.seed}", "--set", f"rollout.horizon={json.dumps(horizon)}"]
        if args.steps:
            cmd += ["--set", f"trainer.total_steps={args.steps}"]
        out.mkdir(parents=True, exist_ok=True)
        _run(cmd, out / "train.log")
        rows = [json.loads(x) for x in (out / "train" / "metrics.jsonl").read_text().splitlines() if x.strip()]
        rewards = [r["reward/mean"] for r in rows]
        smooth = five_step_means(rewards)
        checkpoint = sorted((out / "train" / "checkpoints").glob("step_*"))[-1]
        greedy = evaluate(args.env, recipe, out / "greedy", checkpoint)
        sampled_dir = out / "sampled"
        sampled_dir.mkdir(exist_ok=True)
        _run([sys.executable, "-m", "rlfactory.cli", "eval", str(recipe), "--checkpoint", str(checkpoint),
              "--k", "4", "--output-dir", str(sampled_dir)], sampled_dir / "eval.log")
        summary = json.loads((out / "train" / "summary.json").read_text())
        share = share_key(args.env)
        row = {"horizon": horizon, "success": greedy["success"], "turns_mean": greedy["turns_mean"],
               share: greedy[share],
               "distinct_sequences_per_task": distinct_sequences(sampled_dir),
               "reward_best": round(max(smooth), 3), "reward_last5": round(smooth[-1], 3),
               "collapsed": bool(max(smooth) - smooth[-1] > 0.2), "grpo_minutes": round(summary["wall_s"] / 60, 2),
               "curve": [round(x, 3) for x in rewards]}
        result["schedules"][name] = row
        print(f"{name:14s} success {row['success']:.3f}, {row['turns_mean']} turns, "
              f"{row['distinct_sequences_per_task']} distinct sequences/task, reward best {row['reward_best']} "
              f"last {row['reward_last5']}{' (collapsed)' if row['collapsed'] else ''}, {row['grpo_minutes']} min",
              flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
