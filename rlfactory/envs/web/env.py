"""`WebEnv`: one web-environment episode — a task (WebArena config), the episode's own site state (shop, forum and
wiki databases under `/e/<episode>/`), and a browser context confined to that path — played with WebArena actions
and scored by the tasks' evaluator. `WebWorld` is what all episodes of one server share: the site server, the
browser process and the task list.

- `reset(task_id)`: task `task_id % N` of the world's split (train or held-out; the list interleaves the sites, so
  ids 0, 1, 2 are a shop, a forum and a wiki task), a fresh copy of the sites' databases, a browser at its start
  URL. The observation is the intent, then the page. A world built with `templates` serves only those templates'
  tasks; an env with `heldout_from=H` opens held-out task `task_id - H` for ids >= H (one server then serves a
  recipe's training rows and its held-out validation rows, as BabyAI's ids 10000+ do).
- `step(action)`: one WebArena action (`click [12]`, `type [3] [text] [1]`, `goto [url]`, `stop [answer]`, ...).
  `stop [answer]` ends the episode and scores it (answer, final URL and the episode's databases: `evaluator.py`);
  so does the step limit, scored on the pages and databases as they are, with no answer.
- `fork()`: the sites' databases and the browser context both copied into a new episode (forks share nothing).
- `picture()`: a screenshot PNG of the tab with `view="pixels"` (the server shows it after each result's text).
A browser, site or evaluator failure is an `EnvError` with `infra=True`, never an observation.
`info["progress"]`: for a task whose config names subgoal pages (`eval.subgoal_urls`: the page of the product or post
it asks about), the share of them the episode has visited so far, with every reset and step. It is not shown to the
policy and the score ignores it; `rewards/env.py`'s `env_progress` turns its rises into step rewards.
`state_key()`: the task, whether it ended, the subgoals visited, the page as observed (ids, notes and the episode's
own path left out) and a hash of the episode's database files: equal for equal states reached the same way; states
that are equal but whose databases were written differently (another number of transactions, a timestamp) get
different keys.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Collection
from itertools import zip_longest
from pathlib import Path

import httpx

from rlfactory.envs.types import EnvError, StepResult
from rlfactory.envs.web.browser.adapter import BrowserSettings
from rlfactory.envs.web.browser.host import BrowserEnv, BrowserHost
from rlfactory.envs.web.browser.observation import DEFAULT_MAX_CHARS
from rlfactory.envs.web.browser.policy import OriginPolicy
from rlfactory.envs.web.sites.server import WebSites
from rlfactory.envs.web.sites.store import SITES
from rlfactory.envs.web.tasks.build import build_tasks
from rlfactory.envs.web.tasks.evaluator import EvalResult, Evaluator, fill, subgoal_urls, subgoals_reached

logger = logging.getLogger(__name__)

SPLITS = ("train", "heldout")
_IDS = re.compile(r"\[\d+\] ")
VIEWS = ("text", "pixels")
DEFAULT_MAX_STEPS = 30


class WebInfraError(EnvError):
    """The sites, the browser or the evaluator failed: an infrastructure failure, kept out of the loss."""

    infra = True


def interleave_sites(configs: list[dict]) -> list[dict]:
    """The configs with their sites taken in turn (shop, forum, wiki, shop, ...), each site's in task-id order."""
    by_site: dict[str, list[dict]] = {}
    for c in sorted(configs, key=lambda c: c["task_id"]):
        by_site.setdefault(c["sites"][0], []).append(c)
    return [c for group in zip_longest(*by_site.values()) for c in group if c is not None]


def split_tasks(seed: int = 0, cache: Path | None = None,
                templates: Collection[int] | None = None) -> dict[str, list[dict]]:
    """{split: its task configs in the order `reset(task_id)` numbers them} for content `seed` (what a server with
    that seed serves; a demonstrator outside the server rebuilds it to know a task id's plan). `templates`: only
    those templates' tasks (what a server started with `--templates` serves)."""
    configs = [c for c in build_tasks(seed, cache) if templates is None or c["intent_template_id"] in templates]
    return {s: interleave_sites([c for c in configs if c["split"] == s]) for s in SPLITS}


@functools.lru_cache(maxsize=4)
def configs_by_id(seed: int = 0) -> dict[int, dict]:
    """Every task config of content `seed` by its `task_id` (the id a server's results report, whatever its split,
    templates or id offset), built once per process."""
    return {c["task_id"]: c for c in build_tasks(seed)}


