"""The live dashboard: a real headless Chromium watches a real quickstart training run (the calculator MCP server, the
tiny Qwen3) through `rlfactory dashboard`; and the run-folder reader it stands on, on real files."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from browser import Browser, wait_for

from rlfactory.errors import RLFactoryError
from rlfactory.report.metrics import parse_metrics_line, read_metrics
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

        shot = browser.screenshot(tmp_path / "dashboard.png")  # kept as a CI artifact
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
            _stop(dash)
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
        # a chart's title explains the keys it plots on hover, from the metrics registry
        assert browser.js("document.querySelector('#c-reward .t').title").startswith("reward/mean: Mean reward")
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
        _stop(dash)


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


# -- damaged metrics.jsonl lines (issue 40, item 7) ------------------------------------------------------------------
def _serve(run_dirs, **kw):
    import threading

    from rlfactory.report.dashboard import make_server

    server = make_server(run_dirs, port=0, tokenizers=False, **kw)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def _unserve(server, thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(timeout=30)


def _request(port: int, path: str, host: str | None = "default") -> tuple[int, bytes]:
    """GET on 127.0.0.1:port with the Host header given (None: none at all)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", f"127.0.0.1:{port}" if host == "default" else host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


ENDPOINTS = ["/", "/api/runs", "/api/metrics?run=0", "/api/metrics?run=0&since=2&epoch=0",
             "/api/transcripts?run=0", "/api/tool_latencies?run=0"]


def test_bad_metrics_lines_are_skipped_and_counted_and_the_rows_after_them_show(tmp_path):
    import poison_metrics as pm

    run = tmp_path / "run"
    run.mkdir()
    lines = pm.stream(12)
    pm.write(run / "metrics.jsonl", lines)
    rows_written = [ln for ln in lines if ln.is_row]
    bad = len(lines) - len(rows_written)
    with (run / "metrics.jsonl").open("ab") as f:
        f.write(b'{"step": 100, "reward/me')  # a line being written: not bad, not a row yet
    server, thread = _serve([run])
    port = server.server_address[1]
    try:
        for path in ENDPOINTS:
            code, body = _request(port, path)
            assert code == 200, (path, body[:300])
        got = json.loads(_request(port, "/api/metrics?run=0")[1])
        assert [r["step"] for r in got["rows"]] == [parse_metrics_line(ln.data)["step"] for ln in rows_written]
        assert got["bad_lines"] == bad and len(got["bad_line_notes"]) == 5
        assert "over the 4 MiB" in got["bad_line_notes"][-1] and "not JSON" in got["bad_line_notes"][-2]
        runs = json.loads(_request(port, "/api/runs")[1])
        assert runs[0]["bad_lines"] == bad and runs[0]["steps"] == len(rows_written)
        odd = {r["step"]: r for r in got["rows"] if r["step"] > 12}
        assert odd[13]["loss/pg"] is None and odd[13]["loss/kl"] is None  # NaN, Infinity
        assert odd[14]["tools/calls"] is None and odd[14]["loss/kl"] is None and odd[14]["loss/pg"] == 1e30
        assert odd[15]["loss/pg"] == "high" and odd[16]["rollout/num_turns_mean"] is None
        assert all(n.startswith("line ") for n in got["bad_line_notes"])  # the newest five; the log has them all

        # The line being written completes: it is a row, not a bad line; later bad and good lines are read on.
        with (run / "metrics.jsonl").open("ab") as f:
            f.write(b'an": 0.5}\nnull\n' + b"\xff" * 10 + b"\n")
            f.write(json.dumps(pm.good_row(101)).encode() + b"\n")
        more = json.loads(_request(port, f"/api/metrics?run=0&since={got['total']}&epoch={got['epoch']}")[1])
        assert [r["step"] for r in more["rows"]] == [100, 101] and more["bad_lines"] == bad + 2
        assert "not UTF-8" in more["bad_line_notes"][-1] and "null" in more["bad_line_notes"][-2]

        # An over-long line still being written is not counted until its newline, nor held in memory meanwhile.
        with (run / "metrics.jsonl").open("ab") as f:
            f.write(b'{"pad": "' + b"y" * (6 << 20))
        assert json.loads(_request(port, "/api/metrics?run=0&since=0")[1])["bad_lines"] == bad + 2
        with (run / "metrics.jsonl").open("ab") as f:
            f.write(b'"}\n' + json.dumps(pm.good_row(102)).encode() + b"\n")
        last = json.loads(_request(port, "/api/metrics?run=0&since=0")[1])
        assert last["rows"][-1]["step"] == 102 and last["bad_lines"] == bad + 3
        assert "over the 4 MiB" in last["bad_line_notes"][-1]
        assert last["bad_line_notes"][-1].startswith(f"line {len(lines) + 5}:")
        for path in ENDPOINTS:
            assert _request(port, path)[0] == 200, path
    finally:
        _unserve(server, thread)
    # `rlfactory report` and the verl run folder read the same file: they skip the same lines
    assert [r["step"] for r in read_metrics(run)][-3:] == [100, 101, 102]


