"""Environments (TextCraft, BabyAI, SciWorld, Deep Search) as plain Python objects, the episode registry their MCP
servers share, and `EnvClient` for AgentGym's HTTP env protocol.

The MCP servers themselves are thin files in `envs/tools/`; this package holds what they wrap, so the same game
can be stepped in-process (benchmarks, tests) or served over HTTP (`envs/tools/agentgym_http_server.py`).
"""
from rlfactory.envs.types import Env, StepResult

__all__ = ["Env", "StepResult"]
