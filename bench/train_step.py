"""Training-step benchmark for the local engine: where a GRPO step's time goes, and tokens/s, on the quickstart.

    python bench/train_step.py --json bench/results/train_step.json [--steps 4] [--threads 1,2] [--rounds 2]
    python bench/train_step.py --json out.json --caches [--steps 30]     # prefix cache + shared prompts on vs off

Runs `recipes/quickstart.yaml` (the warm 3.3 M-parameter Qwen3 and the real calculator MCP server) for `--steps`
steps per torch thread count, `--rounds` times interleaved (1, 2, 1, 2, ...) in one process run, each from the same
start and seed. Per step it
reads the trainer's own stage timers from metrics.jsonl:
- `rollout_s`: the rollout stage (wall), split into `engine_busy_s` (the HF engine's forward passes and sampling)
  and the rest (`rollout_other_s`: waiting on tool calls, chat-template deltas, scheduling);
- `tool_latency_s`: summed latency of the step's tool calls (they overlap with each other and with generation);
- `reward_s`: reward functions; `update_s`: advantages + forward/backward + optimizer step;
- `tokens_per_s`: policy tokens generated per second of the whole step; `rollout_tokens_per_s`: response tokens
  (policy + tool) per second of the rollout stage.
Medians over steps after the first (which includes warm-up) are reported, and `threads_speedup` = step time with the
first thread count / with each other one. `--caches` compares instead, at the first thread count, the defaults
against `rollout.prefix_cache=false algorithm.shared_prompt_forward=false` (the HF engine's prefix cache and the
update's shared prompt forward both off), interleaved the same way, and reports `cache_speedup` (off / on) for the
step, the rollout and the update. When models/quickstart-calc does not exist yet (make it with
`rlfactory sft recipes/quickstart_sft.yaml`), a random model of the same shape is used and the output says so.

    python bench/train_step.py --json out.json --memory [--rounds 2] [--workloads quickstart,textcraft] [--steps N]

`--memory` compares the update's response logprobs computed on whole `[N, T, V]` logits (`before`: the dense path
for every size, `grpo.DENSE_MAX_LOGITS = inf`) against the default (`after`: chunks of tokens above the threshold,
algorithms/token_logprobs.py), each run in a fresh subprocess, and reports `peak_rss_mb` (the process's maximum
resident set, `ru_maxrss`) and the update (and step) time of each, with `peak_ratio` (before / after) and
`update_time_ratio` / `step_time_ratio` (after / before); `--rounds` runs of each, interleaved, medians.
Workloads (`MEMORY_WORKLOADS`): `quickstart` is `--steps` real steps of the quickstart (rollouts
included; `step_s` and `update_s` are medians after the first step); the others run the trainer's update alone
(`Update.whole_batch`) `--steps` times on one step of synthetic trajectories of the workload's lengths (random
tokens, policy turns between tool turns, half of each group rewarded), so that every row is trained:
`textcraft` is recipes/textcraft_learn.yaml's model (2,311 words, micro-batches of 32) at 12-turn lengths,
`qwen3` the tiny random Qwen3 with Qwen3's 151,936-row head (`model.path=tiny-random`) on 8 rows of 512 tokens,
and `qwen3_4k` the same on 8 rows of 4,096 tokens, `after` only (the dense path would need ~20 GB per copy of the
logits).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


CACHES_OFF = ["rollout.prefix_cache=false", "algorithm.shared_prompt_forward=false"]


def _recipe(path: Path, steps: int, threads: int, out: Path, model_override: Path | None,
            extra: list[str] | None = None) -> Any:
    from rlfactory.recipe.schema import Recipe

    sets = [f"trainer.total_steps={steps}", f"trainer.torch_threads={threads}", f"trainer.output_dir={out}",
            "trainer.save_every_steps=0", "trainer.eval_every_steps=0", "trainer.log.tensorboard=false",
            *(extra or [])]
    if model_override is not None:
        sets.append(f"model.path={model_override}")
    return Recipe.from_yaml(path, sets)


def _random_quickstart_shape(tmp: Path) -> Path:
    """A random Qwen3 of the quickstart's shape with a tokenizer trained on calculator transcripts."""
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_setup import build_tiny_setup  # noqa: PLC0415

    build_tiny_setup(tmp, hidden_size=256, num_layers=4, vocab_size=640, tokenizer_tasks=400)
    return tmp / "model"


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_config(recipe_path: Path, steps: int, threads: int, tmp: Path, model_override: Path | None,
               rnd: int, extra: list[str] | None = None, tag: str = "") -> list[dict]:
    """One training run; its metrics rows after the first step (which pays for warm-up)."""
    from rlfactory.trainer.loop import train_local

    out = tmp / f"threads{threads}{tag}-round{rnd}"
    train_local(_recipe(recipe_path, steps, threads, out, model_override, extra))
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return rows[1:] if len(rows) > 1 else rows