def test_the_page_survives_damaged_metrics_lines_in_chromium(tmp_path, free_port):
    import poison_metrics as pm

    run = tmp_path / "run"
    run.mkdir()
    lines = pm.stream(10, big_line_mb=5)
    pm.write(run / "metrics.jsonl", lines)
    rows = sum(ln.is_row for ln in lines)
    bad = len(lines) - rows
    dash = subprocess.Popen([sys.executable, "-m", "rlfactory.cli", "dashboard", str(run), "--port", str(free_port)],
                            cwd=tmp_path, stdout=(tmp_path / "dash.log").open("w"), stderr=subprocess.STDOUT)
    browser = None
    try:
        url = f"http://127.0.0.1:{free_port}/"
        wait_for(lambda: _get(url), 120, "the dashboard's page", dash)
        browser = Browser(tmp_path / "chrome-profile")
        browser.record_script_errors()
        browser.goto(url + "?poll=300")
        browser.wait_js(f"window.rlfactoryDashboard && rlfactoryDashboard.points('reward') === {rows}", 120,
                        f"{rows} reward points")
        note = browser.wait_js("document.querySelector('#notes .note') && "
                               "document.querySelector('#notes .note').textContent", 60, "the bad-lines note")
        assert f"{bad} bad lines in metrics.jsonl skipped" in note, note
        assert browser.js("document.getElementById('error').textContent") == ""
        assert browser.js("rlfactoryDashboard.points('tcalls')") > 0
        assert browser.js("Object.prototype.calls === undefined && ({}).errors === undefined")
        # The page goes on polling: rows and bad lines written now show up in the same page.
        polls = browser.js("rlfactoryDashboard.polls")
        with (run / "metrics.jsonl").open("ab") as f:
            f.write(b"null\n[1]\n" + json.dumps(pm.good_row(50)).encode() + b"\n\xc3\x28\n")
        browser.wait_js(f"rlfactoryDashboard.points('reward') === {rows + 1}", 120, "the row written later")
        browser.wait_js(f"rlfactoryDashboard.badLines(0) === {bad + 3}", 60, "the later bad lines counted")
        assert browser.js("rlfactoryDashboard.polls") > polls
        assert browser.js("document.getElementById('error').textContent") == ""
        assert browser.script_errors() == []
    finally:
        if browser is not None:
            browser.close()
        _stop(dash)


# -- Host header guard and the warning off loopback (issue 40, item 8) -------------------------------------------------
def test_requests_naming_another_host_are_refused(tmp_path):
    import socket

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    server, thread = _serve([run])
    port = server.server_address[1]
    try:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost.:{port}", f"[::1]:{port}", "localhost"):
            for path in ("/", "/api/runs"):
                assert _request(port, path, host)[0] == 200, (host, path)
        for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}", f"localhost:{port + 1}",
                     f"10.0.0.1:{port}", f"127.0.0.1:{port}@evil.example", "", "[::1", "localhost:" + "9" * 5000):
            code, body = _request(port, "/api/metrics?run=0", host)
            assert code == 421 or (code == 400 and not host), (host, code)
            if host:
                assert "DNS rebinding" in json.loads(body)["error"] and "--allow-host" in json.loads(body)["error"]
            code, body = _request(port, "/", host)
            assert code in (400, 421) and b"reward" not in body
        code, body = _request(port, "/api/runs", None)  # no Host header at all
        assert code == 400 and "no Host header" in json.loads(body)["error"]
    finally:
        _unserve(server, thread)

    # Every interface: any address and this machine's names, the names allowed, nothing else.
    server, thread = _serve([run], host="0.0.0.0", allowed_hosts=["dash.example.org", "proxy.example.org:8443"])
    port = server.server_address[1]
    try:
        for host in (f"10.1.2.3:{port}", f"[fe80::1]:{port}", f"{socket.gethostname()}:{port}",
                     "dash.example.org", f"dash.example.org:{port}", "proxy.example.org:8443"):
            assert _request(port, "/api/runs", host)[0] == 200, host
        for host in (f"evil.example:{port}", "proxy.example.org:443"):
            assert _request(port, "/api/runs", host)[0] == 421, host
    finally:
        _unserve(server, thread)
    with pytest.raises(RLFactoryError, match="--allow-host"):
        _serve([run], allowed_hosts=["bad host:x"])


