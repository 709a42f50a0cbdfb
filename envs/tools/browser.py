"""A web browser as a stateful MCP server (stdio): real headless Chromium, one browser context per episode, contained
to the episode's sites, observed and driven as WebArena's agents are.

Run: `python -m rlfactory.envs.tools.browser [--chromium PATH] [--max-chars N] [--show-urls] [--max-episodes N]
[--idle-timeout-s S] [--start-url URL ... --allow URL ...]`.

Tools (each takes `episode_id`, filled in by rlfactory with the trajectory id):
- `open(start_url, allowed_origins)`: a new context at `start_url`; only `allowed_origins` (base URLs; default the
  start URL's origin) are reachable. Returns the first observation.
- `act(action)`: one WebArena action (`click [12]`, `type [3] [red shirt] [1]`, `goto [url]`, `stop [answer]`, …);
  returns the observation (the accessibility tree with ids, tabs, URL, notes). `stop` ends the episode (`done`).
- `observe()`, `screenshot()` (a PNG image), `close()`, and the loop-only `fork(into)` (a new context with the same
  cookies, local storage and tab URLs).
With `--start-url` (and `--allow`), episodes open by task id instead: `reset(task_id)` opens start URL
`task_id % N` with the `--allow` origins (default: the start URL's), so a task row's `env: {server, task_id}` opens
it before the first turn; `open` is then not offered (the policy must not choose its own sites).
A browser or page that dies is an error result marked as infrastructure (`rlfactory/infra`): the trainer keeps the
trajectory out of the loss; the browser is launched again for the next episode. The code is in
`rlfactory/envs/web/browser/`; scoring is the web environment's (its evaluator), not this server's.
"""
from __future__ import annotations

import logging
from typing import Annotated

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field

from rlfactory.envs.mcp_server import EpisodeId, build_env_server, server_args
from rlfactory.envs.results import png_content
from rlfactory.envs.types import EnvError
from rlfactory.envs.web.browser.adapter import CHROMIUM, BrowserSettings
from rlfactory.envs.web.browser.host import BrowserEnv, BrowserHost
from rlfactory.envs.web.browser.observation import DEFAULT_MAX_CHARS
from rlfactory.envs.web.browser.policy import OriginPolicy

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "A web browser. Call open(start_url, allowed_origins) (or reset(task_id)) to start; each observation is the "
    "page's accessibility tree, where every element has an id in brackets ([12] link 'Red shirt'), then the open tabs and the URL. Act "
    "with act(action), one action a call: click [id], type [id] [text] [press_enter], hover [id], press [keys], "
    "scroll [up|down], goto [url], go_back, go_forward, new_tab, tab_focus [i], close_tab, stop [answer]."
)
OPEN_DOC = ("Open a browser page at `start_url` for this episode. Only the sites in `allowed_origins` (base URLs "
            "such as http://127.0.0.1:8001; default: the start URL's site) can be reached. Returns the page's "
            "observation.")
ACT_DOC = ("Play one browser action: click [id], type [id] [text] [press_enter] (press_enter 1 or 0, default 1), "
           "hover [id], press [keys] (e.g. Control+a), scroll [up|down], goto [url], go_back, go_forward, new_tab, "
           "tab_focus [tab index], close_tab, or stop [answer] when the task is done. The ids are the numbers in "
           "brackets in the last observation. Returns the new observation.")


def main() -> None:
    def extra(p):
        p.add_argument("--chromium", default=CHROMIUM, help="the Chromium executable (Debian's by default)")
        p.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                       help="observation budget in characters (about 4 a token); the tree is cut at the end")
        p.add_argument("--show-urls", action="store_true", help="show each link's URL in the observation")
        p.add_argument("--action-timeout-s", type=float, default=5.0,
                       help="how long an element action waits for its element to become actionable")
        p.add_argument("--start-url", action="append", default=[],
                       help="open episodes by reset(task_id) at this URL (repeat: task_id % N picks one)")
        p.add_argument("--allow", action="append", default=[],
                       help="with --start-url: the episodes' sites (base URLs; default: each start URL's site)")

    args = server_args("Browser MCP server", max_episodes=32, extra=extra)
    host = BrowserHost(BrowserSettings(executable_path=args.chromium, action_timeout_s=args.action_timeout_s))

    def make() -> BrowserEnv:
        return BrowserEnv(host, max_chars=args.max_chars, show_urls=args.show_urls,
                          start_urls=tuple(args.start_url), allowed_origins=tuple(args.allow))

    def health() -> tuple[bool, str]:
        try:
            host.start()
        except EnvError as e:
            return False, str(e)
        proc = host.chromium.process()
        return True, f"chromium running (pid {proc.pid if proc else '?'})"

    by_task = bool(args.start_url)
    if by_task:  # a start URL outside the sites fails here, not in every episode
        policy = OriginPolicy.of(args.allow or args.start_url)
        for url in args.start_url:
            if policy.refusal(url):
                raise SystemExit(f"--start-url {url}: {policy.refusal(url)}; add its site with --allow")
    reset_doc = (f"Open the browser for task `task_id` at one of {len(args.start_url)} start page(s). Returns the "
                 "page's observation.") if by_task else None
    es = build_env_server("browser", make, instructions=INSTRUCTIONS, reset_doc=reset_doc, step_doc=None,
                          max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, health=health,
                          forkable=True)
    if not by_task:
        es.start_call = "open(start_url, allowed_origins)"

    def open(start_url: Annotated[str, Field(description="The page to open, e.g. http://127.0.0.1:8001/")],
             allowed_origins: Annotated[list[str], Field(description="The episode's sites (base URLs); empty: the "
                                                                     "start URL's site.")] = [],  # noqa: B006
             episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        return es.act(episode_id, ctx, lambda env: env.open(start_url, allowed_origins or None), create=True)

    def act(action: Annotated[str, Field(description="One action, e.g. click [12]")], episode_id: EpisodeId = "",
            ctx: Context | None = None) -> CallToolResult:
        return es.act(episode_id, ctx, lambda env: env.step(action))

    def screenshot(episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        return es.look(episode_id, ctx, lambda ep, _key: CallToolResult(content=[png_content(ep.env.screenshot())]))

    if not by_task:
        es.add_tool(open, OPEN_DOC)
    es.add_tool(act, ACT_DOC)
    es.add_tool(screenshot, "A PNG screenshot of the current tab's visible part.")
    es.on_shutdown.append(host.close)
    es.run()


if __name__ == "__main__":
    main()
