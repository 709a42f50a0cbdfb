"""Scripted solvers: the demonstrators of `rlfactory sft` (rlfactory/warmup/env_demos.py), the tests and bench/envs.py.

- `textcraft_plan`: every action that crafts the goal, read from the reset observation alone (style `plan`), or
  with a `get` of each item first, whose answer names a craftable item's crafting command (style `ask`).
- `BabyAIShadow`: minigrid's own planner (BabyAIBot) on a private copy of the level, in minigrid's action names.
- `BabyAIWords`: the same private copy, playing AgentGym's action *words* (the `agentgym` task set) in one of two
  styles: `walk` (the planner's low-level steps: `turn left`, `move forward`, `toggle`, a `pickup` of what is in
  front, ...) or `macro` (AgentGym's `go to` / `pickup` / `toggle and go through` macros for each part of the goal
  they cover, the planner's steps otherwise). Each returns the actions to send, one at a time.
- `babyai_shortest` / `BabyAISearch`: a breadth-first search over AgentGym's action words on forks of the real
  environment, and the demonstrator (style `search`) that plays the shortest solution it finds: it goes through the
  door that hides the target first time, which a policy seeing only its view has to guess.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
import signal
import threading
from typing import Any

from rlfactory.envs.babyai_agentgym import CHECK, mission_clauses, names_object

_CMD = re.compile(r"^craft (\d+) (.+?) using (.+)$")


def _textcraft_commands(observation: str) -> tuple[str, dict[str, tuple[int, list[tuple[int, str]]]]]:
    """The goal and the listed recipes (item -> (count made, [(count, input)])) of a reset observation."""
    goal = re.search(r"Goal: craft (.+)\.", observation).group(1)
    recipes: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    for line in observation.splitlines():
        m = _CMD.match(line.strip())
        if m:
            inputs = [(int(n), item) for n, item in (p.strip().split(" ", 1) for p in m.group(3).split(","))]
            recipes.setdefault(m.group(2), (int(m.group(1)), inputs))
    return goal, recipes


def textcraft_plan(observation: str, style: str = "plan") -> list[str]:
    """All actions that craft the goal, using only the crafting commands listed in the reset observation.

    Styles: `plan` gets what each craft needs just before it; `ask` first tries to `get` every item it needs, the
    goal included, so the environment's answer names a craftable item's crafting command, then obtains its inputs in
    the order that command lists them, getting a base item in the count the command says times the crafts needed,
    unless enough is on hand (a plan a policy can follow by copying from the last answers, not only by finding the
    goal's line in the list).
    """
    if style not in ("plan", "ask"):
        raise ValueError(f"TextCraft demonstration style {style!r}: use plan or ask")
    goal, recipes = _textcraft_commands(observation)
    actions: list[str] = []
    have: dict[str, int] = {}
    asked: set[str] = set()

    def craft(item: str, out_n: int, inputs: list[tuple[int, str]]) -> None:
        for n, i in inputs:
            have[i] -= n
        actions.append(f"craft {out_n} {item} using {', '.join(f'{n} {i}' for n, i in inputs)}")
        have[item] = have.get(item, 0) + out_n

    def obtain(item: str, need: int) -> None:
        short = need - have.get(item, 0)
        if short <= 0:
            return
        if item not in recipes:
            # `ask` gets the count its recipe line says (nothing to subtract), `plan` what is short.
            actions.append(f"get {need if style == 'ask' else short} {item}")
            have[item] = (have.get(item, 0) + need) if style == "ask" else need
            return
        out_n, inputs = recipes[item]
        times = math.ceil(short / out_n)
        if style == "plan":
            for _ in range(times):
                # Crafting one ingredient may use up another (sticks eat planks): repeat until all are on hand.
                while any(have.get(i, 0) < n for n, i in inputs):
                    for n, i in inputs:
                        obtain(i, n)
                craft(item, out_n, inputs)
            return
        if item not in asked:
            asked.add(item)
            actions.append(f"get {need} {item}")  # answered with the item's crafting command
        while any(have.get(i, 0) < n * times for n, i in inputs):
            for n, i in inputs:
                obtain(i, n * times)
        for _ in range(times):
            craft(item, out_n, inputs)

    obtain(goal, 1)
    return actions


def _private_level(level: str, seed: int) -> Any:
    """A private copy of a BabyAI level, reset with the seed the server uses for the same task."""
    import warnings

    import gymnasium as gym
    import minigrid  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(level)
    with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints level-sampling retries
        env.reset(seed=seed)
    return env


class BabyAIShadow:
    """Plays a BabyAI task with minigrid's own planner (BabyAIBot) on a private copy of the level, seeded like the
    server's, and yields the action *names* to send to the server."""

    def __init__(self, level: str, seed: int):
        from minigrid.utils.baby_ai_bot import BabyAIBot

        self.env = _private_level(level, seed)
        self.bot = BabyAIBot(self.env)

    def next_action(self) -> str:
        from rlfactory.envs.babyai import ACTIONS

        index = int(self.bot.replan())
        self.env.step(index)
        return next(name for name, i in ACTIONS.items() if i == int(index))


PLANNER_LIMIT_S = 2.0
"""Longest one planning call may take: minigrid's BabyAIBot searches without end in a few states."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise TimeoutError in the block after `seconds` (a SIGALRM timer: only in the main thread; elsewhere, and on
    platforms without it, no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum, frame):
        raise TimeoutError(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_WALK_WORDS = {0: "turn left", 1: "turn right", 2: "move forward", 4: "drop", 5: "toggle"}
class BabyAIWords:
    """Plays an `agentgym` BabyAI task (its task id) in AgentGym's action words, on a private copy of the level
    seeded as the server seeds it; `step(word)` must be told every word sent, so the copy follows the server."""

    def __init__(self, task_id: int, style: str = "macro"):
        from minigrid.utils.baby_ai_bot import BabyAIBot

        from rlfactory.envs.babyai_agentgym import AgentGymActions, level_and_seed

        if style not in ("macro", "walk"):
            raise ValueError(f"BabyAI demonstration style {style!r}: use macro or walk")
        self.style = style
        self._words, self._bot_class = AgentGymActions, BabyAIBot
        self.env = _private_level(*level_and_seed(int(task_id)))
        self.clauses = mission_clauses(str(self.env.unwrapped.mission))
        self.bot = BabyAIBot(self.env)
        self.stuck = False
        """True once the planner gave up: the episode will not be solved (a demonstration is dropped)."""

    def _macro(self, actions: dict[str, list[int]]) -> str | None:
        if not self.clauses:
            return None
        verb, obj = self.clauses[0]
        prefix = {"go to": "go to ", "pick up": "pickup ", "open": "toggle and go through "}.get(verb)
        if prefix is None:
            return None
        for name in actions:
            if name.startswith(prefix) and names_object(name[len(prefix):], obj):
                if verb == "open" and " open door" in name:
                    continue
                return name
        return None

    def next_action(self) -> str:
        """The next word to send (then call `step` with it)."""
        actions = self._words(self.env).actions
        if self.style == "macro":
            word = self._macro(actions)
            if word is not None:
                return word
        try:
            with _time_limit(PLANNER_LIMIT_S):
                low = int(self.bot.replan())
        except (AssertionError, ValueError, IndexError, TimeoutError):  # the planner gives up (or searches on
            self.stuck = True                                            # without end: it does on a few levels)
            return "check available actions"
        if low == 3:  # pick up what is in front: AgentGym's `pickup <object> <n>` with no steps before it
            return next((n for n, path in actions.items() if n.startswith("pickup ") and path == [3]), "toggle")
        return _WALK_WORDS.get(low, "check available actions")

    def step(self, word: str) -> None:
        """Play `word` on the private copy, as the server does (a macro runs its steps until the episode ends)."""
        actions = self._words(self.env).actions
        macro = word not in _WALK_WORDS.values()
        for low in actions.get(word, []):
            _, _, terminated, truncated, _ = self.env.step(low)
            if terminated or truncated:
                break
        if macro and self.style == "macro" and self.clauses and word == self._macro(actions):
            self.clauses.pop(0)
        if macro:  # the planner's own memory assumed it drove; after a macro it plans afresh
            self.bot = self._bot_class(self.env)


SEARCH_STATES = 200
"""States `BabyAISearch` expands at most per task (a count, so the same tasks are kept on any machine): the shortest
solutions of the held-out tasks that have one within 6 actions take 4-384, most under 100; about 10 ms a state."""


def babyai_shortest(task_id: int, max_actions: int, max_states: int | None = SEARCH_STATES,
                    limit_s: float | None = None) -> dict[str, Any]:
    """A shortest solution of `agentgym` BabyAI task `task_id` in at most `max_actions` action words: breadth-first
    over every word the environment offers (but `check available actions`), on forks of the real environment;
    states seen before are skipped. Stops at `max_states` states seen or `limit_s` seconds (None: no bound).
    Returns {task_id, level, solution (the words, or None), stopped ("states", "time" or None), states, seconds}."""
    import time

    from rlfactory.envs.babyai import BabyAIEnv

    t0 = time.perf_counter()
    root = BabyAIEnv(task_set="agentgym")
    root.reset(task_id)
    out: dict[str, Any] = {"task_id": task_id, "level": root.level, "solution": None, "stopped": None}
    frontier: list[tuple[Any, list[str]]] = [(root, [])]
    seen = {root.state_key()}

    def over() -> str | None:
        if max_states is not None and len(seen) >= max_states:
            return "states"
        return "time" if limit_s is not None and time.perf_counter() - t0 > limit_s else None

    for _ in range(max_actions):
        following = []
        for env, path in frontier:
            for word in env.action_words():
                if word == CHECK:
                    continue
                child = env.fork()
                result = child.step(word)
                if result.done:
                    if result.score > 0:
                        out["solution"] = path + [word]
                        break
                    continue
                key = child.state_key()
                if key not in seen:
                    seen.add(key)
                    following.append((child, path + [word]))
            if out["solution"] or over():
                break
        if out["solution"]:
            break
        out["stopped"] = over()
        if out["stopped"]:
            break
        frontier = following
    out.update(states=len(seen), seconds=round(time.perf_counter() - t0, 1))
    return out


class BabyAISearch:
    """Style `search`: plays the shortest solution `babyai_shortest` finds for an `agentgym` task within
    `max_actions` (stuck, so dropped, when there is none within its bound)."""

    def __init__(self, task_id: int, max_actions: int, max_states: int = SEARCH_STATES):
        self.plan = list(babyai_shortest(task_id, max_actions, max_states)["solution"] or [])
        self.stuck = not self.plan

    def next_action(self) -> str:
        if not self.plan:
            self.stuck = True
            return CHECK
        return self.plan.pop(0)

    def step(self, word: str) -> None:
        pass