def summarise(body: list[dict]) -> dict:
    per = {
        "step_s": [r["perf/step_s"] for r in body],
        "rollout_s": [r["perf/rollout_s"] for r in body],
        "engine_busy_s": [r.get("perf/engine_busy_s", 0.0) for r in body],
        "rollout_other_s": [r["perf/rollout_s"] - r.get("perf/engine_busy_s", 0.0) for r in body],
        "tool_latency_s": [r.get("tools/latency_mean_s", 0.0) * r.get("tools/calls", 0) for r in body],
        "reward_s": [r["perf/reward_s"] for r in body],
        "update_s": [r["perf/update_s"] for r in body],
        "tokens_per_s": [r["perf/tokens_per_s"] for r in body],
        "rollout_tokens_per_s": [r.get("perf/rollout_tokens_per_s", 0.0) for r in body],
        "tool_calls": [r.get("tools/calls", 0) for r in body],
    }
    res = {k: _median(v) for k, v in per.items()}
    res["steps_measured"] = len(body)
    res["reward_mean"] = _median([r["reward/mean"] for r in body])
    return res


QWEN3_VOCAB = ["model.path=tiny-random", "algorithm.micro_batch_size=8", "trainer.prompts_per_step=2",
               "rollout.samples_per_prompt=4"]
"""The tiny random Qwen3 (Qwen3's 151,936-row head, hidden 64) on one micro-batch of 2 prompts x 4 samples."""

MEMORY_WORKLOADS: dict[str, dict[str, Any]] = {
    "quickstart": {"recipe": "recipes/quickstart.yaml", "real_steps": True, "steps": 5},
    "textcraft": {"recipe": "recipes/textcraft_learn.yaml", "steps": 2, "prompt_tokens": 400,
                  "response_tokens": 1100, "policy_span": 35, "tool_span": 55},  # ~1,500 tokens: 12 turns
    "qwen3": {"recipe": "recipes/quickstart.yaml", "sets": QWEN3_VOCAB, "steps": 2, "prompt_tokens": 128,
              "response_tokens": 384, "policy_span": 48, "tool_span": 32},
    "qwen3_4k": {"recipe": "recipes/quickstart.yaml", "sets": QWEN3_VOCAB, "steps": 1, "prompt_tokens": 512,
                 "response_tokens": 3584, "policy_span": 48, "tool_span": 32, "paths": ["after"]},
}
"""What `--memory` measures, with its default steps; the synthetic ones give their prompt and (longest) response
lengths in tokens."""


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _synthetic_step(spec: dict, vocab: int, prompts: int, samples: int) -> list[Any]:
    """One step of trajectories of the workload's lengths: responses of 70-100 % of `response_tokens`, in turns of
    `policy_span` policy tokens and `tool_span` tool tokens (loss mask 0), rewards 1 on half of each group."""
    from rlfactory.rollout.trajectory import Trajectory

    rng = random.Random(0)
    out = []
    for g in range(prompts):
        prompt = [rng.randrange(vocab) for _ in range(spec["prompt_tokens"])]
        for k in range(samples):
            length = rng.randint(int(0.7 * spec["response_tokens"]), spec["response_tokens"])
            period = spec["policy_span"] + spec["tool_span"]
            mask = [1 if i % period < spec["policy_span"] else 0 for i in range(length)]
            out.append(Trajectory(
                id=f"{g}/{k}", task_id=str(g), group_id=str(g), sample_index=k, prompt_ids=prompt,
                response_ids=[rng.randrange(vocab) for _ in range(length)], loss_mask=mask,
                logprobs=[-2.0 if m else 0.0 for m in mask], reward=float(k % 2)))
    return out


