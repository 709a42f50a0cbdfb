"""`BrowserEpisode`: one web episode in a browser context of its own — open at a start URL among the episode's
allowed origins, play WebArena actions, observe, screenshot, fork, close (async; `host.py` gives it a sync face).

What the policy gets back from every step is an observation (`observation.py`): the tree of the current tab with
ids, the tabs, the URL, and notes — what the last action did wrong (a malformed action, an unknown id, a hidden or
disabled element, a link or URL out of the sites), and what the page did (a refused request, pop-up or download, an
answered dialog). None of those is an exception. A dead browser or page is: `BrowserLost`, an infrastructure
failure that ends the episode (the MCP server marks it so, and the trainer keeps it out of the loss).

`stop [answer]` ends the episode with `done`; the answer is in the observation and `info["answer"]`. Scoring is not
here: the web environment's evaluator reads the answer, the URL and the sites' databases.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import urljoin

from rlfactory.envs.types import EnvError, StepResult
from rlfactory.envs.web.browser.actions import Action, ActionParseError, parse_action
from rlfactory.envs.web.browser.adapter import ActionFailed, BrowserLost, Chromium, Context
from rlfactory.envs.web.browser.observation import DEFAULT_MAX_CHARS, IdTable, Tree, parse_snapshot, render
from rlfactory.envs.web.browser.policy import OriginPolicy

logger = logging.getLogger(__name__)

NO_PAGE = "No page is open: call open(start_url, allowed_origins) first."


class BrowserEpisode:
    def __init__(self, chromium: Chromium, *, max_chars: int = DEFAULT_MAX_CHARS, show_urls: bool = False):
        self.chromium = chromium
        self.max_chars = max_chars
        self.show_urls = show_urls
        self.context: Context | None = None
        self.tree = Tree(lines=[])
        self.ids = IdTable()
        self.done = False
        self.answer: str | None = None
        self.steps = 0

    async def open(self, start_url: str, allowed_origins: list[str] | None = None, *,
                   confine_paths: bool = False) -> StepResult:
        """A new context at `start_url`; `allowed_origins` are the episode's sites (default: the start URL's);
        `confine_paths`: only URLs under those base URLs' paths too (`OriginPolicy`)."""
        try:
            policy = OriginPolicy.of(list(allowed_origins or [start_url]), confine_paths=confine_paths)
        except ValueError as e:
            raise EnvError(f"open: {e}") from None
        why = policy.refusal(start_url)
        if why is not None:
            raise EnvError(f"open: start_url {why}; list its site in allowed_origins")
        await self.close()
        self.done, self.answer, self.steps, self.ids = False, None, 0, IdTable()
        self.context = await self.chromium.new_context(policy)
        try:
            tab = await self.context.new_tab(start_url)
        except ActionFailed as e:  # the site did not answer: ours to fix, not the policy's
            raise BrowserLost(f"open: {start_url} did not load ({e})") from None
        if tab.status is not None and tab.status >= 500:  # a site that is down or broken: not the policy's doing
            raise BrowserLost(f"open: {start_url} answered HTTP {tab.status}; is the site up?")
        return StepResult(observation=await self.observe(), info={"url": start_url})

    async def observe(self, feedback: str | None = None) -> str:
        ctx = self._context()
        tab = ctx.tab
        try:
            snapshot = await tab.snapshot()
        except ActionFailed as e:  # reading the page is not the policy's doing: a page that cannot be read is ours
            raise BrowserLost(f"the page could not be read ({e})") from None
        self.tree = parse_snapshot(snapshot, ids=self.ids, tab=tab.serial, show_urls=self.show_urls)
        titles = [await t.title() for t in ctx.tabs]
        notes = ([feedback] if feedback else []) + ctx.take_notes()
        return render(tree=self.tree, url=tab.url, tabs=titles, active_tab=ctx.active, notes=notes,
                      max_chars=self.max_chars)

    async def act(self, text: str) -> StepResult:
        """Play one action written by the policy; the observation after it."""
        ctx = self._context()
        if self.done:
            return StepResult(observation=f"The episode has ended (stop [{self.answer}]).", done=True,
                              info={"answer": self.answer})
        ctx.check()
        self.steps += 1
        feedback = None
        try:
            action = parse_action(text)
        except ActionParseError as e:
            action, feedback = None, f"Invalid action: {e}"
        if action is not None:
            try:
                await self._play(ctx, action)
            except ActionFailed as e:
                feedback = f"{action.describe()} failed: {e}"
        if action is not None and action.name == "stop":
            self.done, self.answer = True, action.text
            return StepResult(observation=f"Stopped with the answer: {action.text}", done=True,
                              info={"answer": action.text, "url": ctx.tab.url})
        return StepResult(observation=await self.observe(feedback), info={"url": ctx.tab.url})

    async def _play(self, ctx: Context, action: Action) -> None:
        tab = ctx.tab
        name = action.name
        if action.element is not None:
            el = self.tree.elements.get(action.element)
            if el is None:
                raise ActionFailed(f"there is no element [{action.element}] in the current observation (use an "
                                   f"id shown in brackets there)")
            if name == "click" and el.url:
                why = ctx.policy.refusal(el.url, base=tab.url)
                if why is not None:
                    raise ActionFailed(f"the link leads out of the sites: {why}")
            if name == "click":
                await tab.click(el.ref)
                await tab.settle()
            elif name == "hover":
                await tab.hover(el.ref)
            else:
                await tab.type(el.ref, action.text, action.press_enter)
                await tab.settle()
        elif name == "press":
            await tab.press(action.text)
            await tab.settle()
        elif name == "scroll":
            await tab.scroll(down=action.text == "down")
        elif name == "goto":
            why = ctx.policy.refusal(action.text, base=tab.url)
            if why is not None:
                raise ActionFailed(why)
            await tab.goto(urljoin(tab.url, action.text))
        elif name == "go_back":
            if not await tab.back():
                raise ActionFailed("there is no earlier page in this tab")
        elif name == "go_forward":
            if not await tab.forward():
                raise ActionFailed("there is no later page in this tab")
        elif name == "new_tab":
            await ctx.new_tab()
        elif name == "tab_focus":
            if not 0 <= (action.tab or 0) < len(ctx.tabs):
                raise ActionFailed(f"there is no tab {action.tab} (tabs 0 to {len(ctx.tabs) - 1} are open)")
            await ctx.focus(action.tab or 0)
        elif name == "close_tab":
            if len(ctx.tabs) == 1:
                raise ActionFailed("this is the only tab")
            await ctx.close_tab(ctx.active)

    async def screenshot(self) -> bytes:
        """A PNG of the current tab's viewport."""
        try:
            return await self._context().tab.screenshot()
        except ActionFailed as e:
            raise BrowserLost(f"the page could not be captured ({e})") from None

    async def fork(self, *, policy: OriginPolicy | None = None,
                   rewrite: Callable[[str], str] | None = None) -> BrowserEpisode:
        """A new episode in a new context with this one's cookies and local storage, its tabs at the same URLs
        (the active one active). `policy` / `rewrite(url)`: the copy's sites and where each tab's URL moves to (the
        web environment forks its sites into a new episode path too). Left out: form fields typed but not
        submitted, scroll positions, history."""
        ctx = self._context()
        ctx.check()
        state = await ctx.storage_state()
        twin = BrowserEpisode(self.chromium, max_chars=self.max_chars, show_urls=self.show_urls)
        twin.context = await self.chromium.new_context(policy or ctx.policy, storage_state=state)
        try:
            for tab in ctx.tabs:
                url = tab.url if rewrite is None or tab.url == "about:blank" else rewrite(tab.url)
                await twin.context.new_tab(url if url != "about:blank" else None)
            await twin.context.focus(ctx.active)
        except ActionFailed:
            await twin.close()
            raise BrowserLost("fork: the copy's pages did not load") from None
        except BaseException:  # lost, or cancelled (the call timed out): the copy must not stay open
            await twin.close()
            raise
        twin.done, twin.answer, twin.steps = self.done, self.answer, self.steps
        return twin

    async def close(self) -> None:
        ctx, self.context = self.context, None
        if ctx is not None:
            await ctx.close()

    def _context(self) -> Context:
        if self.context is None:
            raise EnvError(NO_PAGE)
        return self.context
