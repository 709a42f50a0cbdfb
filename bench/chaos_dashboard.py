"""The dashboard campaign of the chaos benchmark: damaged lines in a live metrics.jsonl while `rlfactory dashboard`
serves it.

    python bench/chaos_dashboard.py --json bench/results/chaos_dashboard.json [--seed 0] [--quick]

A real `rlfactory dashboard` subprocess watches a run folder whose metrics.jsonl receives, in seeded order, ordinary
rows interleaved with poison (tests/report/poison_metrics.py): invalid UTF-8, 100,000-deep JSON arrays and objects,
`null` / list / number / string lines, truncated JSON, a 50 MB line (5 MB with --quick), and odd but valid rows
(NaN / Infinity, numbers past float's range, strings and nesting where numbers go, `__proto__` keys). Some lines are
written in two pieces with the dashboard read between them (a line still being written is neither a row nor bad).
After every batch each endpoint is asked (`/`, `/api/runs`, `/api/metrics` from 0 and from the last row seen,
`/api/transcripts`, `/api/tool_latencies`) and must answer 200 with its body; at the end the rows served must be
every row written, in order, and the bad-line count must equal the bad lines written. When Chromium is installed a
headless page follows the whole campaign live and must end with one reward point per row, the bad-line note, and
no script error. `dashboard_poison_lines_survived` is true when all of that held.
"""
from __future__ import annotations

import http.client
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # local_services.pick_free_port
sys.path.insert(0, str(REPO / "tests" / "report"))  # poison_metrics, browser
import poison_metrics as pm
from local_services import pick_free_port


def _get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host or f"127.0.0.1:{port}")
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _wait(probe: Any, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = probe()
        except OSError:
            value = None
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"waiting for {what}: the dashboard exited with {proc.returncode}")
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _batches(rng: random.Random, good: int, big_line_mb: int) -> list[list[pm.Line]]:
    """Ordinary rows 1..good, each batch one to three of them plus one or two strange lines, in seeded order."""
    strange = pm.bad_lines(big_line_mb) + pm.odd_rows(good + 1)
    strange += [pm.Line("null", b"null", False), pm.Line("invalid_utf8", b"\xc3\x28\xff", False),
                pm.Line("nan_line", b"NaN", False), pm.Line("empty_object", b"{}", True)]
    rng.shuffle(strange)
    batches, step = [], 1
    while step <= good or strange:
        batch = [pm.Line("good", json.dumps(pm.good_row(s)).encode(), True)
                 for s in range(step, min(good, step + rng.randint(0, 2)) + 1)]
        step += len(batch)
        for _ in range(rng.randint(1, 2)):
            if strange:
                batch.insert(rng.randint(0, len(batch)), strange.pop())
        batches.append(batch)
    return batches


