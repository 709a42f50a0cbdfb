"""The live dashboard: a real headless Chromium watches a real quickstart training run (the calculator MCP server, the
tiny Qwen3) through `rlfactory dashboard`; and the run-folder reader it stands on, on real files."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from browser import Browser, wait_for

from rlfactory.errors import RLFactoryError
from rlfactory.report.metrics import read_metrics
from rlfactory.report.run_watch import RunWatch, check_run_dir

REPO = Path(__file__).resolve().parents[2]


def _rows(run: Path) -> int:
    path = run / "metrics.jsonl"
    return sum(1 for ln in path.read_text().splitlines() if ln.strip()) if path.is_file() else 0


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def test_dashboard_follows_a_live_training_run_in_chromium(tmp_path, free_port):
    run = tmp_path / "run"
    # Many steps, so that the run is still going while the page loads; the test stops it (SIGTERM) once it has
    # seen the curves grow.
    train = subprocess.Popen(
        [sys.executable, "-m", "rlfactory.cli", "train", str(REPO / "recipes/quickstart.yaml"), "--output-dir",
         str(run), "--set", "trainer.total_steps=200", "--set", "trainer.save_every_steps=0"],
        cwd=tmp_path, stdout=(tmp_path / "train.log").open("w"), stderr=subprocess.STDOUT)
    dash = browser = None
    try:
        wait_for(lambda: _rows(run) >= 1, 300, "the first metrics.jsonl row", train)
        dash = subprocess.Popen([sys.executable, "-m", "rlfactory.cli", "dashboard", str(run), "--port",
                                 str(free_port)], cwd=tmp_path, stdout=(tmp_path / "dash.log").open("w"),
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{free_port}/"
        wait_for(lambda: _get(url), 120, "the dashboard's page", dash)
        browser = Browser(tmp_path / "chrome-profile")
        browser.goto(url + "?poll=300")
        first = browser.wait_js("window.rlfactoryDashboard && rlfactoryDashboard.points('reward')", 120,
                                "reward points on the page")
        assert first <= _rows(run)
        # The curves gain points as steps land, in the same page (it polls; nothing reloads it).
        grown = browser.wait_js(f"rlfactoryDashboard.points('reward') > {first} && "
                                f"rlfactoryDashboard.points('reward')", 300, "the reward curve to gain points")
        assert grown > first
        for chart in ("loss", "entropy", "kl", "tcalls", "turns", "stages"):
            assert browser.js(f"rlfactoryDashboard.points('{chart}')") > 0, chart
        assert "live" in browser.js("document.getElementById('runs').textContent")

        # The tool panel shows the calculator's calls: summed over the steps so far, as metrics.jsonl has them.
        calls = browser.wait_js(
            "(function(){var r=document.querySelector('#tool-rows tr[data-tool=\"calculator\"]');"
            "return r && parseInt(r.children[2].textContent, 10);})()", 120, "the calculator's row")
        assert calls > 0
        # A transcript opens: click the newest one in the list; the token-level viewer renders it with token texts.
        browser.wait_js("document.querySelectorAll('#tlist tr').length > 0", 120, "the transcript list")
        clicked = browser.js("(function(){var r=document.querySelector('#tlist tr'); r.click(); "
                             "return r.dataset.id;})()")
        browser.wait_js("document.querySelector('#viewer section.traj') !== null", 120, "the opened transcript")
        assert clicked in browser.js("document.querySelector('#viewer section.traj').textContent")
        browser.js("document.querySelector('#viewer button.toggle').click()")
        tokens = browser.wait_js("document.querySelectorAll('#viewer .tok').length", 60, "the token view")
        assert tokens > 0
        assert not browser.js("document.querySelector('#viewer .tok').textContent.startsWith('#')")  # texts, not ids

        # The filters narrow the list: a reward floor above every reward leaves none.
        browser.js("var e=document.getElementById('f-rmin'); e.value='2'; e.dispatchEvent(new Event('input'))")
        browser.wait_js("document.getElementById('tcount').textContent.indexOf('0 shown') === 0", 60, "filtering")

        shot = browser.screenshot(tmp_path / "dashboard.png")
        artifacts = os.environ.get("RLFACTORY_TEST_ARTIFACTS")
        if artifacts:  # CI keeps it
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(artifacts) / "dashboard.png")
        assert shot.stat().st_size > 10_000

        assert _stop(train) == 143, (tmp_path / "train.log").read_text()[-2000:]
        final = len(read_metrics(run))
        # After the run ends, the page catches up with every row the trainer wrote, and says it finished.
        browser.wait_js(f"rlfactoryDashboard.points('reward') === {final}", 120, f"{final} reward points")
        tool_sum = sum(r.get("tools/calculator/calls", 0) for r in read_metrics(run))
        browser.wait_js("(function(){var r=document.querySelector('#tool-rows tr[data-tool=\"calculator\"]');"
                        f"return parseInt(r.children[2].textContent, 10) === {tool_sum};}})()", 60,
                        f"the calculator's {tool_sum} calls")
    finally:
        if browser is not None:
            browser.close()
        if dash is not None:
            _stop(dash, signal.SIGINT)
        _stop(train)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()
    except OSError:
        return None


def test_run_watch_reads_new_rows_only_and_starts_over_when_the_file_is_rewritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n" + '{"step": 2, "rew')  # a line being written
    w = RunWatch(run)
    first = w.metrics()
    assert [r["step"] for r in first["rows"]] == [1] and first["total"] == 1
    with path.open("a") as f:
        f.write('ard/mean": 0.75}\n' + json.dumps({"step": 3, "reward/mean": float("nan")}).replace("NaN", "null")
                + "\n")
    more = w.metrics(since=1, epoch=first["epoch"])
    assert [r["step"] for r in more["rows"]] == [2, 3] and more["rows"][0]["reward/mean"] == 0.75
    assert not more["reset"]
    path.write_text(json.dumps({"step": 1, "reward/mean": 0.25}) + "\n")  # a resumed run truncated the file
    again = w.metrics(since=3, epoch=more["epoch"])
    assert again["reset"] and [r["reward/mean"] for r in again["rows"]] == [0.25]


def test_a_folder_that_is_not_a_run_is_a_clear_error(tmp_path):
    with pytest.raises(RLFactoryError, match="not a folder"):
        check_run_dir(tmp_path / "missing")
    with pytest.raises(RLFactoryError, match="is it a run folder"):
        check_run_dir(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "dashboard", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "not a folder" in proc.stderr and "Traceback" not in proc.stderr
