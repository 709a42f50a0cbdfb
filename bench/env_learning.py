"""Do the environments learn? Per environment: greedy eval of the warm start, GRPO, greedy eval again.

    python bench/env_learning.py --json bench/results/env_learning.json [--envs babyai,textcraft,web] [--seeds 0,1]
                                 [--serial] [--reach K]

Everything runs through the commands a user runs, each in its own process, on the shipped recipes:
    rlfactory eval  recipes/<env>_learn.yaml                                   (the warm start: the recipe's model)
    rlfactory train recipes/<env>_learn.yaml --set trainer.seed=S
    rlfactory eval  recipes/<env>_learn.yaml --checkpoint RUN/checkpoints/step_<last>
The seeds train at the same time (`--serial`: one after another), each run in its own process with one torch thread
and its own tool server, so on 2 cores each has about one core. Validation is the recipe's held-out tasks
(`data.val_file`), one greedy episode each; success is pass@1 (the recipe's reward is the environment's success).
Reported per environment, averaged over the seeds: `<env>_success_warm`, `<env>_success_trained`,
`<env>_success_rise` (goal >= 0.2; web: >= 0.10) and `<env>_grpo_minutes` (the training run's own wall time, the
largest over the seeds; goal <= 15; web: <= 20, so its runs stop after the step that spends 17 minutes: `MINUTES`),
with per-seed figures and what the policy does before and after (mean turns per episode; the share of first actions
in the style GRPO is expected to bring back: for BabyAI, AgentGym macros; for TextCraft, a `get` of the goal itself,
which asks for its crafting command; for the web, a search for the product the task names, typed exactly as the task
spells it). `--envs web` is not in the default list: its GRPO runs in a real browser and is measured on its own.
`--reach K` also plays each held-out task K times at temperature 1.0 from the warm start (`<env>_warm_reach`: its
pass@K; what sharpening the sampled policy can bring greedy success up to).
`--png` (default next to the JSON) plots training reward against wall-clock minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RECIPES = {"babyai": REPO / "recipes" / "babyai_learn.yaml", "textcraft": REPO / "recipes" / "textcraft_learn.yaml",
           "web": REPO / "recipes" / "web_learn.yaml"}
_MACROS = ("go to ", "pickup ", "toggle and go through ", "go through ")
_GOAL = re.compile(r"Goal: craft (.+?)\.\s*$", re.MULTILINE)
_TASK = re.compile(r"^Task: (.+)$", re.MULTILINE)
_TYPED = re.compile(r"type \[\d+\] \[(.+?)\]")
_PRODUCT = re.compile(r".*\bthe (.+?)(?: have| available| listed)?\?$")  # shop templates 1-6
STYLE = {"babyai": "macro", "textcraft": "asks_goal", "web": "searches_product"}  # per env: the first-action style
MINUTES = {"web": 17.0}
"""Per env: a wall-clock budget of GRPO (`trainer.max_minutes`; the run ends after the step that spends it), where
a step's length varies too much for `total_steps` alone to keep the run within its goal (web: a browser step takes
1-3 min on 2 busy cores, and the goal is 20 minutes). The recipes leave it out: verl's loop takes no budget."""


def _run(cmd: list[str], log: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({' '.join(map(str, cmd))}); last lines of {log}:\n"
                         + "\n".join(log.read_text().splitlines()[-15:]))
    return time.perf_counter() - t0


def share_key(env: str) -> str:
    """The name of the env's first-action figure: `first_action_macro_share` (BabyAI), `..._asks_goal_share`."""
    return f"first_action_{STYLE[env]}_share"


def _goal(row: dict[str, Any]) -> str | None:
    """The TextCraft goal named in the episode's reset observation."""
    for msg in row.get("messages", []):
        if msg.get("role") in ("user", "tool") and (m := _GOAL.search(str(msg.get("content", "")))):
            return m.group(1)
    return None


def _task_line(row: dict[str, Any]) -> str | None:
    """The web task's intent, from the episode's reset observation (`Task: ...`)."""
    for msg in row.get("messages", []):
        if msg.get("role") in ("user", "tool") and (m := _TASK.search(str(msg.get("content", "")))):
            return m.group(1)
    return None


def _first_action_is_style(env: str, row: dict[str, Any]) -> bool:
    """BabyAI: the first action is an AgentGym macro. TextCraft: it is a `get` of the goal (which the environment
    answers with the goal's crafting command), not of an ingredient or of another item. Web: it types into a box a
    product name exactly as the task's intent names it (`... of the <name>?`, `does the <name> have?`, ...)."""
    action = str((row["tool_calls"][0].get("arguments") or {}).get("action", "")) if row["tool_calls"] else ""
    if env == "babyai":
        return action.startswith(_MACROS)
    if env == "web":
        typed, intent = _TYPED.match(action.strip()), _task_line(row)
        product = _PRODUCT.search(intent) if intent else None
        return typed is not None and product is not None and typed.group(1) == product.group(1)
    goal = _goal(row)
    return goal is not None and re.fullmatch(rf"get \d+ {re.escape(goal)}", action.strip().lower()) is not None


