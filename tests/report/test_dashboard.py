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


def test_two_finished_runs_overlay_and_an_async_run_shows_its_staleness(tmp_path, free_port):
    runs = {"sync": tmp_path / "sync", "async": tmp_path / "async"}
    for name, k in (("sync", 0), ("async", 1)):
        proc = subprocess.run(
            [sys.executable, "-m", "rlfactory.cli", "train", str(REPO / "recipes/quickstart.yaml"), "--output-dir",
             str(runs[name]), "--set", "trainer.total_steps=3", "--set", f"trainer.max_staleness_steps={k}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    steps = {name: len(read_metrics(run)) for name, run in runs.items()}
    dash = subprocess.Popen([sys.executable, "-m", "rlfactory.cli", "dashboard", str(runs["sync"]),
                             str(runs["async"]), "--port", str(free_port)], cwd=tmp_path,
                            stdout=(tmp_path / "dash.log").open("w"), stderr=subprocess.STDOUT)
    browser = None
    try:
        url = f"http://127.0.0.1:{free_port}/"
        wait_for(lambda: _get(url), 120, "the dashboard's page", dash)
        browser = Browser(tmp_path / "chrome-profile")
        browser.goto(url)
        total = steps["sync"] + steps["async"]
        browser.wait_js(f"window.rlfactoryDashboard && rlfactoryDashboard.points('reward') === {total}", 120,
                        f"{total} reward points")
        legend = browser.js("Array.from(document.querySelectorAll('#c-reward .legend span')).map(s => s.textContent)")
        assert len(legend) == 2 and legend[0].startswith("— sync") and legend[1].startswith("— async")
        # only the async run logs staleness: its section is shown, with one point per async step
        assert browser.js("!document.getElementById('async-section').classList.contains('hidden-section')")
        assert browser.wait_js("rlfactoryDashboard.points('stale_tok')", 60, "staleness points") == steps["async"]
        assert browser.js("document.getElementById('runs').textContent").count("(finished)") == 2
        # the transcript list follows the run picked
        browser.js("var e=document.getElementById('f-run'); e.value='1'; e.dispatchEvent(new Event('change'))")
        browser.wait_js("Array.from(document.querySelectorAll('#tlist tr')).length > 0 && "
                        "Array.from(document.querySelectorAll('#tlist tr')).every(r => r.dataset.run === '1')", 60,
                        "the async run's transcripts")
    finally:
        if browser is not None:
            browser.close()
        _stop(dash, signal.SIGINT)


def test_transcripts_come_newest_first_and_the_filters_narrow_them(tmp_path):
    from rlfactory.report.transcripts import save_transcripts
    from rlfactory.rollout.trajectory import ToolCallRecord, Trajectory

    def traj(i: int, reward: float | None, finish: str = "stop", tool_error: bool = False) -> Trajectory:
        calls = [ToolCallRecord(turn=0, name="calculator", latency_s=0.01 * (i + 1), is_error=tool_error,
                                error_kind="timeout" if tool_error else None)]
        return Trajectory(id=f"t{i}", prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1], logprobs=[0.0, 0.0],
                          tool_calls=calls, finish_reason=finish, reward=reward)

    run = tmp_path / "run"
    save_transcripts(run / "transcripts" / "step_000001.jsonl", [traj(0, 0.0), traj(1, 1.0, "max_turns")])
    save_transcripts(run / "transcripts" / "step_000002.jsonl", [traj(2, 0.5, tool_error=True), traj(3, None)])
    w = RunWatch(run)
    assert [(t["id"], t["step"]) for t in w.transcripts()] == [("t2", 2), ("t3", 2), ("t0", 1), ("t1", 1)]
    assert [t["id"] for t in w.transcripts(limit=1)] == ["t2"]
    assert [t["id"] for t in w.transcripts(finish="max_turns")] == ["t1"]
    assert [t["id"] for t in w.transcripts(reward_min=0.5)] == ["t2", "t1"]  # no reward: left out of a range
    assert [t["id"] for t in w.transcripts(reward_max=0.5)] == ["t2", "t0"]
    assert [t["id"] for t in w.transcripts(tool_error=True)] == ["t2"]
    assert w.transcripts(tool_error=True)[0]["tool_errors"] == 1
    assert w.trajectory("t1")[0] == 1 and w.trajectory("nope") is None
    assert sorted(w.tool_latencies()["calculator"]) == pytest.approx([0.01, 0.02, 0.03, 0.04])


def test_the_server_answers_bad_requests_with_clear_errors(tmp_path):
    import threading
    import urllib.error

    from rlfactory.report.dashboard import make_server

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": float("nan")}).replace("NaN", "null")
                                       + "\n")
    server = make_server([run], port=0, tokenizers=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert "reward" in _get(base + "/")
        assert json.loads(_get(base + "/api/metrics?run=0"))["rows"] == [{"step": 1, "reward/mean": None}]
        for path, code, text in [("/api/metrics?run=0&since=abc", 400, "bad query"),
                                 ("/api/metrics?run=3", 404, "runs are 0..0"),
                                 ("/api/transcript?run=0&id=x", 404, "no saved trajectory"),
                                 ("/api/nope", 404, "no endpoint"), ("/nope", 404, "not found")]:
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(base + path, timeout=30)
            assert err.value.code == code and text in json.loads(err.value.read())["error"], path
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
    with pytest.raises(RLFactoryError, match="--port"):  # the port is taken: say so
        busy = make_server([run], port=0, tokenizers=False)
        try:
            make_server([run], port=busy.server_address[1], tokenizers=False)
        finally:
            busy.server_close()
