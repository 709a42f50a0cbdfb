"""`WebTaskEnv`: the web environment without a browser of its own, for a browser that is someone else's (the
official Playwright MCP server): `reset(task_id)` opens the episode's site state and returns the intent and the start
URL; `evaluate(answer, final_url)` scores it on the episode's pages and databases. `SitesGate` is the origin proxy
such a browser is pointed at (`--proxy-server`), letting through only the open episodes' paths.

The browser and the policy between the two calls are not ours: the final URL is the caller's to give (a Playwright
snapshot says `Page URL: ...`), else the last page the gate saw the browser load in the episode (a request with
`Sec-Fetch-Dest: document`). Left out: a page shown again from the browser's cache (back/forward) is not seen by
the gate, and per-episode containment between episodes open at once behind one gate (a shared browser could reach
any open episode's path; give each browser server one episode at a time, `max_concurrency: 1`).
"""
from __future__ import annotations

import asyncio
import logging
import threading

from rlfactory.envs.types import EnvError, StepResult
from rlfactory.envs.web.browser.policy import OriginPolicy
from rlfactory.envs.web.browser.proxy import OriginProxy
from rlfactory.envs.web.env import SPLITS, WebWorld

logger = logging.getLogger(__name__)

EVALUATE_DOC = ("Score this episode's task: `answer` is your answer if the task asks a question (else empty), "
                "`final_url` the URL of the page the browser shows at the end (empty: the last page it loaded). "
                "Ends the episode.")


class SitesGate:
    """An `OriginProxy` on its own event-loop thread whose policy is the set of open episodes' paths."""

    def __init__(self, world: WebWorld, port: int = 0):
        self.world = world
        self.open: set[str] = set()
        self.refusals: list[str] = []
        self.last_page: dict[str, str] = {}
        """Per open episode, the last page the browser loaded in it."""
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="sites-gate")
        self._thread.start()
        self.proxy = asyncio.run_coroutine_threadsafe(
            OriginProxy(self._policy(), self._note).start(port), self.loop).result(30)
        self.url = self.proxy.url
        self.proxy.on_forward = self._seen

    def _seen(self, method: str, url: str, headers: bytes) -> None:
        if method != "GET" or b"sec-fetch-dest: document" not in headers.lower():
            return  # a form's POST redirects to the page it shows; subresources are no page
        for episode in list(self.open):
            if url.startswith(self.world.sites.episode_prefix(episode)):
                self.last_page[episode] = url

    def _note(self, why: str) -> None:
        logger.info("sites gate refused: %s", why)
        self.refusals = [*self.refusals[-99:], why]

    def _policy(self) -> OriginPolicy:
        # No episode open: a path no episode has, so that everything is refused.
        prefixes = [self.world.sites.episode_prefix(e) for e in sorted(self.open)] or \
            [f"{self.world.sites.origin}/e/-/"]
        return OriginPolicy.of(prefixes, confine_paths=True)

    def admit(self, episode: str) -> None:
        with self._lock:
            self.open.add(episode)
            self.proxy.policy = self._policy()

    def dismiss(self, episode: str) -> None:
        with self._lock:
            self.open.discard(episode)
            self.last_page.pop(episode, None)
            self.proxy.policy = self._policy()

    def close(self) -> None:
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


class WebTaskEnv:
    """One episode's task and site state, browsed by another server (an `Env`; its `step` only explains)."""

    def __init__(self, world: WebWorld, gate: SitesGate | None = None, *, split: str = "train"):
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
        self.world, self.gate, self.split = world, gate, split
        self.episode: str | None = None
        self.config: dict | None = None
        self.done = False
        self.score = 0.0
        self.parts: dict[str, float] = {}
        self.start_url = self.final_url = ""

    @property
    def task_id(self) -> int | None:
        return None if self.config is None else self.config["task_id"]

    def reset(self, task_id: int = 0) -> StepResult:
        self.close()
        episode, config, self.start_url = self.world.open_task(self.split, task_id)
        self.episode, self.config, self.done, self.score, self.parts = episode, config, False, 0.0, {}
        if self.gate is not None:
            self.gate.admit(episode)
        prefix = self.world.sites.episode_prefix(episode)
        return StepResult(
            observation=(f"Task: {config['intent']}\nStart URL: {self.start_url}\nThe task's sites are the pages "
                         f"under {prefix}. Use the browser to do the task, then call evaluate(answer, final_url)."),
            info={"task_id": config["task_id"], "start_url": self.start_url, "sites": prefix, "split": self.split})

    def evaluate(self, answer: str, final_url: str) -> StepResult:
        if self.config is None or self.episode is None:
            raise EnvError("No task: call reset(task_id) first.")
        if not self.done:
            if not final_url:
                seen = self.gate.last_page.get(self.episode) if self.gate is not None else None
                final_url = seen or self.start_url
            scored = self.world.evaluate(self.episode, self.config, answer, final_url)
            self.done, self.score, self.parts, self.final_url = True, scored.score, scored.parts, final_url
        return StepResult(observation=f"Scored {self.score:g} (final URL {self.final_url}).", reward=self.score,
                          score=self.score, done=True, info={"answer": answer, "final_url": self.final_url,
                                                             "parts": self.parts})

    def step(self, action: str) -> StepResult:
        raise EnvError("this server has no browser: browse with the browser server's tools, then call "
                       "evaluate(answer, final_url)")

    def observe(self) -> str:
        if self.config is None:
            raise EnvError("No task: call reset(task_id) first.")
        return f"Task: {self.config['intent']}\nStart URL: {self.start_url}"

    def close(self) -> None:
        episode, self.episode = self.episode, None
        if episode is not None:
            if self.gate is not None:
                self.gate.dismiss(episode)
            self.world.sites.close_episode(episode)