def memory_child(name: str, path: str, steps: int, result: Path) -> None:
    """One workload on one logprob path, in this (fresh) process; writes its figures to `result`."""
    from rlfactory.algorithms import grpo

    if path == "before":
        grpo.DENSE_MAX_LOGITS = math.inf
    spec = MEMORY_WORKLOADS[name]
    recipe_path = REPO / spec["recipe"]
    with tempfile.TemporaryDirectory(prefix="rlf-bench-mem-") as d:
        tmp = Path(d)
        out: dict[str, Any] = {"workload": name, "path": path}
        if spec.get("real_steps"):
            from rlfactory.recipe.schema import Recipe

            override = None
            if not Path(Recipe.from_yaml(recipe_path).model.path).is_dir():
                override = _random_quickstart_shape(tmp / "random")
            body = run_config(recipe_path, steps, 1, tmp, override, 0, tag=path)
            out.update(step_s=_median([r["perf/step_s"] for r in body]),
                       update_s=_median([r["perf/update_s"] for r in body]), steps_measured=len(body))
        else:
            from rlfactory.trainer.policy import Policy
            from rlfactory.trainer.update import Update

            recipe = _recipe(recipe_path, steps, 1, tmp / "run", None, spec.get("sets"))
            policy = Policy.load(recipe)
            update = Update(policy)
            trajs = _synthetic_step(spec, int(policy.model.config.vocab_size), recipe.trainer.prompts_per_step,
                                    recipe.rollout.samples_per_prompt)
            out["rows"], out["tokens"] = len(trajs), sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
            out["peak_rss_before_update_mb"] = _peak_rss_mb()
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                update.whole_batch(trajs)
                times.append(time.perf_counter() - t0)
            out.update(update_s=_median(times), update_s_each=times)
    out["peak_rss_mb"] = _peak_rss_mb()
    result.write_text(json.dumps(out))


