"""The run-folder campaign of the chaos benchmark: several `rlfactory train` into one folder at once.

    python bench/chaos_runs.py --json bench/results/chaos_runs.json [--seed 0] [--quick]

Real `rlfactory train` subprocesses on the tiny test setup (tests/tiny_setup.py: a tiny Qwen3, the real calculator
MCP server). Each round (seeded: how many runs, their start offsets, steps and seeds):
- **race**: two or three runs started together into a folder that does not exist yet, each with its own seed;
- **live**: one run owns a folder and is paused (SIGSTOP) after its first checkpoint, so the others surely meet it
  alive whatever the machine's speed; a new run, a `--resume` and an `--overwrite` are started into it, then the
  owner continues and finishes.
A run that printed `done` must find its own results in the folder: metrics rows 1..N, summary.json, a whole
checkpoint of step N, and its own seed in recipe.yaml and the checkpoint's state. `concurrent_runs_lost` counts
the runs that printed success without that (results deleted or mixed by another run); it must be 0. The others must
be refused with a clear error (`refusals_naming_holder`: the error names the live holder's pid); any other failure
is counted in `unexpected_failures`.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # tiny_setup: the tests' tiny real setup
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
LIMIT_S = 300
"""Hang guard for one run (a tiny run takes seconds)."""


def _cmd(setup: Path, out: Path, *flags: str, steps: int, seed: int) -> list[str]:
    return [sys.executable, "-m", "rlfactory.cli", "train", str(setup / "recipe.yaml"), "--output-dir", str(out),
            *flags, "--set", f"trainer.total_steps={steps}", "--set", f"trainer.seed={seed}",
            "--set", "trainer.log.tensorboard=false"]


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _finish(proc: subprocess.Popen, log: Path) -> tuple[int, str]:
    try:
        rc = proc.wait(LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        rc = -9
    return rc, log.read_text(errors="replace")


def intact(out: Path, *, steps: int, seed: int) -> str | None:
    """Why `out` does not hold the whole results of the run with `seed` and `steps` (None: it does)."""
    from rlfactory.trainer.checkpoint import checkpoint_problem

    try:
        rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        if [r.get("step") for r in rows] != list(range(1, steps + 1)):
            return f"metrics.jsonl has steps {[r.get('step') for r in rows]}"
        if json.loads((out / "summary.json").read_text()).get("steps") != steps:
            return "summary.json has another step count"
        if yaml.safe_load((out / "recipe.yaml").read_text())["trainer"]["seed"] != seed:
            return "recipe.yaml is another run's"
        name = (out / "checkpoints" / "latest").read_text().strip()
        if name != f"step_{steps:06d}":
            return f"checkpoints/latest is {name}"
        problem = checkpoint_problem(out / "checkpoints" / name)
        if problem:
            return f"{name} is damaged: {problem}"
        if json.loads((out / "checkpoints" / name / "trainer_state.json").read_text()).get("seed") != seed:
            return f"{name} is another run's"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _judge(runs: list[dict[str, Any]], out: Path, totals: dict[str, int]) -> None:
    """Fill each run's outcome and add it to `totals`."""
    for run in runs:
        rc, text = run.pop("rc"), run.pop("text")
        run["exit"] = rc
        totals["runs_started"] += 1
        if rc == 0 and "done " in text:
            totals["runs_succeeded"] += 1
            run["lost"] = intact(out, steps=run["steps"], seed=run["seed"])
            totals["concurrent_runs_lost"] += run["lost"] is not None
        elif "is in use by another run: pid" in text:
            totals["runs_refused"] += 1
            totals["refusals_naming_holder"] += 1
            run["refused"] = "holder named"
        elif "already holds a run" in text:
            totals["runs_refused"] += 1
            run["refused"] = "the folder holds a finished run"
        else:
            totals["unexpected_failures"] += 1
            run["failure"] = text[-1500:]


def race(setup: Path, root: Path, rng: random.Random, totals: dict[str, int]) -> dict[str, Any]:
    """Two or three runs started together into one new folder."""
    out = root / "race" / "run"
    n, steps = rng.choice([2, 3]), rng.choice([2, 3])
    runs = [{"seed": 100 + i, "steps": steps, "offset_s": round(rng.uniform(0, 0.3), 3)} for i in range(n)]
    procs = []
    t0 = time.monotonic()
    for i, run in enumerate(sorted(runs, key=lambda r: r["offset_s"])):
        time.sleep(max(0.0, t0 + run["offset_s"] - time.monotonic()))
        log = root / f"race_{i}.log"
        procs.append((run, _start(_cmd(setup, out, steps=steps, seed=run["seed"]), log), log))
    for run, proc, log in procs:
        run["rc"], run["text"] = _finish(proc, log)
    _judge(runs, out, totals)
    return {"folder": "race", "runs": runs}


def live(setup: Path, root: Path, rng: random.Random, totals: dict[str, int]) -> dict[str, Any]:
    """A new run, a --resume and an --overwrite into a folder a live run owns."""
    out = root / "live" / "run"
    owner = {"seed": 200, "steps": rng.choice([3, 4]), "flags": []}
    owner_log = root / "live_owner.log"
    proc = _start(_cmd(setup, out, steps=owner["steps"], seed=owner["seed"]), owner_log)
    deadline = time.monotonic() + LIMIT_S
    while not (out / "checkpoints" / "latest").is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    paused = proc.poll() is None
    if paused:
        os.kill(proc.pid, signal.SIGSTOP)
    others = [{"seed": 300 + i, "steps": 2, "flags": flags, "offset_s": round(rng.uniform(0, 0.3), 3)}
              for i, flags in enumerate(rng.sample([[], ["--resume"], ["--overwrite"]], 3))]
    started = []
    t0 = time.monotonic()
    try:
        for i, run in enumerate(sorted(others, key=lambda r: r["offset_s"])):
            time.sleep(max(0.0, t0 + run["offset_s"] - time.monotonic()))
            log = root / f"live_{i}.log"
            started.append((run, _start(_cmd(setup, out, *run["flags"], steps=run["steps"], seed=run["seed"]), log),
                            log))
        for run, p, log in started:
            run["rc"], run["text"] = _finish(p, log)
    finally:
        if paused:
            os.kill(proc.pid, signal.SIGCONT)
    owner["rc"], owner["text"] = _finish(proc, owner_log)
    _judge([owner, *others], out, totals)
    for run in others:
        run["flags"] = " ".join(run["flags"]) or "(new run)"
    return {"folder": "live", "owner_paused_while_others_ran": paused, "owner": owner, "others": others}


def campaign(tmp: Path, *, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    from tiny_setup import build_tiny_setup

    t0 = time.perf_counter()
    rng = random.Random(seed)
    setup = tmp / "setup"
    build_tiny_setup(setup)
    totals = dict.fromkeys(["concurrent_runs_lost", "runs_started", "runs_succeeded", "runs_refused",
                            "refusals_naming_holder", "unexpected_failures"], 0)
    rounds = []
    for i in range(1 if quick else 2):
        root = tmp / f"round_{i}"
        root.mkdir()
        rounds.append({"round": i, "race": race(setup, root, rng, totals), "live": live(setup, root, rng, totals)})
    return {**totals, "rounds": rounds, "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    from campaign_cli import run_campaign  # bench/ is on the path when this file runs as a script

    run_campaign(__doc__, campaign, name="runs", quick_help="one round instead of two")


if __name__ == "__main__":
    main()
