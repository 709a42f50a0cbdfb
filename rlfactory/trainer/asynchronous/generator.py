"""The generator process of an asynchronous local run (`trainer.max_staleness_steps: k >= 1`).

    trainer process                                  generator process (spawned)
    ---------------                                  ---------------------------------------------------------
    SharedWeights.publish(model, v)  ---- shm --->   its engine loads version v between two decode steps
    channels.results.get() <--------- queue ------   scored GRPO groups (trajectories stamped with versions), pulses
    released, stop  ------------ shared --------->   the staleness bound, shutdown

The generator runs its own copy of the policy in its own engine (`rollout.engine`: HF or vLLM, anything that keeps
the weight-push contract, `protocol.FollowsWeights`), tool servers, AgentLoop and RewardSet, and keeps as many GRPO
groups in flight as the staleness rule admits (staleness.py, which also says when a group in flight must be
cancelled). Weights land between decode steps, so a trajectory in flight continues under them (a partial rollout):
every policy token carries the version that sampled it. At most one step's worth of turns (prompts_per_step x
samples_per_prompt) generate at once, let in lowest group first (`OrderedSlots`; a trajectory waiting for a tool
holds no slot): the groups the trainer needs next run at the engine's full speed, and the next step's fill the rows
theirs leave.

Start-up: the process loads its model while the trainer loads its own, then starts its tool servers and engine (and
imports the helper's module, on a thread) while it waits for the Setup (the shared weights and the data position,
once the trainer has prepared the run folder and restored any checkpoint): the trainer's first step waits for this
process to be ready, and neither needs the Setup.
With `trainer.split_cores` the HF engine's decoding thread runs on the CPUs the trainer
left it; the event loop and the tool servers are not pinned. Every `PULSE_S` it sends a pulse (what it is doing, its
progress) for the trainer's watchdog (watch.py). Its serve loop looks at the published version every `POLL_S`;
a finished group wakes it at once.

An optional helper (`GeneratorHelper`, named by the spec and imported here by name: the trainer's update jobs of
shared_update.py) is told of every group sent and cancelled, and whether the generator has nothing in flight (it may
then use the generator's core for the trainer).

Group i's prompt is the i-th draw of the run's seeded task order (`TaskSampler.at`), so a resumed run restarts from
the first group not yet trained, skipping those trained after it; groups in flight at a kill are lost and their
prompts generated again.
Left out: several generator processes.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils.logging import disable_progress_bar

from rlfactory.data.seeds import mix_seed
from rlfactory.data.tasks import TaskSampler, load_tasks
from rlfactory.errors import RLFactoryError
from rlfactory.models.devices import resolve_device
from rlfactory.models.loading import load_policy, load_tokenizer
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.engines.protocol import (
    FollowsWeights,
    GenerationEngine,
    GenerationOutput,
    SamplingParams,
    engine_counters,
)
from rlfactory.rollout.gate import TrajectoryGate
from rlfactory.rollout.horizon import horizon_for_step
from rlfactory.rollout_side import RolloutSide, open_rollout_side
from rlfactory.tools.counters import count_result, empty_counters
from rlfactory.tools.manager import ToolManager
from rlfactory.tools.types import ToolCall, ToolResult
from rlfactory.trainer.asynchronous.channels import Channels
from rlfactory.trainer.asynchronous.helper import GeneratorHelper, HelperFactory, helper_factory
from rlfactory.trainer.asynchronous.messages import (
    Failure,
    GeneratorSpec,
    GroupDropped,
    GroupResult,
    Pulse,
    Ready,
    Setup,
)
from rlfactory.trainer.asynchronous.ordered_slots import OrderedSlots
from rlfactory.trainer.asynchronous.staleness import Staleness
from rlfactory.trainer.asynchronous.watch import PULSE_S
from rlfactory.trainer.asynchronous.weights import SharedWeights

logger = logging.getLogger(__name__)

POLL_S = 0.005
"""How often the serve loop looks at the published version, the stop flag and the trainer's releases when nothing
woke it (a finished group wakes it at once)."""
SETUP_TIMEOUT_S = 900.0
"""How long a loaded generator waits for the trainer's Setup (the trainer loads its model, or resumes, meanwhile)."""


