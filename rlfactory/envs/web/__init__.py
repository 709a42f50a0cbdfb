"""The web environment: self-hosted sites on SQLite (`sites/`), WebArena-format tasks and their evaluator (`tasks/`),
and a headless-Chromium browser driven through playwright (`browser/`); `env.py` puts them together as one
environment (`WebEnv`: a task, its own site state, a browser confined to it, scored at `stop`), `task_env.py` the
same without a browser of its own (for the official Playwright MCP server), `demonstrator.py` plays a task's plan
through the browser by the observation's ids. Served over MCP by `envs/tools/web.py` (and `envs/tools/browser.py`,
the browser alone).
"""
