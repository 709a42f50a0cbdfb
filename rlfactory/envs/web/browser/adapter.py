"""The adapter to playwright (async API): the ONLY module of rlfactory that imports it. Everything else uses the
types here (`Chromium`, `Context`, `Tab`) and two errors: `ActionFailed` (feedback for the model) and `BrowserLost`
(an infrastructure failure).

- `Chromium`: one browser process — Debian's /usr/bin/chromium through `executable_path`, never a downloaded
  browser — launched on first use and launched again when it died (`generation` counts the launches; every context
  of an earlier generation is lost with its process).
- `Context`: one browser context per episode, the episode's containment with it:
  * every request goes through the context's own proxy (`proxy.py`), which forwards only the episode's origins
    and answers anything else 403 — each hop of a redirect chain included. (A Playwright route was the first
    design: routes see only a chain's first URL, so a site redirecting twice could lead the browser out.)
  * downloads are refused (`accept_downloads=False`), service workers blocked, pop-ups (`window.open`, links with
    `target=_blank`) refused in the page as they are asked for, JavaScript dialogs answered
    (alert/confirm/beforeunload accepted, prompt
    dismissed) — each leaves a note for the next observation;
  * `file:`, `data:` and `chrome:` navigations are refused by `OriginPolicy` before `goto`, and Chromium itself
    refuses a page's links to them.
  A crashed page or a lost browser makes the context `lost` (its reason); the caller reports that as
  infrastructure.
- `Tab`: one page: snapshot, navigation, element actions by Playwright ref (`aria-ref=e12`).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import psutil
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import async_playwright

from rlfactory.envs.types import EnvError
from rlfactory.envs.web.browser.policy import OriginPolicy
from rlfactory.envs.web.browser.proxy import OriginProxy

logger = logging.getLogger(__name__)

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run")
"""Without the background-networking flags Chromium reaches for Google's services as it starts."""
_TAG_FLAG = "--rlfactory-browser-tag"
"""A switch Chromium ignores, put on the command line to find this process (and its tree) for RSS and tests."""
_NO_POPUPS_JS = """(() => {
  const refused = (url) => {
    let href = String(url || "about:blank");
    try { href = new URL(href, location.href).href; } catch (e) {}
    (window.__rlfRefusedPopups = window.__rlfRefusedPopups || []).push(href);
  };
  window.open = function (url) { refused(url); return null; };
  document.addEventListener("click", (e) => {
    const a = e.target && e.target.closest ? e.target.closest("a[target], area[target]") : null;
    if (a && !["", "_self", "_top", "_parent"].includes(a.target)) { e.preventDefault(); refused(a.href); }
  }, true);
})();"""
"""Refuses pop-ups inside the page, as they are asked for (`window.open`, links to another window), so the step that
asked sees its note; the context's `page` event closes any that still open (a form posting to a new window)."""
MAX_NOTES = 8
"""Notes kept for one observation (a page that fires 100 refused requests must not flood it)."""
_KEYS = {"ctrl": "Control", "control": "Control", "cmd": "Meta", "meta": "Meta", "alt": "Alt", "shift": "Shift",
         "enter": "Enter", "return": "Enter", "tab": "Tab", "esc": "Escape", "escape": "Escape",
         "backspace": "Backspace", "delete": "Delete", "space": "Space", "up": "ArrowUp", "down": "ArrowDown",
         "left": "ArrowLeft", "right": "ArrowRight", "pageup": "PageUp", "pagedown": "PageDown", "home": "Home",
         "end": "End"}


class BrowserLost(EnvError):
    """The episode's browser process or page died under it: an infrastructure failure, never trained on."""

    infra = True


class ActionFailed(Exception):
    """An action could not be done on this page (no such element, hidden, disabled, timed out): feedback text."""


@dataclass(frozen=True)
class BrowserSettings:
    executable_path: str = CHROMIUM
    action_timeout_s: float = 5.0
    """Per element action (Playwright waits this long for an element to become actionable)."""
    navigation_timeout_s: float = 20.0
    viewport: tuple[int, int] = (1280, 720)
    extra_args: tuple[str, ...] = ()


