"""Scripted solvers that play the environments from their observations only (no peeking at internals).

Shared by the tests and bench/envs.py; each returns the actions to send, one at a time, given what it has seen.
"""
from __future__ import annotations

import math
import re

_CMD = re.compile(r"^craft (\d+) (.+?) using (.+)$")


def textcraft_plan(observation: str) -> list[str]:
    """All actions that craft the goal, using only the crafting commands listed in the reset observation."""
    goal = re.search(r"Goal: craft (.+)\.", observation).group(1)
    recipes: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    for line in observation.splitlines():
        m = _CMD.match(line.strip())
        if m:
            inputs = [(int(n), item) for n, item in (p.strip().split(" ", 1) for p in m.group(3).split(","))]
            recipes.setdefault(m.group(2), (int(m.group(1)), inputs))
    actions: list[str] = []
    have: dict[str, int] = {}

    def obtain(item: str, need: int) -> None:
        if have.get(item, 0) >= need:
            return
        if item not in recipes:
            actions.append(f"get {need - have.get(item, 0)} {item}")
            have[item] = need
            return
        out_n, inputs = recipes[item]
        times = math.ceil((need - have.get(item, 0)) / out_n)
        for _ in range(times):
            # Crafting one ingredient may use up another (sticks eat planks): repeat until all are on hand.
            while any(have.get(i, 0) < n for n, i in inputs):
                for n, i in inputs:
                    obtain(i, n)
            for n, i in inputs:
                have[i] -= n
            ins = ", ".join(f"{n} {i}" for n, i in inputs)
            actions.append(f"craft {out_n} {item} using {ins}")
            have[item] = have.get(item, 0) + out_n

    obtain(goal, 1)
    return actions


class BabyAIShadow:
    """Plays a BabyAI task with minigrid's own planner (BabyAIBot) on a private copy of the level, seeded like the
    server's, and yields the action *names* to send to the server."""

    def __init__(self, level: str, seed: int):
        import warnings

        import gymnasium as gym
        import minigrid  # noqa: F401
        from minigrid.utils.baby_ai_bot import BabyAIBot

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.env = gym.make(level)
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints level-sampling retries
            self.env.reset(seed=seed)
        self.bot = BabyAIBot(self.env)

    def next_action(self) -> str:
        from rlfactory.envs.babyai import ACTIONS

        index = int(self.bot.replan())
        self.env.step(index)
        return next(name for name, i in ACTIONS.items() if i == int(index))