def campaign(tmp: Path, *, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    from browser import Browser, chromium_path

    rng = random.Random(seed)
    run = tmp / "dashboard_run"
    run.mkdir(parents=True, exist_ok=True)
    metrics = run / "metrics.jsonl"
    metrics.write_bytes(b"")
    port = pick_free_port()
    log = tmp / "dashboard.log"
    dash = subprocess.Popen([sys.executable, "-m", "rlfactory.cli", "dashboard", str(run), "--port", str(port)],
                            cwd=tmp, stdout=log.open("w"), stderr=subprocess.STDOUT)
    browser = None
    failures: list[str] = []
    checks = 0
    rows_written: list[int | None] = []  # each row's step, in order (None: a row without one)
    lines_written = bad_written = split_writes = 0
    kinds: dict[str, int] = {}
    last: dict[str, Any] = {"total": 0, "epoch": 0}
    final: dict[str, Any] = {"rows": [], "bad_lines": None}
    page: dict[str, Any] = {"checked": False}
    guard_ok = False
    t0 = time.perf_counter()

    def check_endpoints() -> None:
        nonlocal checks, last
        paths = ["/", "/api/runs", "/api/metrics?run=0",
                 f"/api/metrics?run=0&since={last['total']}&epoch={last['epoch']}",
                 "/api/transcripts?run=0", "/api/tool_latencies?run=0"]
        for path in paths:
            checks += 1
            try:
                code, body = _get(port, path)
                if code != 200:
                    failures.append(f"{path}: {code} {body[:200]!r}")
                    continue
                if path == "/":
                    if b"rlfactory dashboard" not in body:
                        failures.append(f"{path}: not the page")
                    continue
                data = json.loads(body)
                if path == "/api/metrics?run=0":
                    last = data
            except (OSError, ValueError) as e:
                failures.append(f"{path}: {type(e).__name__}: {e}")

    try:
        _wait(lambda: _get(port, "/api/runs")[0] == 200, 120, "the dashboard", dash)
        chromium = chromium_path() is not None
        if chromium:
            browser = Browser(tmp / "chrome-profile")
            browser.record_script_errors()
            browser.goto(f"http://127.0.0.1:{port}/?poll=300")
        batches = _batches(rng, 20 if quick else 60, 5 if quick else 50)
        for batch in batches:
            for line in batch:
                kinds[line.kind] = kinds.get(line.kind, 0) + 1
                lines_written += 1
                if line.is_row:
                    rows_written.append(pm_step(line))
                else:
                    bad_written += 1
                with metrics.open("ab") as f:
                    if len(line.data) > 8 and rng.random() < 0.3:  # a line caught half written
                        cut = rng.randint(1, len(line.data) - 1)
                        f.write(line.data[:cut])
                        f.flush()
                        split_writes += 1
                        check_endpoints()
                        seen = json.loads(_get(port, "/api/metrics?run=0")[1])
                        if seen.get("bad_lines") != bad_written - (0 if line.is_row else 1):
                            failures.append(f"a half-written {line.kind} line was counted bad")
                        f.write(line.data[cut:] + b"\n")
                    else:
                        f.write(line.data + b"\n")
            check_endpoints()
        code, body = _get(port, "/api/metrics?run=0")
        final = json.loads(body) if code == 200 else {"rows": [], "bad_lines": None}
        steps_shown = [r.get("step") for r in final["rows"]]
        rows_ok = steps_shown == rows_written
        bad_ok = final["bad_lines"] == bad_written
        if not rows_ok:
            failures.append(f"rows served {len(steps_shown)} != rows written {len(rows_written)} (or out of order)")
        if not bad_ok:
            failures.append(f"bad lines counted {final['bad_lines']} != bad lines written {bad_written}")
        code, _ = _get(port, "/api/runs", host=f"rebind.example:{port}")
        guard_ok = code == 421
        if browser is not None:
            plotted = sum(1 for b in batches for ln in b if ln.is_row and b'"reward/mean"' in ln.data)
            try:
                browser.wait_js(f"window.rlfactoryDashboard && rlfactoryDashboard.points('reward') === {plotted}",
                                180, f"{plotted} reward points")
                browser.wait_js(f"rlfactoryDashboard.badLines(0) === {bad_written}", 60, "the bad-line count")
                page_ok = True
            except AssertionError as e:
                failures.append(f"page: {e}")
                page_ok = False
            page = {"checked": True, "reward_points": browser.js("rlfactoryDashboard.points('reward')"),
                    "reward_rows": plotted, "note": browser.js("document.getElementById('notes').textContent"),
                    "error_line": browser.js("document.getElementById('error').textContent"),
                    "script_errors": browser.script_errors()[:5]}
            if page["script_errors"] or page["error_line"]:
                failures.append(f"page: script errors {page['script_errors']} / {page['error_line']!r}")
                page_ok = False
            page["ok"] = page_ok
    except Exception as e:  # noqa: BLE001 - the campaign's verdict is the figure: a dashboard that broke it is a failure, not a crash
        failures.append(f"the campaign stopped: {type(e).__name__}: {e}")
    finally:
        if browser is not None:
            browser.close()
        if dash.poll() is None:
            dash.send_signal(signal.SIGINT)
            try:
                dash.wait(timeout=60)
            except subprocess.TimeoutExpired:
                dash.kill()
                dash.wait()
    alive = dash.returncode in (0, -signal.SIGINT, 130)
    if not alive:
        failures.append(f"the dashboard exited with {dash.returncode}: {log.read_text()[-1000:]}")
    return {
        "dashboard_poison_lines_survived": not failures and guard_ok,
        "lines_written": lines_written,
        "rows_written": len(rows_written),
        "rows_served": len(final["rows"]),
        "bad_lines_written": bad_written,
        "bad_lines_counted": final["bad_lines"],
        "half_written_lines": split_writes,
        "endpoint_checks": checks,
        "endpoints_checked": ["/", "/api/runs", "/api/metrics (from 0 and from the last row)", "/api/transcripts",
                              "/api/tool_latencies"],
        "endpoint_failures": failures[:10],
        "line_kinds": dict(sorted(kinds.items())),
        "big_line_mb": 5 if quick else 50,
        "foreign_host_refused": guard_ok,
        "page": page,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def pm_step(line: pm.Line) -> int | None:
    from rlfactory.report.metrics import parse_metrics_line

    return parse_metrics_line(line.data).get("step")


def main() -> None:
    from campaign_cli import run_campaign  # bench/ is on the path when this file runs as a script

    run_campaign(__doc__, campaign, name="dashboard", quick_help="a smaller campaign (a 5 MB line, fewer rows)")


if __name__ == "__main__":
    main()
