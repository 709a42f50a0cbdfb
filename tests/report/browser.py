"""A real headless Chromium driven over the DevTools protocol: navigate, evaluate JS, wait on a condition, screenshot.

For pages that change while the test watches (the live dashboard); one-shot pages use `--dump-dom` (test_viewer.py).
"""
from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless Chromium process with one page; `close()` stops it."""

    def __init__(self, profile: Path, *, width: int = 1400, height: int = 2200):
        from websockets.sync.client import connect

        exe = chromium_path()
        if exe is None:
            pytest.skip("chromium is not installed (apt-get install chromium)")
        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "--remote-debugging-port=0",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = profile / "DevToolsActivePort"
            wait_for(lambda: port_file.is_file() and len(port_file.read_text().splitlines()) >= 2, 60,
                     "Chromium's DevTools port", self.proc)
            port = int(port_file.read_text().splitlines()[0])
            pages = wait_for(lambda: [p for p in json.load(urllib.request.urlopen(
                f"http://127.0.0.1:{port}/json/list", timeout=10)) if p.get("type") == "page"], 60, "a page")
            self._stack = contextlib.ExitStack()
            self.ws = self._stack.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=None,
                                                        open_timeout=30))
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:  # events arrive in between; the answer carries our id
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str, timeout_s: float = 120) -> None:
        """Open `url` and return once its document has finished loading. Page.navigate answers when the navigation
        commits, while the document may still be parsing: a query made then sees only the part parsed so far."""
        loader = self.call("Page.navigate", url=url).get("loaderId")
        self.wait_js("document.readyState === 'complete'", timeout_s, f"{url} to finish loading (loader {loader})")

    def record_script_errors(self) -> None:
        """From the next page load on, keep the page's uncaught exceptions and unhandled promise rejections for
        `script_errors()` (call before `goto`)."""
        self.call("Page.enable")
        self.call("Page.addScriptToEvaluateOnNewDocument", source=(
            "window.__scriptErrors = [];"
            "window.addEventListener('error', function(e){ window.__scriptErrors.push(String(e.message)); });"
            "window.addEventListener('unhandledrejection', function(e){"
            " window.__scriptErrors.push('unhandled rejection: ' + String(e.reason)); });"))

    def script_errors(self) -> list[str]:
        return self.js("window.__scriptErrors || []")

    def js(self, expression: str) -> Any:
        """The value of a JS expression in the page (promises awaited)."""
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"JS error in {expression!r}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_js(self, expression: str, timeout_s: float = 120, what: str | None = None) -> Any:
        """Poll a JS expression until it is truthy; its value."""
        def probe() -> Any:
            try:
                return self.js(expression)
            except RuntimeError:  # the page is still loading
                return None
        return wait_for(probe, timeout_s, what or expression, self.proc)

    def screenshot(self, path: Path) -> Path:
        """The page as a PNG at `path`; kept as a CI artifact too when `RLFACTORY_TEST_ARTIFACTS` names a folder."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        artifacts = os.environ.get("RLFACTORY_TEST_ARTIFACTS")
        if artifacts:  # CI keeps it
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(artifacts) / path.name)
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(probe: Callable[[], Any], timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> Any:
    """Poll `probe` until it returns something truthy (a generous bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process exited with {proc.returncode}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
