"""The scripted web demonstrator through the real browser: each step of a task's plan (role + accessible name: a
link's text, a field's label, a button's name) is found among the ids of the current observation and played as a
WebArena action (`webarena_action`), until `stop [answer]`.

It reads only what the policy reads — the observation text — so it plays the same through `WebEnv` and over MCP
(`act(action) -> (observation, done, score)`). An element below the observation's cut is looked for after a
`scroll [down]` (a few at most). Left out: plans that branch on what a page shows (see tasks/template.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rlfactory.envs.web.tasks.build import plan_steps, webarena_action

MAX_SCROLLS = 4


class DemoStuck(RuntimeError):
    """A plan step's element is not in the observation (names the task, the step and the page's URL)."""


def find_element(observation: str, role: str, name: str) -> str | None:
    """The id of the first element shown as `[id] role 'name'` in an observation, or None."""
    want = f"{role} '{' '.join(name.split())}'"
    for line in observation.splitlines():
        text = line.strip()
        if not text.startswith("[") or "]" not in text:
            continue
        eid, _, rest = text[1:].partition("] ")
        if eid.isdigit() and (rest == want or rest.startswith(want + " ")):
            return eid
    return None


def _url(observation: str) -> str:
    return next((line[5:] for line in observation.splitlines() if line.startswith("URL: ")), "?")


@dataclass
class Demo:
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    score: float = 0.0
    done: bool = False


def play_plan(config: dict, observation: str, act: Callable[[str], tuple[str, bool, float]],
              urls: dict[str, str] | None = None) -> Demo:
    """Play `config`'s plan from the first `observation`; `act(action)` plays one action and returns (observation,
    done, score). `urls`: WebArena placeholders -> the episode's base URLs, for `goto` steps."""
    demo = Demo(observations=[observation])

    def send(action: str) -> str:
        text, demo.done, demo.score = act(action)
        demo.actions.append(action)
        demo.observations.append(text)
        return text

    for step in plan_steps(config):
        if step["action"] in ("stop", "goto"):
            if step["action"] == "goto":
                for key, base in (urls or {}).items():
                    step = {**step, "url": step["url"].replace(key, base)}
            observation = send(webarena_action(step))
            if demo.done:
                return demo
            continue
        eid = find_element(observation, step["role"], step["name"])
        for _ in range(MAX_SCROLLS):
            if eid is not None:
                break
            observation = send("scroll [down]")
            eid = find_element(observation, step["role"], step["name"])
        if eid is None:
            raise DemoStuck(f"task {config.get('task_id')}: no {step['role']} {step['name']!r} on "
                            f"{_url(observation)}")
        observation = send(webarena_action(step, eid))
        if demo.done:
            return demo
    return demo
