"""ScienceWorld (`scienceworld` package, a JVM simulator) as an `Env`: task names x variations, text actions.

A task id maps to (task, variation): `task = tasks[task_id % len(tasks)]`, `variation = (task_id // len(tasks)) %
max_variations(task)`. Reward is the change in ScienceWorld's 0-100 score, scaled to 0-1; `score` is the score so
far in [0, 1] (a negative score, ScienceWorld's failure signal, ends the episode with score 0). An action the
simulator does not understand is answered with the action templates and some valid actions that share words with
it, never an exception.

Each episode owns one JVM (ScienceWorld keeps one simulation per JVM). It is started lazily on the first reset and
reused across resets of the same episode; the MCP server bounds the number of open episodes (hence of JVMs).
Task set `agentgym`: AgentGym's SciWorld server numbers its tasks as one flat list, task by task in ScienceWorld's
order and every variation of each, leaving out the task ids in `AGENTGYM_EXCLUDED`; task `idx` is entry `idx` (no
wrap-around: past the end is an error). The reward stays on our 0-1 scale (AgentGym reports ScienceWorld's 0-100).
`fork` replays an episode in a new simulator (ScienceWorld has no snapshot): a JVM's start-up and a step per action.
Left out: gold-path generation for the policy (tests generate it in their own process).
"""
from __future__ import annotations

import logging
import os
import re

from rlfactory.envs.types import EnvError, StepResult
from rlfactory.errors import import_extra

logger = logging.getLogger(__name__)
# py4j logs every gateway shutdown at INFO with a traceback; that is not news.
logging.getLogger("py4j").setLevel(logging.WARNING)

STEP_LIMIT = 100
MAX_HINTS = 15
TASK_SETS = ("rlfactory", "agentgym")
AGENTGYM_EXCLUDED = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
"""ScienceWorld task ids AgentGym's server leaves out of its task list."""


class SciWorldEnv:
    """One ScienceWorld episode."""

    def __init__(self, tasks: list[str] | None = None, simplifications: str | None = None,
                 step_limit: int = STEP_LIMIT, task_set: str = "rlfactory"):
        if task_set not in TASK_SETS:
            raise ValueError(f"SciWorld task set {task_set!r}: use one of {', '.join(TASK_SETS)}")
        if task_set == "agentgym" and tasks is not None:
            raise ValueError("SciWorld: the agentgym task set numbers all of AgentGym's tasks; do not restrict tasks")
        self.task_set = task_set
        self._games: list[tuple[str, int]] | None = None
        self._tasks = tasks
        self.simplifications = (simplifications if simplifications is not None
                                else os.environ.get("RLFACTORY_SCIWORLD_SIMPLIFICATIONS", ""))
        self.step_limit = step_limit
        self._env = None
        self.task_id: int | None = None
        self.task_name: str | None = None
        self.variation: int | None = None
        self.done = False
        self.score = 0.0
        self._last_obs = ""
        self._actions: list[str] = []
        """The actions sent since the last reset (a fork replays them)."""

    def _sim(self):
        if self._env is None:
            # at the first episode: importing starts a JVM, and the package is the `envs` extra
            scienceworld = import_extra("scienceworld", "SciWorld")
            self._env = scienceworld.ScienceWorldEnv("", envStepLimit=self.step_limit)
        return self._env

    @property
    def tasks(self) -> list[str]:
        if self._tasks is None:
            self._tasks = list(self._sim().get_task_names())
        return self._tasks

    def agentgym_games(self) -> list[tuple[str, int]]:
        """AgentGym's task list: (task name, variation), task by task, leaving out `AGENTGYM_EXCLUDED`."""
        if self._games is None:
            sim = self._sim()
            self._games = [(name, v) for key, name in sim.tasks.items() if key not in AGENTGYM_EXCLUDED
                           for v in range(int(sim.get_max_variations(name)))]
        return self._games

    def reset(self, task_id: int = 0) -> StepResult:
        sim = self._sim()
        if self.task_set == "agentgym":
            games = self.agentgym_games()
            if not 0 <= int(task_id) < len(games):
                raise EnvError(f"SciWorld task {task_id}: AgentGym's task list has {len(games)} tasks "
                               f"(ids 0-{len(games) - 1})")
            self.task_id = int(task_id)
            self.task_name, self.variation = games[self.task_id]
        else:
            self.task_id = int(task_id)
            self.task_name = self.tasks[self.task_id % len(self.tasks)]
            n_var = int(sim.get_max_variations(self.task_name))
            self.variation = (self.task_id // len(self.tasks)) % max(n_var, 1)
        sim.load(self.task_name, self.variation, self.simplifications)
        obs, _ = sim.reset()
        self._actions = []
        self.done = False
        self.score = 0.0
        self._last_obs = obs
        text = f"{sim.get_task_description()}\n\n{obs}"
        return StepResult(observation=text, info=self._info())

    def fork(self) -> SciWorldEnv:
        """A copy of the episode: ScienceWorld's simulator has no snapshot, so a new simulator (a JVM of its own)
        loads the same task and variation and replays the episode's actions. Raises EnvError when the replay does not
        reach the same room, inventory, score and end (a simulator that drew something at random)."""
        if self._env is None or self.task_name is None:
            raise EnvError("No task yet: call reset(task_id) before fork.")
        twin = SciWorldEnv(self._tasks, self.simplifications, self.step_limit, self.task_set)
        twin._games = self._games
        try:
            twin.reset(self.task_id)
            for action in self._actions:
                twin.step(action)
            same = (twin.score, twin.done, twin._env.look(), twin._env.inventory()) == (
                self.score, self.done, self._env.look(), self._env.inventory())
        except Exception:
            twin.close()
            raise
        if not same:
            twin.close()
            raise EnvError(f"SciWorld task {self.task_id}: replaying the episode's {len(self._actions)} actions did "
                           f"not reach the same state, so it cannot be forked")
        return twin

    def observe(self) -> str:
        if self._env is None or self.task_name is None:
            return "No task yet: call reset(task_id) first."
        return f"{self._env.get_task_description()}\n\n{self._env.look()}"

    def step(self, action: str) -> StepResult:
        if self._env is None or self.task_name is None:
            return StepResult(observation="No task yet: call reset(task_id) first.")
        if self.done:
            return StepResult(observation="The episode is over. Call reset for a new task.", score=self.score,
                              done=True, info=self._info())
        action = " ".join(action.strip().split())
        self._actions.append(action)
        obs, delta, completed, info = self._env.step(action)
        raw_score = int(info.get("score", 0))
        self.done = bool(completed)
        self.score = max(0.0, min(1.0, raw_score / 100.0))
        if "No known action matches" in obs or "Unknown action" in obs or not action:
            obs = f"{obs}\n{self._hint(action, info.get('valid') or [])}"
        return StepResult(observation=obs, reward=delta / 100.0, score=self.score, done=self.done,
                          info=self._info())

    def _hint(self, action: str, valid: list[str]) -> str:
        templates = sorted(set(self._env.get_possible_actions()))
        words = {w for w in re.findall(r"[a-z]+", action.lower()) if len(w) > 2}
        related = [v for v in valid if words & set(v.split())][:MAX_HINTS] or list(valid)[:MAX_HINTS]
        return ("Action templates (OBJ = an object you can see): " + "; ".join(templates) +
                "\nSome valid actions now: " + "; ".join(related))

    def _info(self) -> dict:
        return {"task_id": self.task_id, "task_name": self.task_name, "variation": self.variation,
                "task_set": self.task_set}

    def close(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            finally:
                self._env = None