def test_listening_beyond_loopback_warns_that_there_is_no_authentication(tmp_path, free_port):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    log = tmp_path / "dash.log"
    dash = subprocess.Popen([sys.executable, "-m", "rlfactory.cli", "dashboard", str(run), "--host", "0.0.0.0",
                             "--port", str(free_port), "--allow-host", "dash.example.org"], cwd=tmp_path,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{free_port}/"), 120, "the dashboard's page", dash)
        text = log.read_text()
        assert "no authentication" in text and "ssh -L" in text, text
        assert _request(free_port, "/api/runs", f"dash.example.org:{free_port}")[0] == 200
        assert _request(free_port, "/api/runs", f"evil.example:{free_port}")[0] == 421
    finally:
        _stop(dash)
    quiet = subprocess.Popen([sys.executable, "-m", "rlfactory.cli", "dashboard", str(run), "--port", str(free_port)],
                             cwd=tmp_path, stdout=(tmp_path / "quiet.log").open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{free_port}/"), 120, "the dashboard's page", quiet)
        assert "no authentication" not in (tmp_path / "quiet.log").read_text()
        # SIGTERM ends it cleanly, even where SIGINT is ignored (a background job in a script or CI)
        assert _stop(quiet) == 0, (tmp_path / "quiet.log").read_text()
    finally:
        _stop(quiet)


def test_a_branched_group_opens_as_a_tree_and_its_links_open_the_branches_in_chromium(tmp_path):
    import threading

    from rlfactory.report.dashboard import make_server
    from rlfactory.report.transcripts import save_transcripts
    from rlfactory.rollout.trajectory import Branch, Trajectory, TurnSpan

    def leaf(k: int, root: int, child: int, reward: float) -> Trajectory:
        return Trajectory(id=f"g@0/{k}", group_id="g@0", sample_index=k, prompt_ids=[1],
                          response_ids=[10, 11, 20, 30 + k], loss_mask=[1, 1, 0, 1], logprobs=[-1.0, -1.0, 0.0, -1.0],
                          turns=[TurnSpan(role="assistant", start=0, end=2, text=f"root {root} opens"),
                                 TurnSpan(role="tool", start=2, end=3, text="ok"),
                                 TurnSpan(role="assistant", start=3, end=4, text=f"branch {child} of root {root}")],
                          reward=reward, branch=Branch(root=root, child=child, prefix_tokens=3, prefix_turns=1))

    run = tmp_path / "run"
    (run / "metrics.jsonl").parent.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.25}) + "\n")
    save_transcripts(run / "transcripts" / "step_000001.jsonl",
                     [leaf(0, 0, 0, 1.0), leaf(1, 0, 1, 0.0), leaf(2, 1, 0, 0.0), leaf(3, 1, 1, 0.0)])
    assert [t["tree"] for t in RunWatch(run).transcripts()] == [
        "root 0 · branch 0", "root 0 · branch 1", "root 1 · branch 0", "root 1 · branch 1"]
    server = make_server([run], port=0, tokenizers=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    browser = None
    try:
        browser = Browser(tmp_path / "chrome-profile")
        browser.goto(f"http://127.0.0.1:{server.server_address[1]}/?poll=300")
        browser.wait_js("document.querySelectorAll('#tlist tr').length === 4", 120, "the transcript list")
        assert "root 0 · branch 1" in browser.js("document.getElementById('tlist').textContent")
        browser.js("document.querySelectorAll('#tlist tr')[1].click()")
        browser.wait_js("document.querySelector('#viewer .tree') !== null", 60, "the group's tree")
        assert "branch 1 of root 0" in browser.js("document.querySelector('#viewer section.traj').textContent")
        assert browser.js("document.querySelectorAll('#viewer .tree a[data-id]').length") == 4
        browser.js("document.querySelectorAll('#viewer .tree a[data-id]')[2].click()")  # root 1, branch 0
        browser.wait_js("document.querySelector('#viewer section.traj').textContent.indexOf('branch 0 of root 1')"
                        " >= 0", 60, "the branch the tree's link names")
        assert not browser.script_errors()
    finally:
        if browser is not None:
            browser.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