def eval_rows(eval_dir: Path) -> list[dict[str, Any]]:
    """The transcripts `rlfactory eval --output-dir eval_dir` wrote, one row per episode."""
    return [json.loads(x) for x in (eval_dir / "eval" / "eval.jsonl").read_text().splitlines() if x.strip()]


def behaviour(eval_dir: Path, env: str) -> dict[str, float]:
    """Mean turns per episode and the share of first actions in the env's `STYLE`, from an eval's transcripts."""
    rows = eval_rows(eval_dir)
    turns = [sum(1 for m in r.get("messages", []) if m.get("role") == "assistant") for r in rows]
    share = sum(_first_action_is_style(env, r) for r in rows) / len(rows) if rows else 0.0
    return {"turns_mean": round(statistics.fmean(turns), 2) if turns else 0.0, share_key(env): round(share, 3)}


def _eval(recipe: Path, out: Path, checkpoint: Path | None, *extra: str) -> float:
    """`rlfactory eval RECIPE --output-dir OUT [--checkpoint C] [extra]`, logged to OUT/eval.log; its seconds."""
    cmd = [sys.executable, "-m", "rlfactory.cli", "eval", str(recipe), "--output-dir", str(out), *extra]
    if checkpoint is not None:
        cmd += ["--checkpoint", str(checkpoint)]
    out.mkdir(parents=True, exist_ok=True)
    return _run(cmd, out / "eval.log")


def evaluate(env: str, recipe: Path, out: Path, checkpoint: Path | None = None) -> dict[str, Any]:
    seconds = _eval(recipe, out, checkpoint)
    res = json.loads((out / "eval" / "eval.json").read_text())
    return {"success": res["pass@1"], "tasks": res["tasks"], "eval_s": round(seconds, 1), **behaviour(out, env),
            "solved": solved(out)}


def reach(recipe: Path, out: Path, checkpoint: Path | None, k: int) -> dict[str, Any]:
    """What the policy reaches when it samples (`rlfactory eval --k K`: K episodes a held-out task at temperature
    1.0): pass@K, the mean success of a sample, and the tasks some sample solved. RL sharpens what the policy already
    samples, so pass@K bounds what greedy success can reach without a new behaviour being found."""
    seconds = _eval(recipe, out, checkpoint, "--k", str(k))
    return {**read_reach(out), "eval_s": round(seconds, 1)}


def read_reach(eval_dir: Path) -> dict[str, Any]:
    """An `eval --k K` folder's pass@K, mean success of a sample, and the tasks some sample solved."""
    res = json.loads((eval_dir / "eval" / "eval.json").read_text())
    k = int(res["k"])
    return {"k": k, f"pass@{k}": res[f"pass@{k}"], "sample_success": res["pass@1"],
            "reached": sorted(set(solved(eval_dir)))}


def solved(eval_dir: Path) -> list[str]:
    """The task ids an eval solved (its `env_success`, else a reward of 1), to tell which tasks a run changed."""
    return sorted(r["task_id"] for r in eval_rows(eval_dir)
                  if r.get("reward_components", {}).get("env_success", r["reward"]) >= 1)


def train(recipe: Path, out: Path, seed: int, steps: int | None, minutes: float | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(recipe), "--output-dir", str(out),
           "--set", f"trainer.seed={seed}"]
    if steps:
        cmd += ["--set", f"trainer.total_steps={steps}"]
    if minutes:
        cmd += ["--set", f"trainer.max_minutes={minutes}"]
    process_s = _run(cmd, out.parent / f"{out.name}.log")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = max((out / "checkpoints").glob("step_*"))
    return {"steps": len(rows), "grpo_minutes": round(summary["wall_s"] / 60, 2), "process_s": round(process_s, 1),
            "reward_first5": round(statistics.fmean(_success(r) for r in rows[:5]), 3),
            "reward_last5": round(statistics.fmean(_success(r) for r in rows[-5:]), 3),
            "checkpoint": last, "curve": [[round(r["time/elapsed_s"] / 60, 2), _success(r)] for r in rows]}


def _success(row: dict[str, Any]) -> float:
    """A step's training success: `reward/env_success` (a recipe's reward may add process rewards to it, such as
    the web's `env_progress`), else the reward itself."""
    return row.get("reward/env_success", row["reward/mean"])


