"""One run per run folder (`report/run_folder.py`): real `rlfactory train` processes on the tiny setup.

- runs started at the same instant into a folder that does not exist yet: one trains, the others exit non-zero
  (naming the holder when they overlap it), and the winner's metrics and checkpoints are whole;
- a new run, a `--resume` and an `--overwrite` into a folder a live (asynchronous) run holds are refused, naming its
  pid and command, and delete nothing; `kill -9` of that trainer alone (its generator process may still be alive)
  frees the folder at once for `--resume`;
- `--resume` where no checkpoint exists yet says so and starts from step 0;
- the lock itself: held by a process, refused in another with the holder's details, free the moment it is killed.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from run_metrics import rows_of

from rlfactory.report.run_folder import LOCK_FILE, RunFolderBusy, current_holder, lock_run_folder
from rlfactory.trainer.checkpoint import checkpoint_problem

pytestmark = pytest.mark.timeout(600)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train_cmd(setup: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "rlfactory.cli", "train", str(setup / "recipe.yaml"), "--output-dir", str(out),
            *args]


def run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, check=False)


def test_runs_started_together_into_a_new_folder_get_one_owner(tiny_setup_master, tmp_path):
    out = tmp_path / "new" / "run"  # not there yet: every run creates it
    procs = [subprocess.Popen(train_cmd(tiny_setup_master, out, "--set", "trainer.total_steps=3"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(3)]
    results = [(p.pid, *p.communicate(timeout=300), p.returncode) for p in procs]
    won = [r for r in results if r[3] == 0]
    assert len(won) == 1, [(rc, err[-800:]) for _, _, err, rc in results]
    winner = won[0][0]
    for pid, _, err, rc in results:
        if pid == winner:
            assert "done 3 steps" in won[0][1]
            continue
        assert rc != 0 and "Traceback" not in err
        # overlapping the winner: refused by its lock, naming it; after it: refused by the run it left
        assert (f"is in use by another run: pid {winner}" in err and "rlfactory.cli train" in err) \
            or "already holds a run" in err, err[-2000:]
    assert [r["step"] for r in rows_of(out)] == [1, 2, 3]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
    assert (out / "checkpoints" / "latest").read_text() == "step_000003"
    assert checkpoint_problem(out / "checkpoints" / "step_000003") is None
    assert current_holder(out) is None  # released at the end


def _wait_for(pred, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, f"the run ended before {what}: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def test_a_live_run_keeps_its_folder_and_kill_9_frees_it_at_once(tiny_setup_master, tmp_path):
    out = tmp_path / "run"
    # asynchronous: a generator process runs beside the trainer; it must neither hold nor release the lock
    holder = subprocess.Popen(
        train_cmd(tiny_setup_master, out, "--set", "trainer.total_steps=50", "--set", "trainer.max_staleness_steps=1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        _wait_for(lambda: (out / "checkpoints" / "latest").is_file(), holder, "a first checkpoint")
        os.kill(holder.pid, signal.SIGSTOP)  # holds the folder for as long as the test needs, doing nothing
        rows_before = (out / "metrics.jsonl").read_text()
        ckpts_before = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
        others = [subprocess.Popen(train_cmd(tiny_setup_master, out, *flags, "--set", "trainer.total_steps=3"),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
                  for flags in ([], ["--resume"], ["--overwrite"])]
        for p in others:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 1 and "Traceback" not in err, err[-2000:]
            assert f"is in use by another run: pid {holder.pid} on host" in err, err[-2000:]
            assert "rlfactory.cli train" in err and "--resume" in err and "another --output-dir" in err
        assert (out / "metrics.jsonl").read_text() == rows_before  # nothing deleted, nothing written
        assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ckpts_before
        assert current_holder(out)["pid"] == holder.pid
        os.kill(holder.pid, signal.SIGKILL)  # the trainer alone, as `kill -9 PID` does
        holder.wait(30)
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(30)
    step = int((out / "checkpoints" / "latest").read_text().removeprefix("step_"))
    resumed = run(train_cmd(tiny_setup_master, out, "--resume", "--set", "trainer.max_staleness_steps=1",
                            "--set", f"trainer.total_steps={step + 1}"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "ended without releasing it" in resumed.stderr  # the killed run's record, replaced
    assert [r["step"] for r in rows_of(out)] == list(range(1, step + 2))


def test_resume_without_a_checkpoint_says_so_and_starts_from_step_0(tiny_setup_master, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")  # killed before a save
    proc = run(train_cmd(tiny_setup_master, out, "--resume", "--set", "trainer.total_steps=2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has no checkpoint yet" in proc.stderr and "starts again from step 0" in proc.stderr
    assert "pass --resume to continue it" not in proc.stderr
    assert [r["step"] for r in rows_of(out)] == [1, 2] and rows_of(out)[0]["reward/mean"] != 0.5


HOLD = textwrap.dedent("""
    import sys, time
    from rlfactory.report.run_folder import lock_run_folder
    with lock_run_folder(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
""")


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path, caplog):
    out = tmp_path / "a" / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusy) as e, lock_run_folder(out):
            pass
        assert f"pid {proc.pid} on host" in str(e.value) and f"kill {proc.pid}" in str(e.value)
        assert current_holder(out)["pid"] == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert current_holder(out) is None
    # at once: the kernel released it with the process
    with caplog.at_level(logging.INFO, logger="rlfactory.report.run_folder"), lock_run_folder(out):
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
        with lock_run_folder(out):  # re-entrant in one thread (the CLI, then the engine)
            pass
        assert current_holder(out)["pid"] == os.getpid()
    assert f"pid {proc.pid} on host" in caplog.text and "ended without releasing it" in caplog.text
    assert (out / LOCK_FILE).read_text() == "" and current_holder(out) is None
