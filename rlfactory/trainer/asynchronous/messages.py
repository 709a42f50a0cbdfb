"""What the trainer and its generator process send each other, as typed records (they travel pickled).

    trainer -> generator: GeneratorSpec (at spawn), Setup (once the run folder is ready)
    generator -> trainer: ("ready", Ready), ("group", GroupResult), ("dropped", GroupDropped), ("pulse", Pulse),
                          ("error", Failure); and what an optional helper sends under kinds of its own

Left out: the channels they travel on (channels.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from rlfactory.recipe.schema import Recipe
from rlfactory.rollout.trajectory import Trajectory

if TYPE_CHECKING:  # the trainer imports this before torch (launch.py): the weights' module imports torch
    from rlfactory.trainer.asynchronous.weights import SharedWeights


@dataclass
class HelperSpec:
    """Optional work the generator process does for the trainer (e.g. jobs of its update, shared_update.py): the
    generator calls `factory` ("module:callable", imported in the generator process) with its channels and what it
    has (`helper.helper_factory`); the factory may decline (None)."""

    factory: str


@dataclass
class GeneratorSpec:
    """What the generator process needs to start, pickled into it."""

    recipe: Recipe
    run_dir: str
    parent_pid: int
    helper: HelperSpec | None = None


@dataclass
class Setup:
    """What the trainer sends once its model is loaded and the run folder is ready."""

    weights: SharedWeights
    """The shared weights the trainer publishes to (version `start_version` now)."""
    start_index: int
    """The first group (task draw) to generate."""
    skip: list[int]
    """Groups at or after start_index that were already trained (a resumed run)."""
    start_version: int
    engine_cpus: list[int] | None = None
    """`trainer.split_cores`: the CPUs of the generator's decoding thread (its event loop and tool servers are not
    pinned)."""


@dataclass
class Ready:
    pid: int
    version: int


@dataclass
class GroupResult:
    """One finished, scored GRPO group."""

    index: int
    trajectories: list[Trajectory]
    reward_metrics: list[dict[str, float]]
    """`RewardSet.score` metrics of each trajectory alone (combined per step by the trainer)."""
    start_version: int
    tools: dict[str, float] | None
    """Counters (`ToolManager.counters()` shape) of this group's tool calls; None without tools."""
    stats: dict[str, float] = field(default_factory=dict)
    """The generator's cumulative counters: see `Generator.stats`."""


@dataclass
class GroupDropped:
    index: int
    trajectories: int
    oldest_version: int
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class Pulse:
    """What the generator is doing, sent every `watch.PULSE_S` (watch.py reads it)."""

    pid: int
    sent: float
    """When, on CLOCK_MONOTONIC (shared by every process of the machine)."""
    groups: int
    """Groups in flight."""
    tool_calls: int
    """Tool calls in flight."""
    gated: bool
    """The staleness bound holds new groups back."""
    version: int
    progress: tuple[float, ...]
    """Counters that move when the generator makes progress, named by `PROGRESS_NAMES`."""


PROGRESS_NAMES = ("decode steps", "prefills", "tool results", "groups", "helper s", "weight loads")
"""The counters of a pulse's `progress`, in order."""


@dataclass
class Failure:
    """The generator failed; `user`: the project's own error (configuration, tool servers), whose message is the
    whole story."""

    message: str
    traceback: str
    user: bool


Message = tuple[Literal["ready", "group", "dropped", "pulse", "error"],
                Ready | GroupResult | GroupDropped | Pulse | Failure]