def generator_main(spec: GeneratorSpec, channels: Channels) -> None:
    """Process entry point: run the generator until `channels.stop` is set or the parent dies. A failure is reported
    as ("error", Failure) and ends the process."""
    _die_with_parent()
    # the trainer's process shows the run's progress; loading bars here would interleave with it (and tqdm's
    # process lock would outlive the process's end below)
    disable_progress_bar()
    code = 0
    try:
        asyncio.run(Generator(spec, channels).run())
    except BaseException as e:  # reported to the trainer, which raises it there
        code = 1
        if not isinstance(e, (KeyboardInterrupt, SystemExit)):
            user = isinstance(e, RLFactoryError)
            channels.results.put(("error", Failure(str(e) if user else f"{type(e).__name__}: {e}",
                                                   traceback.format_exc(), user)))
    finally:
        channels.results.close()
        channels.results.join_thread()
        # Everything is stopped and sent: end without the interpreter's finalization, in which the extension
        # modules transformers imports (triton's) print leak reports about objects that live to the end anyway.
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the trainer dies (also by kill -9); elsewhere the parent watch covers it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Activity:
    """What the pulses report beyond the engine's counters."""

    tool_calls: int = 0
    """Tool calls in flight now."""
    tool_results: int = 0
    groups_done: int = 0