def plot(per_env: dict[str, list[dict[str, Any]]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * len(per_env), 3.6))
    FigureCanvasAgg(fig)
    for i, (env, runs) in enumerate(per_env.items()):
        ax = fig.add_subplot(1, len(per_env), i + 1)
        for run in runs:
            xs, ys = zip(*run["curve"])
            ax.plot(xs, ys, label=f"seed {run['seed']}: eval {run['success_warm']:.2f} -> "
                                  f"{run['success_trained']:.2f}")
        ax.set_title(f"{env}: GRPO training reward")
        ax.set_xlabel("wall-clock minutes")
        ax.set_ylabel("training success (env_success)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--envs", default="babyai,textcraft", help="comma-separated: babyai, textcraft, web")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=None, help="override trainer.total_steps (default: the recipe's)")
    ap.add_argument("--minutes", type=float, default=None,
                    help="GRPO's wall-clock budget, trainer.max_minutes (default: per env, MINUTES; web 17)")
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--serial", action="store_true",
                    help="train the seeds one after another (default: at the same time, each in its own process "
                         "with one torch thread, so on 2 cores each run has about one core)")
    ap.add_argument("--reach", type=int, default=0, help="K: also the warm start's pass@K at temperature 1.0 on the "
                                                         "held-out tasks (`<env>_warm_reach`; default 0: skip)")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    envs = [e for e in args.envs.split(",") if e]
    missing = [e for e in envs if e not in RECIPES or not RECIPES[e].exists()]
    if missing:
        raise SystemExit(f"no learning recipe for {', '.join(missing)} (known: "
                         f"{', '.join(e for e, p in RECIPES.items() if p.exists())})")
    for env in envs:  # the warm starts are made once, by `rlfactory sft`, and shipped: not remade here
        model = (RECIPES[env].parent / yaml.safe_load(RECIPES[env].read_text())["model"]["path"]).resolve()
        if not (model / "config.json").exists():
            raise SystemExit(f"{env}: no warm start at {model}; make it with "
                             f"`rlfactory sft recipes/{env}_learn_sft.yaml`")
    seeds = [int(s) for s in args.seeds.split(",")]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="env_learning_"))
    result: dict[str, Any] = {"seeds": seeds, "runs": {}}
    per_env: dict[str, list[dict[str, Any]]] = {}
    for env in envs:
        recipe = RECIPES[env]
        warm = evaluate(env, recipe, work / env / "warm")
        share = share_key(env)
        print(f"{env}: warm start success {warm['success']:.3f} on {warm['tasks']} held-out tasks "
              f"({warm['turns_mean']} turns, {share} {warm[share]})",
              flush=True)
        if args.reach:
            warm["reach"] = reach(recipe, work / env / "warm-reach", None, args.reach)
            result[f"{env}_warm_reach"] = warm["reach"][f"pass@{args.reach}"]
            print(f"{env}: warm start sampled: pass@{args.reach} {result[f'{env}_warm_reach']:.3f}, a sample's "
                  f"success {warm['reach']['sample_success']:.3f}", flush=True)

        def one_seed(seed: int, recipe: Path = recipe, env: str = env, warm: dict[str, Any] = warm,
                     share: str = share) -> dict[str, Any]:
            tr = train(recipe, work / env / f"train-seed{seed}", seed, args.steps, args.minutes or MINUTES.get(env))
            after = evaluate(env, recipe, work / env / f"eval-seed{seed}", tr.pop("checkpoint"))
            print(f"{env} seed {seed}: GRPO {tr['steps']} steps in {tr['grpo_minutes']:.1f} min (reward "
                  f"{tr['reward_first5']:.2f} -> {tr['reward_last5']:.2f}); eval {warm['success']:.3f} -> "
                  f"{after['success']:.3f} ({after['turns_mean']} turns, {share} {after[share]})", flush=True)
            return {"seed": seed, "success_warm": warm["success"], "success_trained": after["success"],
                    "success_rise": round(after["success"] - warm["success"], 4), "after": after, **tr}

        with ThreadPoolExecutor(max_workers=1 if args.serial else len(seeds)) as pool:
            runs = list(pool.map(one_seed, seeds))
        per_env[env] = runs
        trained = statistics.fmean(r["success_trained"] for r in runs)
        result.update({f"{env}_success_warm": round(warm["success"], 4),
                       f"{env}_success_trained": round(trained, 4),
                       f"{env}_success_rise": round(trained - warm["success"], 4),
                       f"{env}_grpo_minutes": max(r["grpo_minutes"] for r in runs)})
        result["runs"][env] = {"warm": warm, "seeds": runs}
    png = args.png or args.json.with_suffix(".png")
    plot(per_env, png)
    result["png"] = str(png)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs",)}, indent=1))


if __name__ == "__main__":
    main()
