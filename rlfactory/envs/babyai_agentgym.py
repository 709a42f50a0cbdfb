"""BabyAI's `agentgym` task set: task ids, goals and action words as AgentGym's BabyAI server gives them.

AgentGym (agentenv-babyai) plays 40 levels: task `idx` is level `all_levels[idx % 40 + 1]` (its 1-based table,
`AGENTGYM_LEVELS[idx % 40]` here) seeded with `idx // 40`. Its goal is minigrid's mission with "then" and "after you"
read as "and". Its actions are words, several of them macros over minigrid's low-level actions:
`turn left`, `turn right`, `move forward`, `go to <object> <n>`, `pickup <object> <n>`, `go through <door> <n>`,
`toggle and go through <door> <n>`, `drop`, `toggle` and `check available actions`; objects are named
`<colour> <type>` (doors `<colour> <state> door`) and numbered per name from the nearest visible one. Anything else
answers "The action is not recognized. Please check valid actions." (so `go forward` is not an action here).

Missions are read into their parts (`mission_clauses`: what to do to which object, in the order it must be done),
which the demonstrator plays and BabyAI's `progress` counts. Our own implementation of those conventions
(`AgentGymActions`), over minigrid's full state: the path of a macro is
a shortest path in turns and steps through free cells and open doors. What differs from AgentGym's server is in
docs/environments.md (its wording of the view, where its macros may go, its reward rule).
"""
from __future__ import annotations

import re
from collections import deque
from typing import Any

AGENTGYM_LEVELS = (
    "BabyAI-GoToRedBallGrey-v0", "BabyAI-GoToRedBall-v0", "BabyAI-GoToRedBallNoDists-v0", "BabyAI-GoToObjS6-v0",
    "BabyAI-GoToLocalS8N7-v0", "BabyAI-GoToObjMazeS7-v0", "BabyAI-GoToImpUnlock-v0", "BabyAI-GoToSeqS5R2-v0",
    "BabyAI-GoToRedBlueBall-v0", "BabyAI-GoToDoor-v0", "BabyAI-GoToObjDoor-v0", "BabyAI-Open-v0",
    "BabyAI-OpenRedDoor-v0", "BabyAI-OpenDoorLoc-v0", "BabyAI-OpenRedBlueDoorsDebug-v0",
    "BabyAI-OpenDoorsOrderN4Debug-v0", "BabyAI-Pickup-v0", "BabyAI-UnblockPickup-v0", "BabyAI-PickupLoc-v0",
    "BabyAI-PickupDistDebug-v0", "BabyAI-PickupAbove-v0", "BabyAI-PutNextLocalS6N4-v0",
    "BabyAI-PutNextS7N4Carrying-v0", "BabyAI-Unlock-v0", "BabyAI-UnlockLocalDist-v0", "BabyAI-KeyInBox-v0",
    "BabyAI-UnlockPickupDist-v0", "BabyAI-BlockedUnlockPickup-v0", "BabyAI-UnlockToUnlock-v0",
    "BabyAI-ActionObjDoor-v0", "BabyAI-FindObjS7-v0", "BabyAI-KeyCorridorS6R3-v0", "BabyAI-OneRoomS20-v0",
    "BabyAI-MoveTwoAcrossS8N9-v0", "BabyAI-SynthS5R2-v0", "BabyAI-SynthLoc-v0", "BabyAI-SynthSeq-v0",
    "BabyAI-MiniBossLevel-v0", "BabyAI-BossLevel-v0", "BabyAI-BossLevelNoUnlock-v0",
)
"""AgentGym's level table in its order (its key k is index k - 1 here)."""
RENAMED = {"BabyAI-GoToObjS6-v0": "BabyAI-GoToObjS6-v1"}
"""Levels that minigrid >= 2.5 registers under another id (AgentGym pins minigrid < 2.5)."""
NOT_RECOGNIZED = "The action is not recognized. Please check valid actions."
CHECK = "check available actions"
_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))  # minigrid's directions: right, down, left, up
_LEFT, _RIGHT, _FORWARD, _PICKUP, _DROP, _TOGGLE = 0, 1, 2, 3, 4, 5
_TARGETS = ("door", "key", "ball", "box", "goal")
_DOOR_STATES = ("open", "closed", "locked")


def level_and_seed(task_id: int) -> tuple[str, int]:
    """AgentGym's level (as minigrid here registers it) and seed of task `task_id`."""
    level = AGENTGYM_LEVELS[task_id % len(AGENTGYM_LEVELS)]
    return RENAMED.get(level, level), task_id // len(AGENTGYM_LEVELS)


def agentgym_goal(mission: str) -> str:
    """The goal as AgentGym words it: "then" and "after you" read as "and"."""
    return mission.replace("then", "and").replace("after you", "and")


_CLAUSE = re.compile(r"^(go to|pick up|open) (?:the|a) (.+)$")
_LOCATION = ("on your left", "on your right", "in front of you", "behind you")