class Generator:
    def __init__(self, spec: GeneratorSpec, channels: Channels):
        self.spec = spec
        self.r = spec.recipe
        self.ch = channels
        self.staleness = Staleness(self.r.trainer, channels.released)
        self.weights: SharedWeights | None = None  # from the trainer's Setup
        self.start_version = 0
        self.started = self.dropped = 0
        self.gated_s = 0.0
        self.t0 = time.perf_counter()
        self.group_oldest: dict[str, int] = {}  # group id -> oldest version served to it so far
        self.inflight: dict[int, asyncio.Task] = {}  # group index -> its task, while it runs
        self.gids: dict[int, str] = {}
        self.tools: ToolManager | None = None
        self.helper: GeneratorHelper | None = None
        self._closing = asyncio.Event()
        self.turn_slots = OrderedSlots(self.r.trainer.prompts_per_step * self.r.rollout.samples_per_prompt)
        """One step's worth of turns generate at once, lowest group first (see the module's docstring)."""
        self.activity = Activity()

    def stats(self, engine: FollowsWeights) -> dict[str, float]:
        """Cumulative: wall_s since start, the engine's counters, gated_s (the bound held new groups back), weight
        loads and their seconds, groups started and dropped here."""
        return {"wall_s": time.perf_counter() - self.t0, **engine_counters(engine), "gated_s": self.gated_s,
                "update_s": self.helper.seconds if self.helper is not None else 0.0,
                "weight_loads": float(engine.weight_loads), "weight_load_s": engine.weight_load_s,
                "started": float(self.started), "dropped": float(self.dropped),
                "tool_restarts": float(self.tools.counters()["restarts"]) if self.tools is not None else 0.0}

    def _allowed(self) -> bool:
        return self.staleness.may_admit(version=self.weights.version, start_version=self.start_version,
                                        started=self.started, dropped=self.dropped, running=len(self.inflight))

    async def run(self) -> None:
        r = self.r
        torch.set_num_threads(r.trainer.torch_threads)
        torch.manual_seed(r.trainer.seed)  # as the trainer, so weights that do not train match too (LoRA's base)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, self._closing.set)
        threading.Thread(target=self._watch_parent, args=(loop,), daemon=True, name="parent-watch").start()
        device = resolve_device(r.trainer.device)
        tasks = load_tasks(r.data.train_file, r.data)
        sampler = TaskSampler(len(tasks), r.trainer.seed)
        tokenizer = load_tokenizer(r)
        model = load_policy(r, device).eval()
        # The trainer's first step waits for this process to be ready, so what does not need the trainer's Setup
        # starts before it arrives and side by side: the tool servers (subprocesses, on the other core while the
        # trainer waits) and the import of the helper's module (in a thread).
        factory = asyncio.create_task(asyncio.to_thread(helper_factory, self.spec))
        setup_sent = asyncio.create_task(self._wait_setup())
        try:
            async with open_rollout_side(r, model, tokenizer, device, self.spec.run_dir) as side:
                setup = await setup_sent
                if setup is None:
                    return
                await self._serve_side(side, await factory, setup, model, tokenizer, device, tasks, sampler)
        finally:
            for task in (factory, setup_sent):
                task.cancel()

    async def _serve_side(self, side: RolloutSide, factory: HelperFactory | None, setup: Setup, model: Any,
                          tokenizer: Any, device: Any, tasks: list[dict[str, Any]], sampler: TaskSampler) -> None:
        """Serve from the opened rollout side once the trainer's Setup is in."""
        self.weights, self.start_version = setup.weights.with_lock(self.ch.weights_lock), setup.start_version
        # before the engine serves from `model`: a helper copies what it needs of it
        if factory is not None:
            self.helper = factory(self.ch, self.r, model, tokenizer, device, self.weights, setup.engine_cpus)
        engine = side.engine
        if not isinstance(engine, FollowsWeights):
            raise RLFactoryError(f"rollout.engine {self.r.rollout.engine!r} cannot generate for an asynchronous run: "
                                 f"its engine does not take pushed weights (protocol.FollowsWeights)")
        await engine.follow_weights(self.weights)
        if setup.engine_cpus and isinstance(engine, HFEngine):
            engine.worker_cpus = set(setup.engine_cpus)
        self.tools = side.tools
        self.ch.results.put(("ready", Ready(os.getpid(), engine.policy_version)))
        await self._serve(side, tasks, sampler, setup)

    async def _wait_setup(self) -> Setup | None:
        """The trainer's Setup, or None when told to stop first."""
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while not (self.ch.stop.is_set() or self._closing.is_set()):
            if await asyncio.to_thread(self.ch.setup_recv.poll, 0.1):
                return self.ch.setup_recv.recv()
            if time.monotonic() > deadline:
                raise RLFactoryError(f"the trainer sent no setup within {SETUP_TIMEOUT_S:.0f} s")
        return None

    def _watch_parent(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != self.spec.parent_pid:
                loop.call_soon_threadsafe(self._closing.set)
                time.sleep(20)  # a clean close stops the tool servers; past this, leave anyway
                os._exit(1)

    # ------------------------------------------------------------------------------------------- serving
    async def _serve(self, side: RolloutSide, tasks: list[dict[str, Any]], sampler: TaskSampler,
                     setup: Setup) -> None:
        r = self.r
        gate = TrajectoryGate.sized(r.rollout.max_concurrent_trajectories, side.tools)
        skip = set(setup.skip)
        index = setup.start_index
        engine = side.engine
        wake = asyncio.Event()
        next_pulse = 0.0
        try:
            while not (self.ch.stop.is_set() or self._closing.is_set()):
                if time.monotonic() >= next_pulse:
                    self._pulse(engine)
                    next_pulse = time.monotonic() + PULSE_S
                while self._allowed():
                    while index in skip:
                        index += 1
                    task = tasks[sampler.at(index)]
                    gid = f"{task.get('id', index)}@{index}"
                    version = self.weights.version
                    horizon = horizon_for_step(r.rollout.horizon, version)
                    self.inflight[index] = asyncio.create_task(
                        self._group(side, gate, index, gid, task, horizon, mix_seed(r.trainer.seed, index, 7),
                                    version))
                    self.inflight[index].add_done_callback(lambda _: wake.set())  # its place may start another
                    self.gids[index] = gid
                    self.started += 1
                    index += 1
                self._cancel_stale(engine)
                for i in [i for i, t in self.inflight.items() if t.done()]:
                    self.inflight.pop(i).result()  # a failure inside a group is a bug here: raise it
                    self.group_oldest.pop(self.gids.pop(i), None)
                if self.helper is not None:
                    self.helper.idle(not self.inflight)
                t0 = time.perf_counter()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), POLL_S)
                wake.clear()
                if not self._allowed():
                    self.gated_s += time.perf_counter() - t0
        finally:
            for t in self.inflight.values():
                t.cancel()
            await asyncio.gather(*self.inflight.values(), return_exceptions=True)
            if self.helper is not None:
                self.helper.close()

    def _cancel_stale(self, engine: FollowsWeights) -> None:
        """Cancel the groups in flight that the staleness rule says can never be trained, and count them dropped."""
        version = self.weights.version
        for i in list(self.inflight):
            oldest = self.group_oldest.get(self.gids[i])
            if self.staleness.must_cancel(oldest, version) and not self.inflight[i].done():
                self.inflight.pop(i).cancel()
                self.group_oldest.pop(self.gids.pop(i), None)
                self.dropped += 1
                if self.helper is not None:
                    self.helper.forget(i)
                self.ch.results.put(("dropped", GroupDropped(i, self.r.rollout.samples_per_prompt, oldest,
                                                             self.stats(engine))))

    def _pulse(self, engine: FollowsWeights) -> None:
        """Tell the trainer's watchdog what this process is doing (watch.py)."""
        e, a = engine_counters(engine), self.activity
        progress = (e["engine_decode_steps"], e["engine_prefills"], float(a.tool_results), float(a.groups_done),
                    self.helper.seconds if self.helper is not None else 0.0, float(engine.weight_loads))
        self.ch.results.put(("pulse", Pulse(os.getpid(), time.monotonic(), len(self.inflight), a.tool_calls,
                                            not self._allowed(), self.weights.version, progress)))

    async def _group(self, side: RolloutSide, gate: TrajectoryGate, index: int, gid: str, task: dict[str, Any],
                     horizon: int, seed: int, version: int) -> None:
        tools = None if side.tools is None else _GroupTools(side.tools, self.activity)
        loop = AgentLoop(_VersionWatch(side.engine, self.group_oldest, self.turn_slots, index), tools, side.chat,
                         self.r.rollout)

        n = self.r.rollout.samples_per_prompt
        trajs = await loop.run_group(task, n, group_id=gid, horizon=horizon, gate=gate,
                                     seeds=[mix_seed(seed, k) for k in range(n)])
        metrics = list(await asyncio.gather(*(side.rewards.score([t]) for t in trajs)))
        counts = None if tools is None else tools.counts
        if self.helper is not None:
            self.helper.keep(index, trajs)
        self.activity.groups_done += 1
        self.ch.results.put(("group", GroupResult(index, trajs, metrics, version, counts, self.stats(side.engine))))


