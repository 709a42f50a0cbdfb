"""The web environment: self-hosted sites on SQLite (`sites/`), WebArena-format tasks and their evaluator (`tasks/`),
and a headless-Chromium browser driven through playwright (`browser/`), served over MCP by `envs/tools/`.
"""
