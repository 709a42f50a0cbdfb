"""BabyAI levels from `minigrid`, played in text: what the agent sees is described in words, actions are names.

A task id picks a level (`levels[task_id % len(levels)]`) and seeds it (`seed = task_id`), so the same id is always
the same layout. The observation describes the agent's 7x7 egocentric view: each visible object with its colour,
state (doors) and position relative to the agent ("2 steps forward and 1 step left"), what is directly in front,
and what the agent carries. Reward is minigrid's (1 - 0.9 * steps / max_steps on success, else 0); `done` when the
mission succeeds or the level's step limit is hit.

Task sets: `rlfactory` (the default above: our 8 levels, low-level actions) and `agentgym` (AgentGym's 40 levels,
`idx % 40` with seed `idx // 40`, its goal wording and its action words, macros included:
`rlfactory/envs/babyai_agentgym.py`), so that a task id means the task it means in AgentGym-RL.

With the `agentgym` task set an episode also reports `progress` (in its results' structured content, never in the
policy's text): the share of the objects its mission names (in the parts AgentGym's macros cover: go to, pick up,
open) that have been in the agent's view so far, each counted once; 1 when the mission is complete. A mission whose
target is out of sight at the start (behind a door, behind the agent) rises as the agent finds it.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import logging
import threading
import warnings

from rlfactory.envs.babyai_agentgym import (
    CHECK,
    NOT_RECOGNIZED,
    AgentGymActions,
    agentgym_goal,
    level_and_seed,
    mission_clauses,
    names_object,
)
from rlfactory.envs.types import StepResult
from rlfactory.errors import import_extra

logger = logging.getLogger(__name__)

DEFAULT_LEVELS = ("BabyAI-GoToRedBallGrey-v0", "BabyAI-GoToRedBall-v0", "BabyAI-GoToObj-v0", "BabyAI-GoToLocal-v0",
                  "BabyAI-PickupLoc-v0", "BabyAI-OpenDoor-v0", "BabyAI-PutNextLocal-v0", "BabyAI-GoToDoor-v0")
# minigrid's Actions enum order: left, right, forward, pickup, drop, toggle, done.
ACTIONS = {"turn left": 0, "turn right": 1, "go forward": 2, "pick up": 3, "drop": 4, "toggle": 5, "done": 6}
_ALIASES = {"left": "turn left", "right": "turn right", "forward": "go forward", "move forward": "go forward",
            "pickup": "pick up", "pick": "pick up", "open": "toggle", "toggle door": "toggle", "finish": "done"}
# minigrid prints "Sampling rejected: ..." while generating levels; keep it off stdout (the MCP stdio channel in
# other servers, noise in tests). redirect_stdout is process-wide, hence the lock.
_QUIET = threading.Lock()
HELP = "Valid actions: " + ", ".join(ACTIONS) + "."
TASK_SETS = ("rlfactory", "agentgym")
VIEWS = ("text", "pixels")
"""What an observation shows of the grid: words (`describe_view`), or a picture of the agent's 7x7 view (a PNG with
each result, `BabyAIEnv.picture`) with the mission and the load in words."""
PICTURE_NOTE = "What you see is in the picture: you stand at its bottom centre, facing up."
TILE_PX = 16
"""Pixels per grid cell of the picture: 7 x 16 = 112 pixels square (8 x 8 patches of 14 for Qwen-VL's encoder)."""


def _offset_words(forward: int, right: int) -> str:
    parts = []
    if forward:
        parts.append(f"{forward} step{'s' if forward != 1 else ''} forward")
    if right:
        side = "right" if right > 0 else "left"
        parts.append(f"{abs(right)} step{'s' if abs(right) != 1 else ''} {side}")
    return " and ".join(parts) if parts else "right here"


def describe_view(image, carrying_desc: str | None, mission: str, forward_word: str = "go forward",
                  seen: bool = True) -> str:
    """Words for minigrid's egocentric (7, 7, 3) observation: agent at column 3, bottom row 6, facing up
    (`forward_word`: the action that steps forward, as the task set names it). `seen=False` (the pixel view): the
    mission and the load only, the view being the picture's."""
    if not seen:
        return "\n".join([f"Mission: {mission}", PICTURE_NOTE,
                          f"You are carrying {carrying_desc}." if carrying_desc else "You are not carrying anything."])
    constants = import_extra("minigrid.core.constants", "BabyAI")  # called with an episode open: minigrid is loaded
    IDX_TO_COLOR, IDX_TO_OBJECT, STATE_TO_IDX = constants.IDX_TO_COLOR, constants.IDX_TO_OBJECT, constants.STATE_TO_IDX

    idx_to_state = {v: k for k, v in STATE_TO_IDX.items()}
    width, height = image.shape[0], image.shape[1]
    ax, ay = width // 2, height - 1
    things, walls_ahead = [], None
    for x in range(width):
        for y in range(height):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            forward, right = ay - y, x - ax
            if kind == "wall" and right == 0 and forward > 0 and walls_ahead is None:
                walls_ahead = forward
            if kind in ("unseen", "empty", "wall", "floor", "agent") or (forward == 0 and right == 0):
                continue
            color = IDX_TO_COLOR[int(image[x, y, 1])]
            name = f"{color} {kind}"
            if kind == "door":
                name = f"{idx_to_state[int(image[x, y, 2])]} {name}"
            things.append((forward + abs(right), f"a {name} {_offset_words(forward, right)}"))
    lines = [f"Mission: {mission}"]
    if things:
        lines.append("You see " + "; ".join(t for _, t in sorted(things)) + ".")
    else:
        lines.append("You see no objects nearby.")
    front_kind = IDX_TO_OBJECT[int(image[ax, ay - 1, 0])]
    if front_kind in ("empty", "floor"):
        front = f"nothing (you can {forward_word})"
    elif front_kind == "wall":
        front = "a wall"
    else:
        front = f"a {IDX_TO_COLOR[int(image[ax, ay - 1, 1])]} {front_kind}"
    lines.append(f"Directly in front of you: {front}.")
    if walls_ahead is not None and walls_ahead > 1:
        lines.append(f"The wall ahead is {walls_ahead} steps away.")
    lines.append(f"You are carrying {carrying_desc}." if carrying_desc else "You are not carrying anything.")
    return "\n".join(lines)


class BabyAIEnv:
    """One BabyAI episode in text."""

    def __init__(self, levels: tuple[str, ...] | list[str] = DEFAULT_LEVELS, task_set: str = "rlfactory",
                 view: str = "text"):
        if task_set not in TASK_SETS:
            raise ValueError(f"BabyAI task set {task_set!r}: use one of {', '.join(TASK_SETS)}")
        if view not in VIEWS:
            raise ValueError(f"BabyAI view {view!r}: use one of {', '.join(VIEWS)}")
        self.task_set = task_set
        self.view = view
        self.levels = tuple(levels)
        self._words: AgentGymActions | None = None
        self._envs: dict[str, object] = {}
        self._env = None
        self.task_id: int | None = None
        self.level: str | None = None
        self.done = False
        self.score = 0.0
        self._last_obs = None
        self.targets: tuple[str, ...] = ()
        """The objects the mission names in the parts macros cover ("red door", "ball"): what `progress` counts."""
        self.seen: frozenset[int] = frozenset()
        """Which of `targets` (their indices) have been in view this episode."""

    def _make(self, level: str):
        if level not in self._envs:
            gym = import_extra("gymnasium", "BabyAI")  # at the first episode: the server starts without it
            import_extra("minigrid", "BabyAI")  # registers the BabyAI levels with gymnasium

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._envs[level] = gym.make(level)
        return self._envs[level]

    def reset(self, task_id: int = 0) -> StepResult:
        self.task_id = int(task_id)
        if self.task_set == "agentgym":
            self.level, seed = level_and_seed(self.task_id)
        else:
            self.level, seed = self.levels[self.task_id % len(self.levels)], self.task_id
        self._env = self._make(self.level)
        with _QUIET, contextlib.redirect_stdout(io.StringIO()):
            self._last_obs, _ = self._env.reset(seed=seed)
        self.done = False
        self.score = 0.0
        self.seen = frozenset()
        self.targets = tuple(obj for verb, obj in mission_clauses(self.mission) if verb != "other") \
            if self.task_set == "agentgym" else ()
        return StepResult(observation=f"Level: {self.level}\n{self.observe()}", info=self._info())

    def fork(self) -> BabyAIEnv:
        """A copy of the episode: the grid world deep-copied (its random generator too, so the copy draws what the
        original would), alone in the copy's cache of levels."""
        twin = copy.copy(self)
        twin._env = copy.deepcopy(self._env)
        twin._envs = {self.level: twin._env} if twin._env is not None else {}
        twin._last_obs = copy.deepcopy(self._last_obs)
        twin._words = None  # rebuilt from the copy's world by the next observation or step
        return twin

    def state_key(self) -> str | None:
        """The level and task, the agent's cell, heading and load, and the grid (doors, moved objects): all a later
        step depends on but the step count (results.env_state)."""
        if self._env is None:
            return None
        u = self._env.unwrapped
        carrying = (u.carrying.type, u.carrying.color) if u.carrying is not None else None
        grid = hashlib.sha1(u.grid.encode().tobytes()).hexdigest()
        return repr((self.task_set, self.level, self.task_id, tuple(int(x) for x in u.agent_pos), int(u.agent_dir),
                     carrying, grid, self.done, sorted(self.seen)))

    @property
    def mission(self) -> str:
        return str(self._env.unwrapped.mission) if self._env is not None else ""

    def observe(self) -> str:
        if self._env is None:
            return "No task yet: call reset(task_id) first."
        carrying = self._env.unwrapped.carrying
        carry_desc = f"a {carrying.color} {carrying.type}" if carrying is not None else None
        in_words = self.view == "text"
        if self.task_set != "agentgym":
            return describe_view(self._last_obs["image"], carry_desc, self.mission, seen=in_words)
        view = describe_view(self._last_obs["image"], carry_desc, self.mission, forward_word="move forward",
                             seen=in_words)
        self._words = AgentGymActions(self._env)
        self._note_targets_in_view()
        seen = view.split("\n", 1)[1]  # our words for the view, after AgentGym's goal line
        return f"Your goal: {agentgym_goal(self.mission)}\n{seen}\n{self._words.render()}"

    def action_words(self) -> list[str]:
        """The action words the `agentgym` task set accepts in the current state (what `check available actions`
        lists); empty for the other task set or before a task."""
        if self.task_set != "agentgym" or self._env is None:
            return []
        return list((self._words or AgentGymActions(self._env)).actions)

    def _note_targets_in_view(self) -> None:
        """Add to `seen` the targets some visible object names (every visible object has a `go to <label>`)."""
        labels = [name[len("go to "):] for name in self._words.actions if name.startswith("go to ")]
        self.seen |= {i for i, obj in enumerate(self.targets) if any(names_object(x, obj) for x in labels)}

    def picture(self) -> bytes | None:
        """The agent's 7x7 view as a PNG (`TILE_PX` a cell, the agent at the bottom centre facing up) with the pixel
        view; None with the text view or before a task (results.env_picture)."""
        if self.view != "pixels" or self._env is None:
            return None
        from PIL import Image  # here: only the pixel view draws (pillow comes with matplotlib, a core dependency)

        frame = self._env.unwrapped.get_pov_render(tile_size=TILE_PX)  # [7*TILE_PX, 7*TILE_PX, 3] uint8
        out = io.BytesIO()
        Image.fromarray(frame).save(out, format="PNG")
        return out.getvalue()

    def step(self, action: str) -> StepResult:
        if self._env is None:
            return StepResult(observation="No task yet: call reset(task_id) first.")
        if self.done:
            return StepResult(observation="The episode is over. Call reset for a new task.", score=self.score,
                              done=True, info=self._info())
        if self.task_set == "agentgym":
            return self._step_words(" ".join(action.lower().strip().split()))
        name = " ".join(action.lower().strip().rstrip(".").split())
        name = _ALIASES.get(name, name)
        if name not in ACTIONS:
            return StepResult(observation=f"Unknown action {action!r}. {HELP}\n{self.observe()}", score=self.score,
                              info=self._info())
        self._last_obs, reward, terminated, truncated, _ = self._env.step(ACTIONS[name])
        self.done = bool(terminated or truncated)
        if reward > 0:
            self.score = float(reward)
        prefix = ""
        if terminated and reward > 0:
            prefix = "Mission complete!\n"
        elif truncated:
            prefix = "Out of steps: the episode is over.\n"
        return StepResult(observation=prefix + self.observe(), reward=float(reward), score=self.score,
                          done=self.done, info=self._info())

    def _step_words(self, action: str) -> StepResult:
        """One AgentGym action word: a macro runs its low-level actions until one ends the episode."""
        words = self._words or AgentGymActions(self._env)
        if action == CHECK or (action.startswith("check") and CHECK.startswith(action)):
            return StepResult(observation="You can take the following actions: " + ", ".join(words.actions),
                              score=self.score, info=self._info())
        if action not in words.actions:
            return StepResult(observation=f"{NOT_RECOGNIZED}\n{self.observe()}", score=self.score,
                              info=self._info())
        reward, terminated, truncated = 0.0, False, False
        for low in words.actions[action]:
            self._last_obs, r, terminated, truncated, _ = self._env.step(low)
            reward = float(r)
            if terminated or truncated:
                break
        self.done = bool(terminated or truncated)
        if reward > 0:
            self.score = reward
        prefix = ""
        if terminated and reward > 0:
            prefix = "The task is completed.\n"
        elif truncated:
            prefix = "Out of steps: the episode is over.\n"
        return StepResult(observation=prefix + self.observe(), reward=reward, score=self.score, done=self.done,
                          info=self._info())

    def _info(self) -> dict:
        info = {"task_id": self.task_id, "level": self.level, "mission": self.mission, "task_set": self.task_set}
        if self.targets:
            info["progress"] = 1.0 if self.score > 0 else round(len(self.seen) / len(self.targets), 4)
        return info

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
        self._env = None
