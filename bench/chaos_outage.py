"""Environment-outage campaign of the chaos benchmark: real `rlfactory train` runs of the TextCraft CPU smoke recipe
(tiny-random) whose environment server, the TextCraft MCP server over HTTP on 127.0.0.1 (a separate service the
run reaches by URL), is stopped under the run:

- `back`: killed after a seeded step (1 or 2; 3 more steps follow), and started again on the same port once the run
  has logged a skipped step (every trajectory of a step failed): down for at least one whole step. The run must
  train to its last step.
- `gone`: killed after a seeded step and never started again, with `trainer.max_env_outage_s` short: the run must
  stop with the outage error naming the server, no traceback, a checkpoint of its last trained step in the run
  folder and `stopped_by: env_outage` in summary.json.

Each in the synchronous loop and the asynchronous one (`trainer.max_staleness_steps: 1`). `env_outage_crashes`
counts runs that ended any other way (a traceback, another exit, a hang past the guard): 0 is the target.

    python bench/chaos_outage.py --json bench/results/chaos_outage.json [--seed 0] [--quick]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "trainer"))
from env_outage import SMOKE, TRACEBACK, HttpTextcraft, TrainRun, smoke_sets, write_config  # noqa: E402

GONE_MAX_OUTAGE_S = 4.0
"""`trainer.max_env_outage_s` of the `gone` runs: long enough for a few skipped steps."""
BACK_MAX_OUTAGE_S = 300.0
"""... of the `back` runs: the server is back long before."""


def _one(tmp: Path, name: str, *, gone: bool, async_k: int, steps: int, kill_after: int) -> dict[str, Any]:
    server = HttpTextcraft()
    server.start()
    config = write_config(tmp / f"{name}.json", [server])
    sets = smoke_sets(config, steps=steps, max_outage_s=GONE_MAX_OUTAGE_S if gone else BACK_MAX_OUTAGE_S,
                      async_k=async_k)
    run = TrainRun(SMOKE, tmp / name, sets)
    t0 = time.perf_counter()
    hung = None
    code: int | None = None
    try:
        run.wait_until(lambda: len(run.rows()) >= kill_after, f"step {kill_after}", timeout_s=300)
        server.kill()
        if not gone:  # back once a step has found it down (or the run has ended without one: not a crash either)
            deadline = time.monotonic() + 300
            while (time.monotonic() < deadline and run.proc.poll() is None
                   and not re.search(r"step \d+ skipped: all", run.log())):
                time.sleep(0.05)
            server.start()
        code = run.finish(timeout_s=600)
    except (AssertionError, TimeoutError) as e:  # the run ended early, or a hang guard passed
        hung = str(e).splitlines()[0]
        code = run.proc.poll()
    finally:
        run.stop()
        server.kill()
    log = run.log()
    rows = run.rows()
    summary_path = run.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    trained = summary.get("steps", len(rows))
    errors = re.findall(r"error: .*", log)  # the CLI's message (a library may have left a line unended before it)
    error = errors[-1] if errors else None
    checkpoint = (run.out / "checkpoints" / f"step_{trained:06d}").is_dir()
    if gone:
        clean = (code not in (0, None) and hung is None and TRACEBACK not in log and error is not None
                 and "environment outage" in error and "'textcraft'" in error
                 and summary.get("stopped_by") == "env_outage" and checkpoint)
    else:
        clean = code == 0 and hung is None and TRACEBACK not in log and trained == steps
    return {
        "loop": "async" if async_k else "sync",
        "outage": "gone" if gone else "back",
        "killed_after_step": kill_after,
        "exit_code": code,
        "clean": clean,
        "steps": trained,
        "steps_asked": steps,
        "skipped_steps": summary.get("skipped_steps", sum(r.get("rollout/skipped_steps", 0) for r in rows)),
        "stopped_by": summary.get("stopped_by"),
        "checkpoint_of_last_step": checkpoint,
        "traceback": TRACEBACK in log,
        "hang": hung,
        "message": error or (re.findall(r"^\w*Error: .*$", log, re.M) or [None])[-1],
        "watchdog_lines": len(waits := re.findall(r"WARNING rlfactory\.trainer\.generator_watch: (.*)", log)),
        "last_watchdog_line": waits[-1] if waits else None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def campaign(tmp: Path, *, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    """Four runs (back / gone x sync / async); the figures and each run's detail."""
    rng = random.Random(seed)
    runs = []
    for async_k in (0, 1):
        for gone in (False, True):
            name = f"{'async' if async_k else 'sync'}-{'gone' if gone else 'back'}"
            kill_after = 1 if quick else 1 + rng.randrange(2)
            # 3 steps after the kill: the asynchronous generator may have finished the next 2 steps' groups before
            runs.append(_one(tmp, name, gone=gone, async_k=async_k, steps=kill_after + 3, kill_after=kill_after))
    return {
        "env_outage_crashes": sum(not r["clean"] for r in runs),
        "env_outage_runs": len(runs),
        "env_outage_skipped_steps": sum(r["skipped_steps"] or 0 for r in runs),
        "env_outage_detail": runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the figures to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="kill after the first step (not a seeded one)")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (runs and their logs)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rlf-chaos-outage-"))
    t0 = time.perf_counter()
    try:
        result = campaign(tmp, seed=args.seed, quick=args.quick)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    result.update(seed=args.seed, quick=args.quick, wall_s=round(time.perf_counter() - t0, 1))
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    if args.keep:
        print(f"scratch kept in {tmp}")


if __name__ == "__main__":
    main()
