"""`BrowserHost`: the browser's event loop on a thread of its own, and `BrowserEnv`, a browser episode with the
synchronous face the episode registry and the MCP env server expect (`rlfactory/envs/mcp_server.py` runs blocking
tools on worker threads; each call here waits for its coroutine on the browser's loop).

One host holds one Chromium (`adapter.Chromium`) for all its episodes; each episode is a context of it. A call
that does not finish within `call_timeout_s` is cancelled and its episode ends as an infrastructure failure
(`BrowserLost`): a page that hangs the browser must not hang the trainer.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from rlfactory.envs.types import EnvError, StepResult
from rlfactory.envs.web.browser.adapter import BrowserLost, BrowserSettings, Chromium
from rlfactory.envs.web.browser.episode import BrowserEpisode
from rlfactory.envs.web.browser.observation import DEFAULT_MAX_CHARS
from rlfactory.envs.web.browser.policy import OriginPolicy

logger = logging.getLogger(__name__)
T = TypeVar("T")


class BrowserHost:
    def __init__(self, settings: BrowserSettings | None = None, *, call_timeout_s: float = 60.0):
        self.call_timeout_s = call_timeout_s
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="browser-loop")
        self._thread.start()
        self.chromium = Chromium(settings)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the browser's loop and wait for it; BrowserLost when it takes longer than the timeout."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        limit = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise BrowserLost(f"the browser did not answer within {limit:g} s") from None

    def start(self) -> None:
        """Launch Chromium now (else the first episode does)."""
        self.run(self.chromium.ensure())

    def close(self) -> None:
        if not self.loop.is_running():
            return
        try:
            self.run(self.chromium.close(), timeout_s=15)
        except (BrowserLost, EnvError):
            logger.warning("the browser did not close in time")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class BrowserEnv:
    """One browser episode behind a blocking API (an `Env` for `EpisodeRegistry`, opened with `open`, not
    `reset`)."""

    score = 0.0
    task_id = None

    def __init__(self, host: BrowserHost, *, max_chars: int = DEFAULT_MAX_CHARS, show_urls: bool = False,
                 episode: BrowserEpisode | None = None, start_urls: tuple[str, ...] = (),
                 allowed_origins: tuple[str, ...] = ()):
        """`start_urls` / `allowed_origins`: what `reset(task_id)` opens (start URL `task_id % len`), for a server
        whose episodes open by task id."""
        self.host = host
        self.start_urls = start_urls
        self.allowed_origins = allowed_origins
        self.episode = episode or BrowserEpisode(host.chromium, max_chars=max_chars, show_urls=show_urls)
        self.lost: str | None = None
        """Why this episode cannot go on (its browser or page died), once it happened."""

    @property
    def done(self) -> bool:
        return self.episode.done

    def _run(self, coro: Coroutine[Any, Any, T], *, loses: bool = True) -> T:
        """Run one of the episode's calls; a BrowserLost ends the episode (`loses=False`: a failure that is the
        call's alone, such as a fork whose copy did not load)."""
        if self.lost is not None:
            coro.close()
            raise BrowserLost(f"{self.lost}; this episode cannot go on (open a new one)")
        try:
            return self.host.run(coro)
        except BrowserLost as e:
            if not loses and self.episode.context is not None and not self.episode.context.lost:
                raise
            self.lost = str(e).split("; this episode")[0]
            # The context is unusable now (or the call was cancelled half way): drop it so that every later call
            # says so, and free it in the background.
            ctx, self.episode.context = self.episode.context, None
            if ctx is not None:
                ctx.mark_lost("the browser did not answer")
                asyncio.run_coroutine_threadsafe(ctx.close(), self.host.loop)
            raise

    def open(self, start_url: str, allowed_origins: list[str] | None = None, *,
             confine_paths: bool = False) -> StepResult:
        self.lost = None  # a new context: whatever happened to the last one is over
        return self._run(self.episode.open(start_url, allowed_origins, confine_paths=confine_paths))

    def reset(self, task_id: int) -> StepResult:
        if not self.start_urls:
            raise EnvError("this browser has no start URLs to reset to: call open(start_url, allowed_origins)")
        return self.open(self.start_urls[task_id % len(self.start_urls)], list(self.allowed_origins) or None)

    def step(self, action: str) -> StepResult:
        return self._run(self.episode.act(action))

    def observe(self) -> str:
        return self._run(self.episode.observe())

    def screenshot(self) -> bytes:
        return self._run(self.episode.screenshot())

    def fork(self, *, policy: OriginPolicy | None = None, rewrite: Callable[[str], str] | None = None) -> BrowserEnv:
        """A copy in a new context (`BrowserEpisode.fork`: `policy`, `rewrite` move it to other sites)."""
        return BrowserEnv(self.host, episode=self._run(self.episode.fork(policy=policy, rewrite=rewrite), loses=False))

    def close(self) -> None:
        try:
            self.host.run(self.episode.close(), timeout_s=10)
        except (BrowserLost, EnvError):
            logger.warning("closing a browser episode timed out")
