"""The same recipe on both engines, in one run, on this CPU machine: where a GRPO step's time goes on the local
engine and on verl's own trainer, what verl's start-up costs, and the peak memory of each.

    python bench/verl_engine.py --json bench/results/verl_engine.json [--steps 4] [--recipe recipes/quickstart.yaml]

Each engine runs `rlfactory train RECIPE --engine E --set trainer.total_steps=N` as a user would (a fresh process,
its own run folder), one after the other. From the run's own metrics.jsonl, medians over the steps after the first
(which pays for warm-up), in seconds per step:
- `*_generation_s`: generating the step's trajectories, tool calls included (local: the rollout stage; verl:
  `timing_s/gen`);
- `*_tools_s`: of that, the tool calls' mean latency times their number (they overlap generation);
- `*_update_s`: the policy update (local: advantages, forward/backward, optimizer; verl: `timing_s/old_log_prob` +
  `timing_s/adv` + `timing_s/update_actor`);
- `*_weight_sync_s`: getting the new weights to the generator (local: 0, the HF engine generates with the trainer's
  own model object; verl: `timing_s/update_weights`, the shared-memory copy into vLLM);
- `*_step_s`: the whole step.
`verl_startup_s` is the process's wall time before its first step began (Ray, TransferQueue, FSDP, vLLM, the first
weight sync); `local_startup_s` likewise. `*_peak_memory_gb` is the peak of the summed proportional set size (PSS:
a page shared by n processes counts 1/n in each, so shared libraries and Ray's object store are not counted once per
worker) of the process and all its descendants (for verl: the local Ray cluster and every worker), sampled every
0.5 s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent


class PeakMemory:
    """The peak summed PSS of a process tree, sampled in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for p in procs:
                try:
                    total += p.memory_full_info().pss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_engine(engine: str, recipe: str, steps: int, out: Path) -> tuple[list[dict[str, Any]], float, float]:
    """One training run; returns its metrics rows, its wall time and its peak memory (PSS, bytes)."""
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", recipe, "--engine", engine, "--output-dir", str(out),
           "--set", f"trainer.total_steps={steps}", "--set", "trainer.save_every_steps=0",
           "--set", "trainer.log.tensorboard=false"]
    log = open(out.parent / f"{engine}.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with PeakMemory(proc.pid) as memory:
        code = proc.wait()
    wall = time.perf_counter() - t0
    log.close()
    if code != 0:
        raise SystemExit(f"{engine} run failed (exit {code}): {Path(log.name).read_text()[-3000:]}")
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return rows, wall, memory.peak


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _tools_s(r: dict[str, Any]) -> float:
    return r.get("tools/latency_mean_s", 0.0) * r.get("tools/calls", 0)


def local_figures(rows: list[dict[str, Any]], wall: float) -> dict[str, float]:
    body = rows[1:]
    return {
        "local_generation_s": _median([r["perf/rollout_s"] for r in body]),
        "local_tools_s": _median([_tools_s(r) for r in body]),
        "local_update_s": _median([r["perf/update_s"] for r in body]),
        "local_weight_sync_s": 0.0,
        "local_step_s": _median([r["perf/step_s"] for r in body]),
        "local_startup_s": wall - sum(r["perf/step_s"] for r in rows),
        "local_reward_mean": _median([r["reward/mean"] for r in rows]),
    }


def verl_figures(rows: list[dict[str, Any]], wall: float) -> dict[str, float]:
    body = rows[1:]
    return {
        "verl_generation_s": _median([r["timing_s/gen"] for r in body]),
        "verl_tools_s": _median([_tools_s(r) for r in body]),
        "verl_update_s": _median([r.get("timing_s/old_log_prob", 0.0) + r.get("timing_s/adv", 0.0)
                                  + r["timing_s/update_actor"] for r in body]),
        "verl_weight_sync_s": _median([r["timing_s/update_weights"] for r in body]),
        "verl_step_s": _median([r["timing_s/step"] for r in body]),
        "verl_startup_s": wall - sum(r["timing_s/step"] for r in rows),
        "verl_reward_mean": _median([r["reward/mean"] for r in rows]),
        "verl_rollout_actor_probs_pearson_corr_min": min(r["training/rollout_actor_probs_pearson_corr"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "quickstart.yaml"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", required=True, help="where to write the results")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlf-bench-verl-") as d:
        tmp = Path(d)
        local_rows, local_wall, local_mem = run_engine("local", args.recipe, args.steps, tmp / "local")
        verl_rows, verl_wall, verl_mem = run_engine("verl", args.recipe, args.steps, tmp / "verl")
    out: dict[str, Any] = {"recipe": args.recipe, "steps": args.steps, "cpu_count": os.cpu_count(),
                           "load_avg_1m": os.getloadavg()[0]}
    out.update(local_figures(local_rows, local_wall))
    out.update(verl_figures(verl_rows, verl_wall))
    out["local_peak_memory_gb"] = local_mem / 2**30
    out["verl_peak_memory_gb"] = verl_mem / 2**30
    out["verl_vs_local_step_ratio"] = out["verl_step_s"] / out["local_step_s"]
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    for engine in ("local", "verl"):
        print(f"{engine}: step {out[f'{engine}_step_s']:.2f}s = generation {out[f'{engine}_generation_s']:.2f}s "
              f"(tools {out[f'{engine}_tools_s']:.3f}s) + update {out[f'{engine}_update_s']:.2f}s + weight sync "
              f"{out[f'{engine}_weight_sync_s']:.3f}s; start-up {out[f'{engine}_startup_s']:.0f}s; peak "
              f"{out[f'{engine}_peak_memory_gb']:.1f} GiB")
    print(f"verl/local step-time ratio: {out['verl_vs_local_step_ratio']:.2f}")


if __name__ == "__main__":
    main()
