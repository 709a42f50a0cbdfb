"""What turn-level credit and branched groups add on top of the strongest warm start, against flat GRPO, for the
same wall-clock budget of RL (BabyAI and TextCraft, 2 cores).

    python bench/credit.py --json bench/results/credit.json [--envs babyai,textcraft] [--seeds 0,1] [--minutes 15]
                           [--method turn|branch|both|returns|skip] [--ablation | --methods turn,branch]
                           [--warm babyai=DIR,textcraft=DIR] [--reach K]

Everything runs through the commands a user runs, each in its own process, on the shipped learning recipes
(`recipes/<env>_learn.yaml`) started from the strongest warm start the project's commands make (`models/babyai-namer`
and `models/textcraft-reader`: the stage-1 models of the two-stage warm starts, which the shipped GRPO recipes
weaken on purpose; `--warm` names others):
    rlfactory eval  recipes/<env>_learn.yaml --checkpoint WARM                        (greedy, held-out tasks)
    rlfactory train recipes/<env>_learn.yaml --set model.path=WARM --set trainer.max_minutes=M [method's --set]
    rlfactory eval  recipes/<env>_learn.yaml --checkpoint RUN/checkpoints/step_N
The seeds of a method train at the same time (each one torch thread, its own tool server: about one core each),
methods one after another, for the same `--minutes` of training each (`trainer.max_minutes`; `total_steps` is set
out of reach). Methods (recipe overrides):
- `grpo`: flat GRPO, the recipe as shipped;
- `turn`: `algorithm.turn_credit.estimator=anchors` (GiGPO-shaped step groups from the environments' states);
- `branch`: `rollout.branching` with 2 roots of 4 branches after `AT_TURN[env]` turns (a baseline per branch point);
- `both`: the two together (per-turn advantages on each branch's own turns, the branch point's on the shared ones);
- `returns`: `algorithm.turn_credit.estimator=returns` (each turn's return-to-go against the other samples' at that
  turn), with the environment's progress as a process reward (`PROGRESS`: `env_progress` at weight 0.2; BabyAI's
  mission objects found, TextCraft's craftable ingredients crafted); not in `--ablation`;
- `skip`: flat GRPO whose draws pass over the tasks whose last group scored alike, for `SKIP_EPOCHS` epochs' worth
  of draws (`data.skip_settled_epochs`, trainer/settled.py): more of the budget on groups with a signal; not in
  `--ablation`.
`--method` names the shipped one (the `<env>_method` keys); `--ablation` runs the other two as well.
Reported per method and environment, means over the seeds: held-out greedy success of the last checkpoint, the
policy's generated tokens (`rollout/generated_tokens`: a branch's copy of its root's tokens counted once), training
minutes and steps, success per million generated tokens, the held-out tasks gained and lost against the warm
start (which tells a run that changed nothing from one whose gains and losses cancel); and `<env>_tokens_ratio`: the
tokens the shipped method generated until a checkpoint of it first reached flat GRPO's final success (the same
seed's), over flat GRPO's total (checkpoints at a quarter, half, three quarters and the end of the run are
evaluated; `null` when none reached it).
`--reach K` (default 8; 0 skips it) also plays each held-out task K times at temperature 1.0 from the warm start:
`<env>_warm_reach` is its pass@K, and `<env>_goal_within_reach` says whether that is >= 0.10 above its greedy
success. RL sharpens what the policy already samples; when no sample of the warm start solves the tasks the goal
needs, the goal asks RL for a behaviour the start never shows, not for a better choice among those it shows.
Goal (issue 37): on both environments the method lifts success >= 0.10 above the warm start, and beats flat GRPO by
>= 0.05 or reaches its final success with <= 0.6x its generated tokens (`<env>_goal_met`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_learning import RECIPES, _run, evaluate, reach  # noqa: E402  (this folder's figures, the same commands)

REPO = Path(__file__).resolve().parent.parent
WARM = {"babyai": REPO / "models" / "babyai-namer", "textcraft": REPO / "models" / "textcraft-reader"}
SFT = {"babyai": "recipes/babyai_learn_namer_sft.yaml", "textcraft": "recipes/textcraft_learn_reader_sft.yaml"}
AT_TURN = {"babyai": 1, "textcraft": 2}
"""Where branching forks the roots: BabyAI's macro episodes are 1-3 turns; TextCraft's asking episodes 4-8."""
PROGRESS = {"babyai": ["rewards.functions.1.weight=0.2"], "textcraft": ["rewards.functions.1.weight=0.2"]}
"""`returns`' process reward: the recipe's `env_progress` entry weighted (BabyAI: the mission's objects found;
TextCraft: its craftable ingredients crafted)."""
SKIP_EPOCHS = 3
"""`skip`'s `data.skip_settled_epochs`: in a 15-minute BabyAI run (~175 steps of 8 of its 512 tasks; the first pass
64 steps) a task settled in the first pass sits out the three short passes over the tasks that still spread."""
ABLATION = ("turn", "branch", "both")
"""What `--ablation` runs beside the shipped method."""
METHODS = (*ABLATION, "returns", "skip")
SAVE_EVERY = 5


def methods(env: str) -> dict[str, list[str]]:
    return {"grpo": [], "turn": ["algorithm.turn_credit.estimator=anchors"],
            "branch": ["rollout.branching.width=4", f"rollout.branching.at_turn={AT_TURN[env]}"],
            "both": ["algorithm.turn_credit.estimator=anchors", "rollout.branching.width=4",
                     f"rollout.branching.at_turn={AT_TURN[env]}"],
            "returns": ["algorithm.turn_credit.estimator=returns", *PROGRESS[env]],
            "skip": [f"data.skip_settled_epochs={SKIP_EPOCHS}"]}


def train(env: str, warm: Path, out: Path, seed: int, minutes: float, sets: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(RECIPES[env]), "--output-dir", str(out)]
    for s in [f"model.path={warm}", f"trainer.seed={seed}", f"trainer.max_minutes={minutes}",
              "trainer.total_steps=100000", f"trainer.save_every_steps={SAVE_EVERY}", "trainer.keep_checkpoints=1000",
              *sets]:
        cmd += ["--set", s]
    _run(cmd, out.parent / f"{out.name}.log")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    tokens, total = [], 0.0
    for r in rows:
        total += r.get("rollout/generated_tokens", 0.0)
        tokens.append(total)
    return {"steps": len(rows), "minutes": round(summary["wall_s"] / 60, 2), "tokens_by_step": tokens,
            "generated_tokens": int(total), "checkpoints": sorted((out / "checkpoints").glob("step_*")),
            "reward_first5": round(statistics.fmean(r["reward/mean"] for r in rows[:5]), 3),
            "reward_last5": round(statistics.fmean(r["reward/mean"] for r in rows[-5:]), 3)}


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.split("_")[1])


def run_method(env: str, name: str, sets: list[str], warm: Path, seeds: list[int], minutes: float, work: Path,
               curve: bool, warm_solved: list[str]) -> list[dict[str, Any]]:
    """The method's seeds at once; each: its final eval, the held-out tasks it solves that the warm start did not
    (`gained`) and the other way round (`lost`), and (`curve`) evals of checkpoints along the run."""
    def one(seed: int) -> dict[str, Any]:
        tr = train(env, warm, work / env / f"{name}-seed{seed}", seed, minutes, sets)
        ckpts = tr.pop("checkpoints")
        final = evaluate(env, RECIPES[env], work / env / f"{name}-seed{seed}-eval-final", ckpts[-1])
        points = [{"step": _step_of(ckpts[-1]), "success": final["success"]}]
        if curve and len(ckpts) > 1:
            picks = sorted({ckpts[min(len(ckpts) - 1, round(f * (len(ckpts) - 1)))] for f in (0.25, 0.5, 0.75)}
                           - {ckpts[-1]}, key=_step_of)
            for c in picks:
                res = evaluate(env, RECIPES[env], work / env / f"{name}-seed{seed}-eval-{c.name}", c)
                points.append({"step": _step_of(c), "success": res["success"]})
        points.sort(key=lambda p: p["step"])
        for p in points:
            p["generated_tokens"] = int(tr["tokens_by_step"][p["step"] - 1])
        tr.pop("tokens_by_step")
        print(f"{env} {name} seed {seed}: {tr['steps']} steps in {tr['minutes']} min, {tr['generated_tokens']:,} "
              f"tokens; held-out success {final['success']:.3f} (curve {points})", flush=True)
        gained = sorted(set(final["solved"]) - set(warm_solved))
        lost = sorted(set(warm_solved) - set(final["solved"]))
        return {"seed": seed, "success": final["success"], "final": final, "curve": points, "gained": gained,
                "lost": lost, **tr}

    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        return list(pool.map(one, seeds))


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    success = statistics.fmean(r["success"] for r in runs)
    tokens = statistics.fmean(r["generated_tokens"] for r in runs)
    return {"success": round(success, 4), "generated_tokens": int(tokens),
            "minutes": round(statistics.fmean(r["minutes"] for r in runs), 2),
            "steps": round(statistics.fmean(r["steps"] for r in runs), 1),
            "gained": round(statistics.fmean(len(r["gained"]) for r in runs), 2),
            "lost": round(statistics.fmean(len(r["lost"]) for r in runs), 2),
            "success_per_million_tokens": round(success / max(tokens, 1.0) * 1e6, 4)}


def tokens_ratio(method: list[dict[str, Any]], grpo: list[dict[str, Any]]) -> float | None:
    """Per seed: the method's generated tokens at its first evaluated checkpoint with success >= flat GRPO's final
    (same seed), over flat GRPO's total; the mean over seeds, None when a seed never reached it."""
    ratios = []
    for m, g in zip(sorted(method, key=lambda r: r["seed"]), sorted(grpo, key=lambda r: r["seed"])):
        hit = next((p for p in m["curve"] if p["success"] >= g["success"]), None)
        if hit is None:
            return None
        ratios.append(hit["generated_tokens"] / max(g["generated_tokens"], 1))
    return round(statistics.fmean(ratios), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--envs", default="babyai,textcraft")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--minutes", type=float, default=15.0, help="training budget of every run (trainer.max_minutes)")
    ap.add_argument("--method", default="turn", choices=list(METHODS), help="the shipped method")
    ap.add_argument("--ablation", action="store_true", help="also run the other methods")
    ap.add_argument("--methods", default="", help="comma-separated: run exactly these beside flat GRPO (the first "
                                                  "is the shipped one; overrides --method and --ablation)")
    ap.add_argument("--warm", default="", help="env=DIR,...: other warm starts")
    ap.add_argument("--reach", type=int, default=8, help="K: the warm start's pass@K at temperature 1.0 on the "
                                                         "held-out tasks (`<env>_warm_reach`; 0: skip)")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    envs = [e for e in args.envs.split(",") if e]
    warm_starts = dict(WARM)
    for item in [x for x in args.warm.split(",") if x]:
        env, _, path = item.partition("=")
        warm_starts[env] = Path(path).resolve()
    for env in envs:
        if env not in RECIPES:
            raise SystemExit(f"no learning recipe for {env} (known: {', '.join(RECIPES)})")
        if not (warm_starts[env] / "config.json").exists():
            raise SystemExit(f"{env}: no warm start at {warm_starts[env]}; make it with `rlfactory sft {SFT[env]}` "
                             f"and copy its output there (or pass --warm {env}=DIR)")
    seeds = [int(s) for s in args.seeds.split(",")]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="credit_"))
    chosen = [args.method] + ([m for m in ABLATION if m != args.method] if args.ablation else [])
    if args.methods:
        chosen = [m for m in args.methods.split(",") if m]
        unknown = sorted(set(chosen) - set(METHODS))
        if unknown:
            raise SystemExit(f"--methods: unknown {', '.join(unknown)} (known: {', '.join(METHODS)})")
        args.method = chosen[0]
    result: dict[str, Any] = {"seeds": seeds, "minutes": args.minutes, "method": args.method, "runs": {}}
    for env in envs:
        warm = evaluate(env, RECIPES[env], work / env / "warm", warm_starts[env])
        print(f"{env}: warm start {warm_starts[env].name}: held-out success {warm['success']:.3f}", flush=True)
        if args.reach:
            warm["reach"] = reach(RECIPES[env], work / env / "warm-reach", warm_starts[env], args.reach)
            result[f"{env}_warm_reach"] = warm["reach"][f"pass@{args.reach}"]
            result[f"{env}_goal_within_reach"] = bool(result[f"{env}_warm_reach"] - warm["success"] >= 0.10)
            print(f"{env}: warm start sampled: pass@{args.reach} {result[f'{env}_warm_reach']:.3f}", flush=True)
        table = methods(env)
        runs = {"grpo": run_method(env, "grpo", table["grpo"], warm_starts[env], seeds, args.minutes, work,
                                   curve=False, warm_solved=warm["solved"])}
        for name in chosen:
            runs[name] = run_method(env, name, table[name], warm_starts[env], seeds, args.minutes, work,
                                    curve=name == args.method, warm_solved=warm["solved"])
        per = {name: summarise(r) for name, r in runs.items()}
        shipped = per[args.method]
        ratio = tokens_ratio(runs[args.method], runs["grpo"])
        result.update({f"{env}_warm": round(warm["success"], 4), f"{env}_grpo": per["grpo"]["success"],
                       f"{env}_method": shipped["success"], f"{env}_tokens_ratio": ratio,
                       f"{env}_goal_met": bool(shipped["success"] - warm["success"] >= 0.10 and (
                           shipped["success"] - per["grpo"]["success"] >= 0.05
                           or (ratio is not None and ratio <= 0.6)))})
        result["runs"][env] = {"warm_start": str(warm_starts[env]), "warm": warm, "methods": per,
                               "seeds": {k: [{x: y for x, y in r.items() if x != "final"} for r in v]
                                         for k, v in runs.items()}}
        print(json.dumps({k: v for k, v in result.items() if k.startswith(env)}), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
