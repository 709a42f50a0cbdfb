"""GPU check (`make gpu-check`): the two engines for 2 GRPO steps each on one GPU, with the figures printed.

    python bench/gpu_check.py [--json bench/results/gpu_check.json] [--skip-verl] [--verl-timeout-s 360]

1. local engine: 2 GRPO steps of a tiny Qwen3 (the test suite's tiny setup: tokenizer trained on calculator
   transcripts, the real calculator MCP server) on `cuda`; prints seconds per step, reward, tokens/s, peak memory.
2. verl engine (only where vLLM and verl are importable): the same setup as a verl recipe (1 GPU, vLLM rollout,
   FSDP actor, rlfactory's agent loop), 2 steps in a subprocess with a time limit; prints wall time, exit status and
   the step metrics verl logged (from its console output).
Without CUDA it stops at once with exit status 2 and says so. Budget: under 8 minutes on one GPU (the verl part
dominates: Ray and vLLM start-up). Left out: multi-GPU and multi-node runs (see docs/verl.md).
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
    ok = result["local"]["ok"] and (result["verl"]["ok"] or "skipped" in result["verl"])
    print("gpu-check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
