"""MCP server fronting any server that speaks AgentGym's HTTP env protocol (TextCraft, BabyAI, SciWorld, WebShop,
WebArena, ... as run by AgentGym): tools `reset(task_id)`, `step(action)`, `observe()`, `close()`.

Run: `python -m rlfactory.envs.tools.agentgym_bridge --url http://127.0.0.1:36001 --env textcraft`
(or env AGENTGYM_URL / AGENTGYM_ENV). `--id-key` / `--reset-key` override the protocol variant (see
`rlfactory/envs/client.py`). Each MCP episode creates its own instance on the AgentGym server and closes it when the
episode closes, when the MCP connection that opened it goes away, and when the bridge ends (stdin EOF, SIGTERM):
AgentGym never expires an instance. An example config is examples/agentgym_bridge.json.

A restarted AgentGym server numbers its instances from 0 again, so an old episode's id can name a new episode's
instance. The bridge never acts on an instance it cannot show is still its episode's (`EnvClient`: the host's
restart record, shared by the bridge processes of one host through `--state-dir`; a sentinel instance per process,
`--no-sentinel` to do without; an observation check per call, `--no-verify-owner` to skip it); such an episode fails
as an infrastructure failure (kept out of training).

The server's own errors (`{"error": ...}` replies, an unreachable URL) are error results with the message; a
failed reset before the first turn makes the trajectory an error (`rollout/errors`). The resource
`rlfactory://health` says whether the upstream answers (`rlfactory setup-mcp` checks it).
"""
from __future__ import annotations

import argparse
import logging
import os

from rlfactory.envs.client import EnvClient, check_upstream
from rlfactory.envs.mcp_server import build_env_server
from rlfactory.envs.sentinel import SENTINELS


def main() -> None:
    p = argparse.ArgumentParser(description="AgentGym HTTP env protocol -> MCP bridge")
    p.add_argument("--url", default=os.environ.get("AGENTGYM_URL"), help="base URL of the AgentGym env server")
    p.add_argument("--env", default=os.environ.get("AGENTGYM_ENV", "textcraft"), help="environment name")
    p.add_argument("--id-key", default=None, help="instance id field (default: per env, usually `id`)")
    p.add_argument("--reset-key", default=None, help="task index field of /reset (default: per env, `data_idx`)")
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--max-episodes", type=int, default=256)
    p.add_argument("--idle-timeout-s", type=float, default=900.0)
    p.add_argument("--state-dir", default=os.environ.get("AGENTGYM_STATE_DIR"),
                   help="folder of this host's record of the server's restarts, shared by its bridge processes "
                        "(default: the system temp folder)")
    p.add_argument("--verify-owner", action=argparse.BooleanOptionalAction, default=True,
                   help="check the instance's observation before each call (one request a step)")
    p.add_argument("--sentinel", action=argparse.BooleanOptionalAction, default=True,
                   help="keep a sentinel instance that shows a server restart (textcraft, babyai; one request a step)")
    args = p.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the server log
    if not args.url:
        p.error("give the AgentGym server URL with --url or the AGENTGYM_URL environment variable")
    es = build_env_server(
        f"agentgym-{args.env}",
        lambda: EnvClient(args.env, args.url, id_key=args.id_key, reset_key=args.reset_key,
                          timeout_s=args.timeout_s, verify_owner=args.verify_owner, sentinel=args.sentinel,
                          state_dir=args.state_dir),
        instructions=f"AgentGym environment `{args.env}` served at {args.url}. Call reset(task_id), then "
                     "step(action) with the environment's text actions until done.",
        reset_doc=f"Start task `task_id` of the {args.env} environment. Returns the first observation.",
        step_doc=f"Send one text action to the {args.env} environment. Returns the observation, reward and "
                 "whether the episode is done.",
        max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s,
        health=lambda: check_upstream(args.url, timeout_s=min(args.timeout_s, 10.0)))
    es.on_shutdown.append(SENTINELS.close_all)
    es.run()


if __name__ == "__main__":
    main()