class WebWorld:
    """The site server, the browser and the tasks shared by every episode of one process; `start()` / `close()`."""

    def __init__(self, *, seed: int = 0, cache: Path | None = None, browser: BrowserSettings | None = None,
                 with_browser: bool = True, templates: Collection[int] | None = None):
        self.sites = WebSites(seed=seed, cache=cache)
        self.seed, self.cache = seed, cache
        self.templates = None if templates is None else frozenset(templates)
        self.browser_settings = browser
        self.host: BrowserHost | None = None
        self.with_browser = with_browser
        self.splits: dict[str, list[dict]] = {}

    def start(self) -> WebWorld:
        splits = split_tasks(self.seed, self.cache, self.templates)
        if self.templates is not None and not all(splits.values()):  # before anything starts: nothing to stop
            known = sorted({c["intent_template_id"] for c in build_tasks(self.seed, self.cache)})
            raise ValueError(f"templates {sorted(self.templates)} leave a split without tasks "
                             f"({ {s: len(t) for s, t in splits.items()} }); known template ids: {known}")
        self.sites.start()
        self.splits = splits
        if self.with_browser:
            self.host = BrowserHost(self.browser_settings)
        return self

    def task(self, split: str, task_id: int) -> dict:
        tasks = self.splits.get(split)
        if not tasks:
            raise EnvError(f"split {split!r} has no tasks (use one of {', '.join(SPLITS)}; is the world started?)")
        return tasks[task_id % len(tasks)]

    def check_sites(self) -> None:
        """WebInfraError when the site server has exited (its pages would show the proxy's error, as if the
        policy's doing)."""
        proc = self.sites.proc
        if proc is None or proc.poll() is not None:
            raise WebInfraError(f"the web site server is not running (exit code "
                                f"{None if proc is None else proc.returncode}); restart the environment server")

    def open_task(self, split: str, task_id: int) -> tuple[str, dict, str]:
        """A new episode of task `task_id` of `split` with its own site state: (episode, task config, start URL).
        WebInfraError when the sites are down or cannot open it."""
        config = self.task(split, task_id)
        self.check_sites()
        episode = f"w{uuid.uuid4().hex[:16]}"
        try:
            self.sites.open_episode(episode, config.get("site_seed"))
        except (OSError, RuntimeError, ValueError) as e:
            raise WebInfraError(f"opening the sites of episode {episode} failed: {e}") from e
        return episode, config, fill(config["start_url"], self.sites.placeholders(episode))

    def evaluate(self, episode: str, config: dict, answer: str | None, final_url: str) -> EvalResult:
        """Score a finished episode on its own pages and databases (blocking: call it off any event loop)."""
        async def run() -> EvalResult:
            async with httpx.AsyncClient(timeout=30.0) as client:
                async def fetch(url: str) -> str:
                    return (await client.get(url, follow_redirects=True)).text

                ev = Evaluator(self.sites.placeholders(episode), fetch,
                               lambda site: self.sites.database(episode, site))
                return await ev(config, answer, final_url)
        try:
            return asyncio.run(run())
        except Exception as e:  # the sites or the config failed, never the policy
            raise WebInfraError(f"scoring task {config.get('task_id')} of episode {episode} failed: "
                                f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host = None
        self.sites.stop()

    def __enter__(self) -> WebWorld:  # noqa: PYI034 - a final class
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class WebEnv:
    """One episode of the web environment (an `Env`)."""

    def __init__(self, world: WebWorld, *, split: str = "train", max_steps: int = DEFAULT_MAX_STEPS,
                 view: str = "text", max_chars: int = DEFAULT_MAX_CHARS, heldout_from: int | None = None):
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
        if view not in VIEWS:
            raise ValueError(f"view {view!r}: use one of {', '.join(VIEWS)}")
        if world.host is None:
            raise ValueError("WebEnv needs a world started with its browser (WebWorld(with_browser=True))")
        self.world, self.split, self.max_steps, self.view, self.max_chars = world, split, max_steps, view, max_chars
        self.heldout_from = heldout_from
        self.task_split = split
        """The split of the open task: `split`, or held-out for an id >= `heldout_from`."""
        self.episode: str | None = None
        self.config: dict | None = None
        self.browser: BrowserEnv | None = None
        self.steps = 0
        self.done = False
        self.score = 0.0
        self.url = ""
        self.page = ""
        """The last observation of the page (what `state_key` reads)."""
        self.reached: set[int] = set()
        """Indices of the task's `subgoal_urls` visited in this episode."""

    @property
    def task_id(self) -> int | None:
        return None if self.config is None else self.config["task_id"]

    def _policy_urls(self, episode: str) -> list[str]:
        return [self.world.sites.episode_prefix(episode)]

    def reset(self, task_id: int = 0) -> StepResult:
        self.close()
        split = self.split
        if self.heldout_from is not None and task_id >= self.heldout_from:
            split, task_id = "heldout", task_id - self.heldout_from
        episode, config, self.url = self.world.open_task(split, task_id)
        self.task_split = split
        self.episode, self.config, self.steps, self.done, self.score = episode, config, 0, False, 0.0
        self.reached = set()
        self.browser = BrowserEnv(self.world.host, max_chars=self.max_chars)
        first = self.browser.open(self.url, self._policy_urls(episode), confine_paths=True)
        self.page = first.observation
        self._visit()
        return StepResult(observation=f"Task: {config['intent']}\n\n{first.observation}",
                          info=self._info(content_seed=self.world.seed))

    def _visit(self) -> None:
        """Count the subgoal pages the current URL is."""
        if self.config is not None and self.episode is not None:
            self.reached |= subgoals_reached(self.config, self.world.sites.placeholders(self.episode), self.url)

    def _info(self, **extra) -> dict:
        c = self.config or {}
        subgoals = subgoal_urls(c)
        progress = {"progress": len(self.reached) / len(subgoals)} if subgoals else {}
        return {"task_id": c.get("task_id"), "template_id": c.get("intent_template_id"), "site": (c.get("sites")
                or [None])[0], "split": self.task_split, "url": self.url, "steps": self.steps, **progress, **extra}

    def _live(self) -> BrowserEnv:
        if self.browser is None or self.config is None:
            raise EnvError("No task: call reset(task_id) first.")
        return self.browser

    def step(self, action: str) -> StepResult:
        browser = self._live()
        if self.done:
            return StepResult(observation="The episode has ended: call reset(task_id) for a new task.",
                              score=self.score, done=True, info=self._info())
        result = browser.step(action)
        self.world.check_sites()  # a page the dead site server did not serve is not an observation
        self.steps += 1
        self.url = result.info.get("url", self.url)
        self.page = result.observation
        self._visit()
        if result.done:
            return self._finish(result.observation, result.info.get("answer"))
        if self.steps >= self.max_steps:
            return self._finish(f"{result.observation}\n\nThe step limit ({self.max_steps}) is reached: the episode "
                                "ends here.", None)
        return StepResult(observation=result.observation, info=self._info())

    def _finish(self, observation: str, answer: str | None) -> StepResult:
        assert self.config is not None and self.episode is not None
        scored = self.world.evaluate(self.episode, self.config, answer, self.url)
        self.done, self.score = True, scored.score
        return StepResult(observation=observation, reward=scored.score, score=scored.score, done=True,
                          info=self._info(answer=answer, parts=scored.parts))

    def observe(self) -> str:
        return self._live().observe()

    def state_key(self) -> str | None:
        if self.config is None or self.episode is None:
            return None
        page = _IDS.sub("", self.page).replace(self.world.sites.episode_prefix(self.episode), "/e/-/")
        page = "\n".join(line for line in page.splitlines() if not line.startswith("Note: "))
        databases = hashlib.blake2b(digest_size=16)
        for site in SITES:
            databases.update(self.world.sites.store.path(self.episode, site).read_bytes())
        return json.dumps([self.task_split, self.config["task_id"], self.done, sorted(self.reached), page,
                           databases.hexdigest()])

    def picture(self) -> bytes | None:
        """The tab's visible part as a PNG with the pixel view; None with the text view or before a task."""
        if self.view != "pixels" or self.browser is None:
            return None
        return self.browser.screenshot()

    def fork(self) -> WebEnv:
        """A copy that goes on from here in sites and browser of its own."""
        browser = self._live()
        assert self.episode is not None
        self.world.check_sites()
        twin = WebEnv(self.world, split=self.split, max_steps=self.max_steps, view=self.view,
                      max_chars=self.max_chars, heldout_from=self.heldout_from)
        twin.task_split = self.task_split
        dst = f"w{uuid.uuid4().hex[:16]}"
        try:
            self.world.sites.fork_episode(self.episode, dst)
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            raise WebInfraError(f"forking the sites of episode {self.episode} failed: {e}") from e
        src_prefix, dst_prefix = self.world.sites.episode_prefix(self.episode), self.world.sites.episode_prefix(dst)
        try:
            twin.browser = browser.fork(policy=OriginPolicy.of(self._policy_urls(dst), confine_paths=True),
                                        rewrite=lambda url: url.replace(src_prefix, dst_prefix, 1))
        except BaseException:
            self.world.sites.close_episode(dst)
            raise
        twin.episode, twin.config, twin.steps, twin.done, twin.score = dst, self.config, self.steps, self.done, \
            self.score
        twin.reached = set(self.reached)
        twin.url = self.url.replace(src_prefix, dst_prefix, 1)
        twin.page = self.page.replace(src_prefix, dst_prefix)
        return twin

    def close(self) -> None:
        browser, episode, self.browser, self.episode = self.browser, self.episode, None, None
        if browser is not None:
            browser.close()
        if episode is not None:
            self.world.sites.close_episode(episode)
