"""`rlfactory dashboard RUN_DIR [RUN_DIR ...]`: a live page for one or more run folders, served by the standard
library's threading HTTP server on 127.0.0.1.

Endpoints (JSON unless noted), `run` being the index of a run folder on the command line:
    /                                        the page (dashboard_page.py), HTML
    /api/runs                                each run's name, path, steps so far, total steps, finished or live,
                                             metrics.jsonl lines skipped as bad (`bad_lines`, `bad_line_notes`)
    /api/metrics?run=I&since=N&epoch=E       metrics.jsonl rows from row N (all rows, `reset`, if the file was
                                             rewritten since epoch E), and the bad lines skipped so far
    /api/transcripts?run=I&finish=&rmin=&rmax=&tool_error=1&limit=    the newest saved trajectories, filtered
    /api/transcript?run=I&id=ID              one trajectory as the transcript viewer renders it ({"html": ...})
    /api/tool_latencies?run=I                per-tool call latencies (s) in the saved transcripts

Everything is read from the run folders on request (run_watch.py), so it works the same on a finished run and on a
live one of either engine, and the trainer does no extra work. A request whose Host header does not name the server
is refused with 421 (dashboard_hosts.py: DNS rebinding); any other failure answers that request with an error and
the server goes on. Left out: authentication (it listens on 127.0.0.1 unless told otherwise, and `rlfactory
dashboard` warns when it is not), writing anything to the run folders.
"""
from __future__ import annotations

import json
import logging
import math
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from rlfactory.errors import RLFactoryError
from rlfactory.report.dashboard_hosts import HostGuard
from rlfactory.report.dashboard_page import render_page
from rlfactory.report.run_watch import RunWatch
from rlfactory.report.viewer import group_tree_html, token_text_of, trajectory_html

logger = logging.getLogger(__name__)


class Dashboard:
    """The run folders being watched and the answers to the page's requests (no HTTP in here)."""

    def __init__(self, run_dirs: list[str | Path], *, tokenizers: bool = True):
        if not run_dirs:
            raise RLFactoryError("give at least one run folder, e.g. `rlfactory dashboard runs/quickstart`")
        self.watches = [RunWatch(d) for d in run_dirs]
        self._tokenizers = tokenizers
        self._token_text: dict[int, Callable[[int], str] | None] = {}

    def page(self) -> str:
        return render_page("rlfactory dashboard: " + ", ".join(r["name"] for r in self.api("runs", {})))

    def _watch(self, q: dict[str, str]) -> tuple[int, RunWatch]:
        try:
            i = int(q.get("run", "0") or 0)
            return i, self.watches[i]
        except (ValueError, IndexError):
            raise LookupError(f"no run {q.get('run')!r}: runs are 0..{len(self.watches) - 1}") from None

    def api(self, name: str, q: dict[str, str]) -> Any:
        if name == "runs":
            runs = [w.status() for w in self.watches]
            names = [r["name"] for r in runs]
            for r, w in zip(runs, self.watches):  # runs/a/run and runs/b/run: show a/run and b/run
                if names.count(r["name"]) > 1:
                    r["name"] = f"{w.run.resolve().parent.name}/{w.run.name}"
            return runs
        i, w = self._watch(q)
        if name == "metrics":
            epoch = q.get("epoch")
            return w.metrics(int(q.get("since", "0") or 0),
                             int(epoch) if epoch not in (None, "", "null") else None)
        if name == "transcripts":
            return w.transcripts(limit=int(q.get("limit", "50") or 50), finish=q.get("finish") or None,
                                 reward_min=_float(q.get("rmin")), reward_max=_float(q.get("rmax")),
                                 tool_error=q.get("tool_error") in ("1", "true"))
        if name == "transcript":
            found = w.trajectory(q.get("id", ""))
            if found is None:
                raise LookupError(f"no saved trajectory {q.get('id')!r} in {w.run}/transcripts")
            step, t = found
            tree = group_tree_html(w.group_of(t, step)) if t.branch is not None else ""
            return {"step": step, "html": tree + trajectory_html(t, token_text=self._tokens(i))}
        if name == "tool_latencies":
            return w.tool_latencies()
        raise LookupError(f"no endpoint /api/{name}")

    def _tokens(self, i: int) -> Callable[[int], str] | None:
        """Token texts for the per-token view, from the run's own tokenizer (loaded once; ids without it)."""
        if i not in self._token_text:
            self._token_text[i] = None
            if self._tokenizers:
                try:
                    from rlfactory.models.loading import load_tokenizer
                    from rlfactory.recipe.schema import Recipe

                    self._token_text[i] = token_text_of(load_tokenizer(
                        Recipe.from_yaml(self.watches[i].run / "recipe.yaml")))
                except Exception as e:  # the viewer shows token ids without it
                    logger.info("dashboard: no tokenizer for %s (%s): token ids only", self.watches[i].run, e)
        return self._token_text[i]


