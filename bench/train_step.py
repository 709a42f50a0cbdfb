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
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "quickstart.yaml"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", default="1,2", help="torch thread counts to compare, e.g. 1,2")
    ap.add_argument("--rounds", type=int, default=2, help="runs per thread count, interleaved (1,2,1,2,...)")
    ap.add_argument("--caches", action="store_true",
                    help="compare the prefix cache + shared prompt forward (defaults) against both off")
    ap.add_argument("--json", required=True, help="where to write the results")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
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
