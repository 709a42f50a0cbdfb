"""GPU check (`make gpu-check`): the two engines for 2 GRPO steps each on one GPU, with the figures printed.

    python bench/gpu_check.py [--json bench/results/gpu_check.json] [--skip-verl] [--verl-timeout-s 360]

1. local engine: 2 GRPO steps of a tiny Qwen3 (the test suite's tiny setup: tokenizer trained on calculator
   transcripts, the real calculator MCP server) on `cuda`; prints seconds per step, reward, tokens/s, peak memory.
2. asynchronous local engine (`trainer.max_staleness_steps=1`): the trainer and its generator process share the
   GPU; 6 steps synchronous, then 6 asynchronous with the HF engine as the generator, then (where vLLM is
   importable) 6 asynchronous with the vLLM engine as the generator; prints each run's seconds per step (median after
   the first), the ratio to the synchronous run, weight-push and weight-load seconds, the largest staleness seen
   and the policy versions the generator loaded.
3. verl engine (only where vLLM and verl are importable): the same setup as a verl recipe (1 GPU, vLLM rollout,
   FSDP actor, rlfactory's agent loop), 2 steps in a subprocess with a time limit; prints wall time, exit status and
   the step metrics verl logged (from its console output).
Without CUDA it stops at once with exit status 2 and says so. Budget: under 8 minutes on one GPU (vLLM's and verl's
start-ups dominate). Left out: multi-GPU and multi-node runs (see docs/verl.md).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the tiny setup builder the trainer tests use


def _cuda() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


def local_check(root: Path, device: str = "cuda") -> dict[str, Any]:
    """2 GRPO steps on the local engine, on the GPU (`device="cpu"` runs the same check where there is none: the
    test suite does, so the script is known to work before a GPU is at hand)."""
    import torch
    from tiny_setup import build_tiny_setup

    from rlfactory.api import train
    from rlfactory.recipe.schema import Recipe

    path = build_tiny_setup(root / "local", hidden_size=64, num_layers=2)
    recipe = Recipe.from_yaml(path, ["trainer.total_steps=2", f"trainer.device={device}", "trainer.save_every_steps=0",
                                     f"trainer.output_dir={root / 'local' / 'run'}"])
    on_gpu = device.startswith("cuda")
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    summary = train(recipe)
    wall = time.perf_counter() - t0
    rows = [json.loads(ln) for ln in (Path(recipe.trainer.output_dir) / "metrics.jsonl").read_text().splitlines()
            if ln.strip()]
    return {"ok": len(rows) == 2, "wall_s": wall, "steps": len(rows),
            "step_s": [r.get("perf/step_s") for r in rows],
            "reward_mean": [r.get("reward/mean") for r in rows],
            "tokens_per_s": [r.get("perf/tokens_per_s") for r in rows],
            "peak_gpu_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else 0.0,
            "summary": {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}}


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def async_check(root: Path, device: str = "cuda", engines: tuple[str, ...] | None = None,
                steps: int = 6) -> dict[str, Any]:
    """The asynchronous local engine beside the synchronous one on the same tiny setup: `steps` GRPO steps each, as
    `rlfactory train` runs them (a subprocess each, so the generator process and its engine start as for a user).
    `engines`: the generators to try (default: hf, and vllm where it is importable)."""
    from tiny_setup import build_tiny_setup

    if engines is None:
        engines = ("hf", "vllm") if importlib.util.find_spec("vllm") is not None else ("hf",)
    path = build_tiny_setup(root / "async", hidden_size=64, num_layers=2)
    runs: dict[str, Any] = {}
    for name, sets in [("sync", ["trainer.max_staleness_steps=0"])] + [
            (f"async_{e}", ["trainer.max_staleness_steps=1", f"rollout.engine={e}"]) for e in engines]:
        out = root / "async" / name
        cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(path), "--output-dir", str(out),
               "--set", f"trainer.total_steps={steps}", "--set", f"trainer.device={device}",
               "--set", "trainer.save_every_steps=0"]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
        wall = time.perf_counter() - t0
        metrics = out / "metrics.jsonl"
        rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()] if metrics.exists() else []
        run = {"ok": proc.returncode == 0 and len(rows) == steps, "exit": proc.returncode, "process_s": wall,
               "steps": len(rows), "step_s_median": _median([r.get("perf/step_s") for r in rows[1:]]),
               "reward_mean": [r.get("reward/mean") for r in rows]}
        if name != "sync":
            run.update(weight_push_s_median=_median([r.get("async/weight_push_s") for r in rows[1:]]),
                       weight_load_s_median=_median([r.get("async/weight_load_s") for r in rows[1:]]),
                       weight_loads=sum(r.get("async/weight_loads") or 0 for r in rows),
                       staleness_token_max=max((r.get("async/staleness_token_max") or 0 for r in rows), default=None))
        if proc.returncode != 0:
            run["log_tail"] = (proc.stdout + proc.stderr)[-3000:]
        runs[name] = run
    sync_step = runs["sync"]["step_s_median"]
    for name, run in runs.items():
        if name != "sync" and run["step_s_median"] and sync_step:
            run["step_ratio_to_sync"] = sync_step / run["step_s_median"]
    return {"ok": all(r["ok"] for r in runs.values()), "engines": list(engines), "runs": runs}


_VERL_METRIC = re.compile(r"step:(\d+) - (.*)")


def verl_command(root: Path) -> list[str]:
    """The `rlfactory train --engine verl` command line of the verl half (the tiny setup written under
    `root/verl`); with `--dry-run` appended it runs on CPU, which the test suite does."""
    from tiny_setup import build_tiny_setup

    path = build_tiny_setup(root / "verl", hidden_size=64, num_layers=2)
    return [sys.executable, "-m", "rlfactory.cli", "train", str(path), "--engine", "verl",
            "--output-dir", str(root / "verl" / "run"),
            "--set", "verl.device=cuda", "--set", "trainer.total_steps=2", "--set", "verl.gpus_per_node=1",
            "--set", "verl.nnodes=1",
            "--set", "verl.gpu_memory_utilization=0.3", "--set", "trainer.prompts_per_step=4",
            "--set", "algorithm.micro_batch_size=4", "--set", "trainer.save_every_steps=0"]


def verl_check(root: Path, timeout_s: int) -> dict[str, Any]:
    """2 verl steps on one GPU in a subprocess (Ray and vLLM start there and are torn down with it)."""
    missing = [m for m in ("vllm", "verl", "ray") if importlib.util.find_spec(m) is None]
    if missing:
        return {"ok": False, "skipped": f"not installed: {', '.join(missing)}"}
    cmd = verl_command(root)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
        code, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, log = "timeout", (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    wall = time.perf_counter() - t0
    (root / "verl_log.txt").write_text(log)
    steps = {}
    for m in _VERL_METRIC.finditer(log):
        pairs = dict(kv.split(":", 1) for kv in m.group(2).split(" - ") if ":" in kv)
        steps[int(m.group(1))] = {k: pairs[k] for k in pairs if k.startswith(("timing_s/gen", "timing_s/step",
                                                                            "critic/score/mean", "actor/pg_loss",
                                                                            "response_length/mean"))}
    return {"ok": code == 0 and len(steps) >= 2, "exit": code, "wall_s": wall, "steps": steps,
            "log_tail": log[-3000:] if code != 0 else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--skip-verl", action="store_true")
    ap.add_argument("--verl-timeout-s", type=int, default=360)
    args = ap.parse_args()
    gpu = _cuda()
    if gpu is None:
        print("gpu-check: no CUDA GPU visible (torch.cuda.is_available() is false); nothing was run. "
              "Run `make gpu-check` on a machine with an NVIDIA GPU.", file=sys.stderr)
        return 2
    print(f"gpu-check on {gpu}")
    result: dict[str, Any] = {"gpu": gpu}
    with tempfile.TemporaryDirectory(prefix="rlf-gpu-check-") as tmp:
        root = Path(tmp)
        result["local"] = local = local_check(root)
        print(f"local engine: {local['steps']} GRPO steps in {local['wall_s']:.1f}s; step_s {local['step_s']}; "
              f"reward {local['reward_mean']}; tokens/s {local['tokens_per_s']}; "
              f"peak GPU memory {local['peak_gpu_mem_gb']:.2f} GiB")
        result["async"] = asy = async_check(root)
        for name, run in asy["runs"].items():
            extra = (f"; sync/async step {run.get('step_ratio_to_sync', float('nan')):.2f}x, push "
                     f"{run['weight_push_s_median']} s, load {run['weight_load_s_median']} s, "
                     f"{run['weight_loads']} loads, staleness max {run['staleness_token_max']}"
                     if name != "sync" else "")
            print(f"{name}: exit {run['exit']}, {run['steps']} steps in {run['process_s']:.1f}s (command); step "
                  f"{run['step_s_median']} s (median){extra}")
            if run.get("log_tail"):
                print(f"{name} log tail:\n" + run["log_tail"])
        if args.skip_verl:
            result["verl"] = {"ok": False, "skipped": "--skip-verl"}
        else:
            result["verl"] = verl = verl_check(root, args.verl_timeout_s)
            if verl.get("skipped"):
                print(f"verl engine: skipped ({verl['skipped']})")
            else:
                print(f"verl engine: exit {verl['exit']} after {verl['wall_s']:.1f}s; steps {verl['steps']}")
                if verl["log_tail"]:
                    print("verl log tail:\n" + verl["log_tail"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
    ok = result["local"]["ok"] and result["async"]["ok"] and (result["verl"]["ok"] or "skipped" in result["verl"])
    print("gpu-check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