class Chromium:
    """One Chromium process for many episodes; launched lazily, again after it died."""

    def __init__(self, settings: BrowserSettings | None = None):
        self.settings = settings or BrowserSettings()
        self.generation = 0
        self.launches = 0
        self._tag = uuid.uuid4().hex[:12]
        self._pw: Any = None
        self._browser: Any = None
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    async def ensure(self) -> None:
        """Launch the browser if it is not running (first use, or it died)."""
        async with self._lock:
            if self.connected:
                return
            if self._browser is not None:
                logger.warning("chromium (generation %d) is gone; launching a new one", self.generation)
            if self._pw is None:
                self._pw = await async_playwright().start()
            s = self.settings
            try:
                self._browser = await self._pw.chromium.launch(
                    executable_path=s.executable_path, headless=True,
                    args=[*LAUNCH_ARGS, *s.extra_args, f"{_TAG_FLAG}={self._tag}"])
            except PlaywrightError as e:
                raise BrowserLost(f"could not launch {s.executable_path} ({_first_line(e)}); install Debian's "
                                  f"chromium (apt-get install chromium) or pass its path") from None
            self.generation += 1
            self.launches += 1

    async def new_context(self, policy: OriginPolicy, *, storage_state: dict[str, Any] | None = None) -> Context:
        await self.ensure()
        w, h = self.settings.viewport
        notes: list[str] = []
        proxy = await OriginProxy(policy, notes.append).start()
        try:
            ctx = await self._browser.new_context(accept_downloads=False, service_workers="block",
                                                  storage_state=storage_state, viewport={"width": w, "height": h},
                                                  proxy={"server": proxy.url, "bypass": ""})
        except PlaywrightError as e:
            await proxy.close()
            raise BrowserLost(f"the browser could not open a context: {_first_line(e)}") from None
        context = Context(self, ctx, policy, self.generation, proxy)
        proxy.note = context.note
        await context.setup()
        return context

    @property
    def open_contexts(self) -> int:
        """Browser contexts open in the running browser (one per open episode)."""
        return len(self._browser.contexts) if self.connected else 0

    def process(self) -> psutil.Process | None:
        """The browser's own process (the root of its renderers, GPU and utility processes), or None."""
        flag = f"{_TAG_FLAG}={self._tag}"
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmd = p.info["cmdline"] or []
                if flag in cmd and "--type" not in " ".join(cmd):
                    return p
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return None

    def memory_bytes(self, *, proportional: bool = False) -> int:
        """Memory of the browser's whole process tree (0 when it is not running): the sum of RSS, or with
        `proportional` of PSS (each shared page divided among the processes sharing it: what the tree costs, where
        summed RSS counts Chromium's shared pages once per process)."""
        root = self.process()
        if root is None:
            return 0
        total = 0
        for p in [root, *root.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss if proportional else p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total

    async def close(self) -> None:
        browser, self._browser = self._browser, None
        pw, self._pw = self._pw, None
        if browser is not None:
            try:
                await browser.close()
            except PlaywrightError:
                pass
        if pw is not None:
            await pw.stop()


class Context:
    """One episode's browser context: its tabs, its containment, the notes for its next observation."""

    def __init__(self, chromium: Chromium, ctx: Any, policy: OriginPolicy, generation: int, proxy: OriginProxy):
        self.chromium = chromium
        self.proxy = proxy
        self.policy = policy
        self.generation = generation
        self.tabs: list[Tab] = []
        self.active = 0
        self.notes: list[str] = []
        self._lost: str | None = None
        self._ctx = ctx
        self._opening_own = False

    async def setup(self) -> None:
        s = self.chromium.settings
        self._ctx.set_default_timeout(s.action_timeout_s * 1000)
        self._ctx.set_default_navigation_timeout(s.navigation_timeout_s * 1000)
        await self._ctx.add_init_script(_NO_POPUPS_JS)
        self._ctx.on("page", self._on_page)
        self._ctx.on("dialog", self._on_dialog)

    # ---- state -------------------------------------------------------------------------------------------------
    @property
    def lost(self) -> str | None:
        """Why this context is unusable (its browser or page died), or None."""
        if self._lost is None and (self.chromium.generation != self.generation or not self.chromium.connected):
            self._lost = "the browser process died"
        return self._lost

    def mark_lost(self, why: str) -> None:
        """This context is unusable from now on (kept: the first reason)."""
        self._lost = self._lost or why

    def check(self) -> None:
        if self.lost:
            raise BrowserLost(f"{self.lost}; this episode cannot go on (open a new one)")

    @property
    def tab(self) -> Tab:
        return self.tabs[self.active]

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES and text not in self.notes:
            self.notes.append(text)

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    # ---- tabs --------------------------------------------------------------------------------------------------
    async def new_tab(self, url: str | None = None) -> Tab:
        """A new tab (the active one), at `url` when given; its load's status is `tab.status`."""
        self.check()
        self._opening_own = True
        try:
            page = await self._ctx.new_page()
        except PlaywrightError as e:
            raise self._failure(e) from None
        finally:
            self._opening_own = False
        tab = Tab(self, page)
        self.tabs.append(tab)
        self.active = len(self.tabs) - 1
        if url:
            tab.status = await tab.goto(url)
        return tab

    async def close_tab(self, index: int) -> None:
        tab = self.tabs.pop(index)
        self.active = min(self.active if self.active < index else max(self.active - 1, 0), len(self.tabs) - 1)
        await _quietly(tab.page.close)

    async def focus(self, index: int) -> None:
        self.active = index
        await _quietly(self.tab.page.bring_to_front)

    async def storage_state(self) -> dict[str, Any]:
        """Cookies and local storage, for a fork."""
        self.check()
        try:
            return await self._ctx.storage_state()
        except PlaywrightError as e:
            raise self._failure(e) from None

    async def close(self) -> None:
        await _quietly(self._ctx.close)
        await self.proxy.close()

    def _failure(self, e: Exception) -> Exception:
        """A playwright error as ours: BrowserLost when the browser or page went under it, else ActionFailed."""
        if self.lost or any(t.page.is_closed() for t in self.tabs[self.active:self.active + 1]):
            self._lost = self._lost or "the page was closed under the episode"
            return BrowserLost(f"{self._lost} ({_first_line(e)})")
        return ActionFailed(_first_line(e))

    # ---- containment -------------------------------------------------------------------------------------------
    def _on_page(self, page: Any) -> None:
        if self._opening_own:
            return
        self.note(f"a pop-up window ({page.url}) was refused; open pages with goto [url] or new_tab")
        asyncio.ensure_future(_quietly(page.close))

    async def _on_dialog(self, dialog: Any) -> None:
        kind, message = dialog.type, " ".join(dialog.message.split())[:200]
        accept = kind != "prompt"
        self.note(f"a JavaScript {kind} dialog said {message!r} and was {'accepted' if accept else 'dismissed'}")
        await _quietly(dialog.accept if accept else dialog.dismiss)


_TAB_SERIALS = itertools.count(1)


class Tab:
    """One page of a context."""

    def __init__(self, context: Context, page: Any):
        self.context = context
        self.page = page
        self.status: int | None = None
        """The HTTP status of the page the tab was opened at."""
        self.serial = next(_TAB_SERIALS)
        """Unique among this process's tabs (element ids are handed out per tab and ref)."""
        page.on("crash", self._on_crash)
        page.on("download", self._on_download)

    def _on_crash(self, _page: Any) -> None:
        self.context._lost = "the page crashed (its renderer process died)"

    def _on_download(self, download: Any) -> None:
        self.context.note(f"a download of {download.suggested_filename!r} was refused")

    @property
    def url(self) -> str:
        return self.page.url

    async def title(self) -> str:
        try:
            return await self.page.title()
        except PlaywrightError:
            return ""

    async def _do(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        self.context.check()
        try:
            return await fn()
        except PlaywrightError as e:
            raise self.context._failure(e) from None

    async def snapshot(self) -> str:
        timeout_ms = self.context.chromium.settings.navigation_timeout_s * 1000
        return await self._do(lambda: self.page.aria_snapshot(mode="ai", boxes=True, timeout=timeout_ms))

    async def settle(self) -> None:
        """Wait for the page's load event after an action that may navigate (a note when it does not come), and
        note the pop-ups the page refused meanwhile."""
        try:
            await self.page.wait_for_load_state("load")
        except PlaywrightError as e:
            self.context.check()
            self.context.note(f"the page had not finished loading ({_first_line(e)})")
        try:
            urls = await self.page.evaluate("() => (window.__rlfRefusedPopups || []).splice(0)")
        except PlaywrightError:  # the page navigated meanwhile: its record went with it
            urls = []
        for url in urls:
            self.context.note(f"a pop-up window ({url}) was refused; open pages with goto [url] or new_tab")

    async def goto(self, url: str) -> int | None:
        """Load `url`; its HTTP status (None for about:blank and the like)."""
        response = await self._do(lambda: self.page.goto(url, wait_until="load"))
        return None if response is None else response.status

    async def back(self) -> bool:
        return await self._do(lambda: self.page.go_back(wait_until="load")) is not None

    async def forward(self) -> bool:
        return await self._do(lambda: self.page.go_forward(wait_until="load")) is not None

    async def element(self, ref: str) -> Any:
        """The element of `ref`, ready to act on; ActionFailed saying why not (gone, hidden, disabled)."""
        loc = self.page.locator(f"aria-ref={ref}")
        if await self._do(loc.count) == 0:
            raise ActionFailed("that element is no longer on the page")
        if not await self._do(loc.is_visible):
            raise ActionFailed("that element is hidden (not visible on the page)")
        if not await self._do(loc.is_enabled):
            raise ActionFailed("that element is disabled")
        return loc

    async def click(self, ref: str) -> None:
        loc = await self.element(ref)
        await self._do(loc.click)

    async def hover(self, ref: str) -> None:
        loc = await self.element(ref)
        await self._do(loc.hover)

    async def type(self, ref: str, text: str, press_enter: bool) -> None:
        """Replace the field's text (a <select> picks the option labelled `text`), then Enter when asked."""
        loc = await self.element(ref)
        tag = await self._do(lambda: loc.evaluate("e => e.tagName.toLowerCase()"))
        if tag == "select":
            await self._do(lambda: loc.select_option(label=text))
        else:
            await self._do(lambda: loc.fill(text))
        if press_enter:
            await self._do(lambda: loc.press("Enter"))

    async def press(self, keys: str) -> None:
        """Press `keys` in the focused element (through its locator, so that a navigation the keys start, such as
        Enter submitting a form, is waited for as a click's is), or on the page when nothing has focus."""
        combo = "+".join(_KEYS.get(k.strip().lower(), k.strip()) for k in keys.split("+"))
        focused = await self._do(lambda: self.page.evaluate(
            "() => { const e = document.activeElement; return !!e && e !== document.body && "
            "e !== document.documentElement; }"))
        if focused:
            await self._do(lambda: self.page.locator("*:focus").first.press(combo))
        else:
            await self._do(lambda: self.page.keyboard.press(combo))

    async def scroll(self, down: bool) -> None:
        await self._do(lambda: self.page.evaluate("d => window.scrollBy(0, d * window.innerHeight * 0.9)",
                                                  1 if down else -1))

    async def screenshot(self) -> bytes:
        return await self._do(lambda: self.page.screenshot(type="png"))


async def _quietly(fn: Callable[[], Awaitable[Any]]) -> None:
    try:
        await fn()
    except PlaywrightError:
        pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
