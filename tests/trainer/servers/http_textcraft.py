"""The TextCraft environment server over streamable HTTP on 127.0.0.1:PORT/mcp: a separate service a run connects
to by URL, which a test can stop and start again on the same port (an environment outage).

Run: `python http_textcraft.py --port PORT`. The game and its tools are the stdio server's
(`rlfactory.envs.tools.textcraft`, task set `rlfactory`).
"""
from __future__ import annotations

import argparse

from rlfactory.envs.mcp_server import build_env_server
from rlfactory.envs.textcraft import TextCraftEnv
from rlfactory.envs.tools.textcraft import INSTRUCTIONS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    port = p.parse_args().port
    es = build_env_server(
        "textcraft", TextCraftEnv, instructions=INSTRUCTIONS,
        reset_doc="Start TextCraft task `task_id`. Returns the crafting commands and the goal item.",
        step_doc="Play one TextCraft action: `get <count> <item>`, `craft <count> <item> using <count> <item>, ...` "
                 "or `inventory`.",
        inline=True)
    es.server.run("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
