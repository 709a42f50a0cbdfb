"""The web environment as a stateful MCP server (stdio): WebArena-style tasks on our shop, forum and wiki, played in
real headless Chromium, each episode with its own copy of the sites' databases.

Run: `python -m rlfactory.envs.tools.web [--split train|heldout] [--max-steps N] [--view text|pixels]
[--max-chars N] [--seed N] [--templates 1,6,202] [--heldout-from N] [--chromium PATH] [--max-episodes N]
[--idle-timeout-s S]`.

The server starts the site server itself (a child process on a free 127.0.0.1 port, stopped with the server) and
one Chromium for all episodes. Tools (each takes `episode_id`, filled in by rlfactory):
- `reset(task_id)`: task `task_id % N` of the split (ids 0, 1, 2: a shop, a forum and a wiki task); returns the
  intent and the start page's observation. `--templates`: only those templates' tasks are numbered;
  `--heldout-from H`: ids >= H open held-out task `id - H` (a learning recipe's validation rows, on the same
  server as its training rows; mcp_configs/web_learn.json).
- `step(action)`: one WebArena action; `stop [answer]` ends and scores the episode (`score` in [0, 1]), as does the
  step limit.
- `observe()`, `close()`, and the loop-only `fork(into)` (sites and browser copied).
The environment is `rlfactory/envs/web/env.py`; failures of the sites or the browser are infrastructure errors.

`--view pixels` (a screenshot per turn): every result, the reset's included, ends with a PNG of the tab (1280x720)
after its text. A vision-language policy sees it and its transcripts show it at its turn; a text-only policy reads
a note instead, and its run keeps the screenshots for the transcript viewer only with `rollout.keep_unseen_images:
true`. With either view the text is the page the agent read (accessibility tree, tabs, URL), which the viewer
shows as the tool turn, a long one folded.

`--browser none [--gate-port P]`: no browser here; another MCP server browses (the official Playwright MCP server,
mcp_configs/web_playwright_env.json, pointed at this server's origin proxy with `--proxy-server
http://127.0.0.1:P`, which lets through only the open episodes' pages). Tools then: `reset(task_id)` (the intent and
the start URL), `evaluate(answer, final_url)` (the score; ends the episode), `observe()`, `close()`
(`rlfactory/envs/web/task_env.py`).
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Annotated

import httpx
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field

from rlfactory.envs.mcp_server import EpisodeId, build_env_server, server_args
from rlfactory.envs.types import EnvError
from rlfactory.envs.web.browser.adapter import CHROMIUM, BrowserSettings
from rlfactory.envs.web.browser.observation import DEFAULT_MAX_CHARS
from rlfactory.envs.web.env import DEFAULT_MAX_STEPS, SPLITS, VIEWS, WebEnv, WebWorld
from rlfactory.envs.web.task_env import EVALUATE_DOC, SitesGate, WebTaskEnv

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "A web task on a shop, a forum and a wiki. Call reset(task_id) to start; it returns the task and the page's "
    "accessibility tree, where every element has an id in brackets ([12] link 'Red shirt'), then the tabs and the "
    "URL. Act with step(action), one action a call: click [id], type [id] [text] [press_enter], hover [id], "
    "press [keys], scroll [up|down], goto [url], go_back, go_forward, new_tab, tab_focus [i], close_tab. When the "
    "task is done call step with stop [answer] (the answer if the task asks a question, else stop [])."
)


def main() -> None:
    def extra(p):
        p.add_argument("--split", choices=SPLITS, default=SPLITS[0], help="which tasks the ids mean")
        p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="actions before an episode ends")
        p.add_argument("--view", choices=VIEWS, default=VIEWS[0],
                       help="pixels: a screenshot of the tab after each result's text")
        p.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS, help="observation budget in characters")
        p.add_argument("--seed", type=int, default=0, help="content seed of the sites (and so of the tasks)")
        p.add_argument("--templates", type=_ids, default=None,
                       help="comma-separated template ids: serve only their tasks (default: every template)")
        p.add_argument("--heldout-from", type=int, default=None,
                       help="task ids from this one on open held-out tasks (id minus this), whatever --split")
        p.add_argument("--cache", default=None, help="folder of the sites' seed databases")
        p.add_argument("--chromium", default=CHROMIUM, help="the Chromium executable (Debian's by default)")
        p.add_argument("--browser", choices=("ours", "none"), default="ours",
                       help="none: reset and evaluate only; another MCP server (Playwright's) is the browser")
        p.add_argument("--gate-port", type=int, default=0,
                       help="with --browser none: the port of the origin proxy the other browser uses")

    args = server_args("Web environment MCP server", max_episodes=32, extra=extra)
    world = WebWorld(seed=args.seed, cache=Path(args.cache) if args.cache else None,
                     browser=BrowserSettings(executable_path=args.chromium), with_browser=args.browser == "ours",
                     templates=args.templates)
    world.start()
    if args.browser == "none":
        serve_tasks_only(world, args)
        return

    def make() -> WebEnv:
        return WebEnv(world, split=args.split, max_steps=args.max_steps, view=args.view, max_chars=args.max_chars,
                      heldout_from=args.heldout_from)

    def health() -> tuple[bool, str]:
        try:
            ok = httpx.get(f"{world.sites.origin}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError as e:
            return False, f"the sites at {world.sites.origin} do not answer: {e}"
        if not ok:
            return False, f"the sites at {world.sites.origin} answer /health with an error"
        try:
            assert world.host is not None
            world.host.start()
        except EnvError as e:
            return False, f"the browser does not launch: {e}"
        proc = world.host.chromium.process()
        heldout = (f", {len(world.splits['heldout'])} held-out tasks from id {args.heldout_from}"
                   if args.heldout_from is not None else "")
        return True, (f"sites at {world.sites.origin}, {len(world.splits[args.split])} {args.split} tasks{heldout}, "
                      f"chromium running (pid {proc.pid if proc else '?'})")

    es = build_env_server(
        "web", make, instructions=INSTRUCTIONS,
        reset_doc=(f"Start web task `task_id` of the {args.split} split (any integer; the same id is the same task). "
                   "Returns the task and the start page's observation."),
        step_doc=("Play one browser action: click [id], type [id] [text] [press_enter] (1 or 0, default 1), "
                  "hover [id], press [keys], scroll [up|down], goto [url], go_back, go_forward, new_tab, "
                  "tab_focus [i], close_tab, or stop [answer] to finish (scored then). The ids are the numbers in "
                  "brackets in the last observation. Returns the new observation."),
        max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, health=health, forkable=True)
    es.on_shutdown.append(world.close)
    es.run()


def _ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write template ids separated by commas (e.g. 1,6,202)") from None


def serve_tasks_only(world: WebWorld, args) -> None:
    """The server of `--browser none`: reset, evaluate, observe, close; the browser is another server's."""
    gate = SitesGate(world, args.gate_port)
    logger.info("sites gate for the browser at %s", gate.url)

    def health() -> tuple[bool, str]:
        try:
            ok = httpx.get(f"{world.sites.origin}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError as e:
            return False, f"the sites at {world.sites.origin} do not answer: {e}"
        return ok, f"sites at {world.sites.origin}, browser gate at {gate.url} (--proxy-server {gate.url})"

    es = build_env_server(
        "web", lambda: WebTaskEnv(world, gate, split=args.split),
        instructions=("A web task on a shop, a forum and a wiki. Call reset(task_id) for the task and its start "
                      "URL; do it with the browser tools; then call evaluate(answer, final_url)."),
        reset_doc=(f"Start web task `task_id` of the {args.split} split. Returns the task and its start URL (open it "
                   "in the browser)."),
        step_doc=None, max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, health=health)

    def evaluate(answer: Annotated[str, Field(description="Your answer, or empty if the task asks none.")] = "",
                 final_url: Annotated[str, Field(description="The URL the browser shows at the end.")] = "",
                 episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        return es.act(episode_id, ctx, lambda env: env.evaluate(answer, final_url))

    es.add_tool(evaluate, EVALUATE_DOC)
    es.on_shutdown.extend([gate.close, world.close])
    es.run()


if __name__ == "__main__":
    main()