def run_memory(workloads: list[str], steps: int | None, rounds: int) -> dict:
    """Every workload x path in a fresh subprocess, `rounds` times, paths interleaved; per workload the medians."""
    runs: dict[str, dict[str, list[dict]]] = {w: {} for w in workloads}
    with tempfile.TemporaryDirectory(prefix="rlf-bench-mem-") as d:
        for rnd in range(rounds):
            for w in workloads:
                for path in MEMORY_WORKLOADS[w].get("paths", ["before", "after"]):
                    res = Path(d) / f"{w}-{path}-{rnd}.json"
                    n = steps or MEMORY_WORKLOADS[w]["steps"]
                    cmd = [sys.executable, __file__, "--memory-child", w, "--path", path, "--steps", str(n),
                           "--json", str(res)]
                    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
                    if proc.returncode != 0:
                        raise RuntimeError(f"{w} ({path}) failed:\n{proc.stderr[-3000:]}")
                    runs[w].setdefault(path, []).append(json.loads(res.read_text()))
                    print(f"{w} {path}: {runs[w][path][-1]}", flush=True)
    results: dict[str, dict] = {}
    for w, by_path in runs.items():
        results[w] = {}
        for path, rs in by_path.items():
            merged = {k: _median([r[k] for r in rs]) for k in rs[0] if isinstance(rs[0][k], (int, float))}
            merged["runs"] = rs
            results[w][path] = merged
        if "before" in by_path and "after" in by_path:
            b, a = results[w]["before"], results[w]["after"]
            results[w]["peak_ratio"] = b["peak_rss_mb"] / a["peak_rss_mb"]
            for k in ("update_s", "step_s"):
                if k in a:
                    results[w][f"{k.removesuffix('_s')}_time_ratio"] = a[k] / b[k]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "quickstart.yaml"))
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 4; with --memory, per workload)")
    ap.add_argument("--threads", default="1,2", help="torch thread counts to compare, e.g. 1,2")
    ap.add_argument("--rounds", type=int, default=2, help="runs per thread count, interleaved (1,2,1,2,...)")
    ap.add_argument("--caches", action="store_true",
                    help="compare the prefix cache + shared prompt forward (defaults) against both off")
    ap.add_argument("--memory", action="store_true",
                    help="peak RSS and step time of the update, logits whole (before) against in chunks (after)")
    ap.add_argument("--workloads", default=",".join(MEMORY_WORKLOADS), help="with --memory: which workloads")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    ap.add_argument("--path", choices=["before", "after"], help=argparse.SUPPRESS)
    ap.add_argument("--json", required=True, help="where to write the results")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.memory_child:
        memory_child(args.memory_child, args.path, args.steps, Path(args.json))
        return
    if args.memory:
        workloads = [w for w in args.workloads.split(",") if w]
        results = run_memory(workloads, args.steps, args.rounds)
        mem = {"steps": {w: args.steps or MEMORY_WORKLOADS[w]["steps"] for w in workloads}, "rounds": args.rounds,
               "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "memory": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(mem, indent=1))
        for w, r in results.items():
            line = ", ".join(f"{p} {r[p]['peak_rss_mb']:.0f} MB / update {r[p]['update_s']:.2f} s"
                             + (f" / step {r[p]['step_s']:.2f} s" if "step_s" in r[p] else "")
                             for p in ("before", "after") if p in r)
            ratios = ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k.endswith("_ratio"))
            print(f"{w}: {line}{'; ' + ratios if ratios else ''}")
        return
    args.steps = args.steps or 4
    from rlfactory.recipe.schema import Recipe

    recipe_path = Path(args.recipe)
    threads = [int(x) for x in args.threads.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="rlf-bench-train-") as d:
        tmp = Path(d)
        model_dir = Path(Recipe.from_yaml(recipe_path).model.path)
        override = None
        if not model_dir.is_dir():
            print(f"note: {model_dir} does not exist; using a random model of the quickstart's shape")
            override = _random_quickstart_shape(tmp / "random")
        if args.caches:
            variants = {"caches_on": [], "caches_off": CACHES_OFF}
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            for rnd in range(args.rounds):  # interleaved, so drifting machine load hits both alike
                for name, extra in variants.items():
                    runs[name] += run_config(recipe_path, args.steps, threads[0], tmp, override, rnd, extra, name)
            results = {name: summarise(rows) for name, rows in runs.items()}
        else:
            rows: dict[int, list[dict]] = {n: [] for n in threads}
            for rnd in range(args.rounds):  # interleaved, so drifting machine load hits every thread count alike
                for n in threads:
                    rows[n] += run_config(recipe_path, args.steps, n, tmp, override, rnd)
            results = {f"threads_{n}": summarise(rows[n]) for n in threads}
    out = {
        "recipe": str(recipe_path), "model": "random (quickstart shape)" if override else str(model_dir),
        "steps": args.steps, "rounds": args.rounds, "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0], "results": results,
    }
    if args.caches:
        on, off = results["caches_on"], results["caches_off"]
        out["cache_speedup"] = {k: off[f"{k}_s"] / on[f"{k}_s"] for k in ("step", "rollout", "update")}
    else:
        base = results[f"threads_{threads[0]}"]["step_s"]
        out["threads_speedup"] = {f"{threads[0]}->{n}": base / results[f"threads_{n}"]["step_s"] for n in threads[1:]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    for name, r in results.items():
        print(f"{name}: step {r['step_s']:.2f}s = rollout {r['rollout_s']:.2f}s (engine {r['engine_busy_s']:.2f}s, "
              f"other/tools {r['rollout_other_s']:.2f}s) + reward {r['reward_s']:.3f}s + update {r['update_s']:.2f}s; "
              f"{r['tokens_per_s']:.0f} policy tok/s, {r['tool_calls']:.0f} tool calls/step")
    for k, v in out.get("threads_speedup", {}).items():
        print(f"threads {k}: step-time ratio {v:.2f} (>1 means more threads is faster)")
    for k, v in out.get("cache_speedup", {}).items():
        print(f"caches: {k} time off / on = {v:.2f}")


if __name__ == "__main__":
    main()