class _GroupTools:
    """The ToolManager as one group's AgentLoop sees it, counting that group's calls (`tools/*` per step are then
    the step's own groups' calls, as in a synchronous step), and the calls in flight (`activity`, for the pulses)."""

    def __init__(self, tools: ToolManager, activity: Activity):
        self.tools = tools
        self.counts = empty_counters()
        self.activity = activity

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tools, name)

    async def call(self, call: ToolCall) -> ToolResult:
        with self._in_flight(1):
            result = await self.tools.call(call)
        count_result(self.counts, result)
        return result

    async def call_many(self, calls: list[ToolCall]) -> list[ToolResult]:
        calls = list(calls)
        with self._in_flight(len(calls)):
            results = await self.tools.call_many(calls)
        for result in results:
            count_result(self.counts, result)
        return results

    @contextlib.contextmanager
    def _in_flight(self, n: int) -> Any:
        self.activity.tool_calls += n
        try:
            yield
        finally:
            self.activity.tool_calls -= n
            self.activity.tool_results += n


class _VersionWatch:
    """The engine as one group's AgentLoop sees it: each turn generates in a slot of `slots` (group `index`'s
    priority), and the oldest version served to the group is noted (for the staleness rule's cancel)."""

    def __init__(self, engine: GenerationEngine, oldest: dict[str, int], slots: OrderedSlots, index: int):
        self.engine = engine
        self.oldest = oldest
        self.slots = slots
        self.index = index

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       request_id: str | None = None, **images: Any) -> GenerationOutput:
        """`images`: a vision-language policy's `images=`, passed on to the engine as the AgentLoop gave it."""
        async with self.slots.hold(self.index):
            out = await self.engine.generate(prompt_ids, sampling, request_id=request_id, **images)
        if out.versions and request_id:
            gid = request_id.rsplit("/", 1)[0]
            low = min(out.versions)
            self.oldest[gid] = min(self.oldest.get(gid, low), low)
        return out