def mission_clauses(mission: str) -> list[tuple[str, str]]:
    """The parts of a BabyAI mission in the order they must be done, as (verb, object): "open the red door, then
    pick up the ball" -> [("open", "red door"), ("pick up", "ball")]; "A after you B" puts B first. A part no macro
    covers (put next to, a location) has the verb "other"."""
    parts: list[str] = []
    for seq in re.split(r",? then ", mission):
        if " after you " in seq:
            first, second = seq.split(" after you ", 1)
            parts += [second, first]
        else:
            parts.append(seq)
    out = []
    for part in (p.strip() for q in parts for p in re.split(r",? and ", q)):
        m = _CLAUSE.match(part)
        out.append((m.group(1), m.group(2)) if m and not any(w in part for w in _LOCATION) else ("other", part))
    return out


def names_object(label: str, obj: str) -> bool:
    """Does an action's object label ("red closed door 2") name the mission's object ("red door", "door", "ball")?"""
    words, want = label.split()[:-1], obj.split()
    kind, colour = want[-1], want[0] if len(want) > 1 else None
    return words[-1] == kind and (colour is None or words[0] == colour)


def _name(obj: Any) -> str:
    if obj.type == "door":
        state = "open" if obj.is_open else ("locked" if obj.is_locked else "closed")
        return f"{obj.color} {state} door"
    return f"{obj.color} {obj.type}"


class AgentGymActions:
    """The word actions of one BabyAI state (the env's unwrapped minigrid), each with its low-level actions."""

    def __init__(self, env: Any):
        self.env = env.unwrapped
        self.actions: dict[str, list[int]] = {}
        self._build()

    def _passable(self, x: int, y: int) -> bool:
        if not (0 <= x < self.env.width and 0 <= y < self.env.height):
            return False
        cell = self.env.grid.get(x, y)
        return cell is None or cell.can_overlap()

    def _path_to_face(self, target: tuple[int, int]) -> list[int] | None:
        """Fewest left/right/forward actions after which the agent faces `target`, or None."""
        start = (*(int(v) for v in self.env.agent_pos), int(self.env.agent_dir))
        back: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {start: None}
        queue = deque([start])
        while queue:
            x, y, d = state = queue.popleft()
            if (x + _VEC[d][0], y + _VEC[d][1]) == target:
                path = []
                while back[state] is not None:
                    state, action = back[state]  # type: ignore[misc]
                    path.append(action)
                return path[::-1]
            moves = [((x, y, (d - 1) % 4), _LEFT), ((x, y, (d + 1) % 4), _RIGHT)]
            nx, ny = x + _VEC[d][0], y + _VEC[d][1]
            if self._passable(nx, ny):
                moves.append(((nx, ny, d), _FORWARD))
            for nxt, action in moves:
                if nxt not in back:
                    back[nxt] = (state, action)
                    queue.append(nxt)
        return None

    def visible(self) -> list[tuple[str, tuple[int, int]]]:
        """Visible objects, nearest first, as (name, position)."""
        ax, ay = (int(v) for v in self.env.agent_pos)
        found = []
        for x in range(self.env.width):
            for y in range(self.env.height):
                obj = self.env.grid.get(x, y)
                if obj is not None and obj.type in _TARGETS and (x, y) != (ax, ay) and self.env.agent_sees(x, y):
                    found.append((abs(x - ax) + abs(y - ay), x, y, _name(obj)))
        return [(name, (x, y)) for _, x, y, name in sorted(found)]

    def _build(self) -> None:
        env, acts = self.env, self.actions
        acts["turn left"], acts["turn right"] = [_LEFT], [_RIGHT]
        fx, fy = (int(v) for v in env.front_pos)
        if self._passable(fx, fy):
            acts["move forward"] = [_FORWARD]
        counts: dict[str, int] = {}
        for name, pos in self.visible():
            counts[name] = counts.get(name, 0) + 1
            label = f"{name} {counts[name]}"
            path = self._path_to_face(pos)
            if path is None:
                continue
            if env.carrying is None and name.split()[-1] in ("key", "ball", "box"):
                acts[f"pickup {label}"] = path + [_PICKUP]
            if name.endswith(" door"):
                self._door(label, name, path)
            if not name.endswith("goal"):
                acts[f"go to {label}"] = path
        front = env.grid.get(fx, fy)
        if env.carrying is not None and front is None:
            acts["drop"] = [_DROP]
        if front is not None and front.type in ("door", "box"):
            acts["toggle"] = [_TOGGLE]
        acts[CHECK] = []

    def _door(self, label: str, name: str, path: list[int]) -> None:
        """`go through` an open door (onto its cell); `toggle and go through` a closed one, or a locked one with
        the key of its colour in hand."""
        state = name.split()[1]
        if state == "open":
            self.actions[f"go through {label}"] = path + [_FORWARD]
            return
        carrying = self.env.carrying
        if state == "locked" and (carrying is None or carrying.type != "key" or carrying.color != name.split()[0]):
            return
        self.actions[f"toggle and go through {label}"] = path + [_TOGGLE, _FORWARD]

    def render(self) -> str:
        return "Available actions: [" + ", ".join(f'"{a}"' for a in self.actions) + "]"
