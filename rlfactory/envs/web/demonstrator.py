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


class PlanDemonstrator:
    """The plan of one task as a policy: `next_action(observation)` is the action to send on that observation (a
    scroll when the step's element is not in it yet). `urls`: WebArena placeholders -> the episode's base URLs, for
    `goto` steps."""

    def __init__(self, config: dict, urls: dict[str, str] | None = None):
        self.config = config
        self.steps = list(plan_steps(config))
        self.urls = urls or {}
        self.scrolls = 0

    @property
    def finished(self) -> bool:
        return not self.steps

    def next_action(self, observation: str) -> str:
        if not self.steps:
            raise DemoStuck(f"task {self.config.get('task_id')}: the plan is over (it ended with stop)")
        step = self.steps[0]
        if step["action"] in ("stop", "goto"):
            if step["action"] == "goto":
                for key, base in self.urls.items():
                    step = {**step, "url": step["url"].replace(key, base)}
            self.steps.pop(0)
            return webarena_action(step)
        eid = find_element(observation, step["role"], step["name"])
        if eid is None:
            if self.scrolls >= MAX_SCROLLS:
                raise DemoStuck(f"task {self.config.get('task_id')}: no {step['role']} {step['name']!r} on "
                                f"{_url(observation)}")
            self.scrolls += 1
            return "scroll [down]"
        self.steps.pop(0)
        self.scrolls = 0
        return webarena_action(step, eid)


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
    policy = PlanDemonstrator(config, urls)
    while not demo.done and not policy.finished:
        action = policy.next_action(observation)
        observation, demo.done, demo.score = act(action)
        demo.actions.append(action)
        demo.observations.append(observation)
    return demo