def _float(v: str | None) -> float | None:
    if v in (None, ""):
        return None
    try:
        return float(v)
    except ValueError:
        raise LookupError(f"not a number: {v!r}") from None


def _clean(obj: Any) -> Any:
    """JSON for the browser: NaN/inf become null (JSON has no such numbers)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def _handler(dash: Dashboard, guard: HostGuard) -> type[BaseHTTPRequestHandler]:
    refused_hosts: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, code: int, message: str, url_path: str) -> None:
            if url_path.startswith("/api/"):
                self._send(code, json.dumps({"error": message}).encode(), "application/json")
            else:
                self._send(code, message.encode(), "text/plain; charset=utf-8")

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            problem = guard.problem(self.headers.get("Host"))
            if problem is not None:
                host = str(self.headers.get("Host"))[:200]
                # once per Host at warning: a rebinding page polls, and must not bury the terminal
                logger.log(logging.DEBUG if host in refused_hosts else logging.WARNING,
                           "dashboard: refused %s: %s", self.path[:200], problem)
                if len(refused_hosts) < 1000:
                    refused_hosts.add(host)
                self._refuse(421 if self.headers.get("Host") else 400, problem, url.path)
                return
            try:
                self._answer(url)
            except (BrokenPipeError, ConnectionResetError):  # the browser went away (a reload): nothing to answer
                return
            except Exception as e:  # one request's failure is its own: the server keeps answering the others
                logger.exception("dashboard: %s failed", self.path[:200])
                self._refuse(500, f"the dashboard failed to answer {url.path}: {type(e).__name__}: {e}"[:2000],
                             url.path)

        def _answer(self, url: Any) -> None:
            if url.path in ("/", "/index.html"):
                self._send(200, dash.page().encode(), "text/html; charset=utf-8")
                return
            if not url.path.startswith("/api/"):
                self._send(404, b'{"error": "not found"}', "application/json")
                return
            q = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            try:
                body, code = _clean(dash.api(url.path[len("/api/"):], q)), 200
            except LookupError as e:
                body, code = {"error": str(e.args[0] if e.args else e)}, 404
            except ValueError as e:  # a malformed query (since=abc)
                body, code = {"error": f"bad query {url.query!r}: {e}"}, 400
            self._send(code, json.dumps(body).encode(), "application/json")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            logger.debug("dashboard: " + format, *args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(run_dirs: list[str | Path], *, host: str = "127.0.0.1", port: int = 8766,
                tokenizers: bool = True, allowed_hosts: list[str] | None = None) -> ThreadingHTTPServer:
    """The dashboard's HTTP server, bound and ready for `serve_forever()` (port 0 picks a free one). It answers
    requests whose Host names it (dashboard_hosts.py) or one of `allowed_hosts` ("name", "name:port", "*")."""
    dash = Dashboard(run_dirs, tokenizers=tokenizers)
    guard_extra = list(allowed_hosts or [])
    try:
        HostGuard(host, port, guard_extra)  # a malformed --allow-host is refused before anything listens
    except ValueError as e:
        raise RLFactoryError(str(e)) from None
    cls = _Server6 if ":" in host.strip("[]") else _Server
    try:
        server = cls((host.strip("[]"), port), BaseHTTPRequestHandler)  # the real one needs the port bound
    except OSError as e:
        raise RLFactoryError(f"cannot listen on {host}:{port} ({e.strerror or e}): pick another with --port") from e
    server.RequestHandlerClass = _handler(dash, HostGuard(host, server.server_address[1], guard_extra))
    return server
