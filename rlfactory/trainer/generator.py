"""The generator process of an asynchronous local run (`trainer.max_staleness_steps: k >= 1`).

    trainer process                                  generator process (spawned, its own core)
    ---------------                                  ---------------------------------------------------------
    SharedWeights.publish(model, v)  ---- shm --->   HF engine loads version v between two decode steps
    results.get() <------------ queue ------------   scored GRPO groups (trajectories stamped with versions)
    trainer_drops, stop  -------- shared -------->   the staleness gate, shutdown
    UpdateJobs, job descriptions -- shm, queue -->   idle decoding thread: jobs of the trainer's update
    UpdateJobs.add_posted_into  <------ shm -------   their summed gradient (update_helper.py)

The generator runs its own copy of the policy, tool servers, AgentLoop and RewardSet, and keeps as many GRPO groups
in flight as the staleness bound allows: group number i may start while
    started - dropped < (v - v0 + k + 1) * prompts_per_step
where v is the newest published version and v0 the version this launch began at, and none past the run's last
step; before the first push the first step's groups run alone, and the next step's start once they are done
(`may_start`). Groups consumed in start order are then trained at most k versions after they started; a straggler
the trainer skips past may not be, and the trainer's policy decides (`trainer.stale_groups`): `drop` cancels a
group once it can no longer meet the bound (counted), `wait` makes the trainer take groups in start order. Weights
land between decode steps, so a trajectory in flight continues under them (a partial rollout): every policy token
carries the version that sampled it. At most one step's worth of turns (prompts_per_step x samples_per_prompt)
generate at once, let in lowest group first (`OrderedSlots`; a trajectory waiting for a tool holds no slot): the
groups the trainer needs next run at the engine's full speed, and the next step's fill the rows theirs leave.

Start-up (generator_launch.py, the trainer's side): `GeneratorLaunch.start(recipe)` spawns the process right after
the recipe is validated, before the trainer imports torch or loads its model, so both start up in parallel (python,
torch and transformers take ~4 s each here). The generator loads its model and then waits for `setup` (the shared
weights and the data position, once the trainer has prepared the run folder and restored any checkpoint) before it
starts its tool servers. With `trainer.split_cores` the generator's decoding thread runs on the second half of the
CPUs and the trainer on the first: on 2 cores that kept the update at its synchronous speed (0.96 s, against
1.03-1.13 s when the two processes' threads shared both cores). The generator's event loop (the agent loop,
tokenising, the results queue) and its tool servers are not pinned: they take ~12 % of a core, and on the decoding
thread's core they took turns with it. Pinning only that thread took the quickstart's asynchronous runs from 28.7
and 25.1 s to 25.5 and 23.1 s (seeds 0 and 1, one run each, bench/async_train.py).

Every `PULSE_S` the serve loop sends a pulse (what it is doing, its progress counters) on the results queue: the
trainer's watchdog (generator_watch.py) says from it what a waiting step waits for, and notices a stopped or stalled
generator.

Group i's prompt is the i-th draw of the run's seeded task order (`TaskSampler.at`), so a resumed run restarts
from the first group not yet trained, skipping those trained after it; groups in flight at a kill are lost and
their prompts generated again.
Left out: several generator processes, vLLM as the generator (it takes the same pushes later).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlfactory.errors import RLFactoryError
from rlfactory.trainer.generator_watch import PULSE_S
from rlfactory.trainer.heap import FrozenHeap
from rlfactory.trainer.ordered_slots import OrderedSlots

if TYPE_CHECKING:  # the parent imports this module before torch: keep it light
    from rlfactory.recipe.schema import Recipe

logger = logging.getLogger(__name__)

POLL_S = 0.02
"""How often the generator looks at the published version, the stop flag and the trainer's drops when nothing woke
it: a weight push (the trainer's wake byte) and a finished group wake it at once."""


SETUP_TIMEOUT_S = 900.0
"""How long a loaded generator waits for the trainer's `setup` (the trainer loads its model, or resumes, meanwhile)."""


@dataclass
class GeneratorSpec:
    """What the generator process needs to start, pickled into it."""

    recipe: "Recipe"
    run_dir: str
    parent_pid: int


@dataclass
class Setup:
    """What the trainer sends once its model is loaded and the run folder is ready."""

    weights: Any
    """The `SharedWeights` the trainer publishes to."""
    start_index: int
    """The first group (task draw) to generate."""
    skip: list[int]
    """Groups at or after start_index that were already trained (a resumed run)."""
    start_version: int
    engine_cpus: list[int] | None = None
    """`trainer.split_cores`: the CPUs of the generator's decoding thread (its event loop and tool servers are not
pinned)."""
    update_jobs: Any = None
    """`trainer.update_on_generator`: the `UpdateJobs` of the trainer's steps (update_jobs.py); None = not shared."""


@dataclass
class GroupResult:
    """One finished, scored GRPO group."""

    index: int
    trajectories: list[Any]
    reward_metrics: list[dict[str, float]]
    """`RewardSet.score` metrics of each trajectory alone (combined per step by the trainer)."""
    start_version: int
    tools: dict[str, Any] | None
    """Counters (`ToolManager.counters()` shape) of this group's tool calls; None without tools."""
    stats: dict[str, float] = field(default_factory=dict)
    """The generator's cumulative counters: see `Generator.stats`."""


@dataclass
class Activity:
    """What the generator's pulses report beyond its engine's counters."""

    tool_calls: int = 0
    """Tool calls in flight now."""
    tool_results: int = 0
    groups_done: int = 0


PROGRESS_NAMES = ("decode steps", "prefills", "tool results", "groups", "update-job s", "weight loads")
"""The counters of a pulse's `progress`, in order."""


@dataclass
class GroupDropped:
    index: int
    trajectories: int
    oldest_version: int
    stats: dict[str, float] = field(default_factory=dict)


def may_start(pushes: int, live: int, running: int, per_step: int, k: int, steps_left: int | None = None) -> bool:
    """Whether the generator may start another group: `pushes` weight versions published since it began, `live`
    groups started and not dropped, `running` of them still in flight. The staleness bound allows
    (pushes + k + 1) * per_step live groups, and the run's length `steps_left` * per_step (`steps_left`: the
    steps the trainer had left when the generator began; groups past the last step would never be trained, and
    while the last step trains, the generator's idle core takes jobs of its update instead). Before the first
    push the trainer waits for the first step's groups and has nothing else to do: they run alone, and the next
    step's start once they are all done (started together, the first step's groups would share every decode step
    with the next ones and arrive about twice as late; this took an asynchronous quickstart's first step from
    2.9-4.1 s to 1.5 s)."""
    if pushes == 0 and live >= per_step and running > live - per_step:  # one of the first step's is still running
        return False
    if steps_left is not None and live >= steps_left * per_step:
        return False
    return live < (pushes + k + 1) * per_step


def generator_main(spec: GeneratorSpec, results: Any, setup: Any, stop: Any, trainer_drops: Any) -> None:
    """Process entry point: run the generator until `stop` is set or the parent dies. A failure is reported on
    `results` as ("error", {message, traceback, user}) and ends the process; `user` marks the project's own
    errors (configuration, tool servers), whose message is the whole story. `setup`: the Setup pipe's receiving
    end, the SharedWeights lock, the UpdateJobs lock, and the queue of the trainer's job descriptions."""
    _die_with_parent()
    try:
        asyncio.run(Generator(spec, results, setup, stop, trainer_drops).run())
    except BaseException as e:  # reported to the trainer, which raises it there
        if not isinstance(e, (KeyboardInterrupt, SystemExit)):
            results.put(("error", {"message": f"{type(e).__name__}: {e}" if not isinstance(e, RLFactoryError)
                                   else str(e), "traceback": traceback.format_exc(),
                                   "user": isinstance(e, RLFactoryError)}))
    finally:
        results.close()
        results.join_thread()


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the trainer dies (also by kill -9); elsewhere the watchdog covers it."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Generator:
    def __init__(self, spec: GeneratorSpec, results: Any, setup: Any, stop: Any, trainer_drops: Any):
        self.spec = spec
        self.r = spec.recipe
        self.weights: Any = None  # SharedWeights, from the trainer's Setup
        self.start_version = 0
        # the setup pipe's receiving end, the SharedWeights lock, the UpdateJobs lock, the trainer's job
        # descriptions, the wake pipe's receiving end (a byte after each weight push)
        self.setup_in, self.lock, self.jobs_lock, self.job_messages, self.wake_in = setup
        self.helper: Any = None  # an UpdateHelper when the trainer shares its update
        self.results = results
        self.stop = stop
        self.trainer_drops = trainer_drops
        self.k = self.r.trainer.max_staleness_steps
        self.P = self.r.trainer.prompts_per_step
        self.drop_stale = self.r.trainer.stale_groups == "drop"
        self.started = self.dropped = 0
        self.gated_s = 0.0
        self.t0 = time.perf_counter()
        self.group_oldest: dict[str, int] = {}  # group id -> oldest version served to it so far
        self.inflight: dict[int, asyncio.Task] = {}  # group index -> its task, while it runs
        self.tools: Any = None
        self._closing = asyncio.Event()
        self.turn_slots = OrderedSlots(self.P * self.r.rollout.samples_per_prompt)
        """One step's worth of turns generate at once, lowest group first (see the module's docstring)."""
        self.activity = Activity()

    def stats(self, engine: Any) -> dict[str, float]:
        """Cumulative: wall_s since start, engine busy_s, gated_s (the bound held new groups back), weight loads and
        their seconds, groups started and dropped here."""
        from rlfactory.rollout.engines.protocol import engine_counters

        return {"wall_s": time.perf_counter() - self.t0, **engine_counters(engine), "gated_s": self.gated_s,
                "update_s": self.helper.seconds if self.helper is not None else 0.0,
                "weight_loads": float(engine.weight_loads), "weight_load_s": engine.weight_load_s,
                "started": float(self.started), "dropped": float(self.dropped),
                "tool_restarts": float(self.tools.counters()["restarts"]) if self.tools is not None else 0.0}

    def _pulse(self, engine: Any) -> None:
        """Tell the trainer's watchdog what this process is doing (generator_watch.py)."""
        from rlfactory.rollout.engines.protocol import engine_counters

        e, a = engine_counters(engine), self.activity
        progress = (e["engine_decode_steps"], e["engine_prefills"], float(a.tool_results), float(a.groups_done),
                    self.helper.seconds if self.helper is not None else 0.0, float(engine.weight_loads))
        self.results.put(("pulse", {"pid": os.getpid(), "sent": time.monotonic(), "groups": len(self.inflight),
                                    "tool_calls": a.tool_calls, "gated": not self._allowed(),
                                    "version": self.weights.version, "progress": progress,
                                    "progress_names": PROGRESS_NAMES}))

    def _allowed(self) -> bool:
        live = self.started - self.dropped - int(self.trainer_drops.value)
        return may_start(self.weights.version - self.start_version, live, len(self.inflight), self.P, self.k,
                         steps_left=self.r.trainer.total_steps - self.start_version)

    async def run(self) -> None:
        import torch

        from rlfactory.data.tasks import TaskSampler, load_tasks
        from rlfactory.models.devices import resolve_device
        from rlfactory.models.loading import load_policy, load_tokenizer
        from rlfactory.trainer.wiring import open_rollout_side

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
        heap = FrozenHeap()  # this process ends with the run: never thawed
        heap.freeze()  # the imports and the model; again once the tool servers are up
        if r.trainer.update_on_generator and r.trainer.split_cores and device.type == "cpu":
            # the update may be shared (the trainer decides, AsyncTrainer._shares_update): ~1 s of imports (verl's
            # losses) now, while the trainer still starts up
            import rlfactory.trainer.update_helper  # noqa: F401
        setup = await self._wait_setup()
        if setup is None:
            return
        self.weights, self.start_version = setup.weights.with_lock(self.lock), setup.start_version
        if setup.update_jobs is not None:
            from rlfactory.trainer.update_helper import UpdateHelper

            self.helper = UpdateHelper(r, model, tokenizer, device, setup.update_jobs.with_lock(self.jobs_lock),
                                       self.weights, self.job_messages, self.results)
        run_dir = self.spec.run_dir
        async with open_rollout_side(r, model, tokenizer, device, run_dir, weight_source=self.weights) as side:
            side.engine.load_pushed_weights()
            if setup.engine_cpus:
                side.engine.worker_cpus = set(setup.engine_cpus)
            if self.helper is not None:
                side.engine.idle_task = self._idle_update
            self.tools = side.tools
            heap.freeze()
            self.results.put(("ready", {"pid": os.getpid(), "version": side.engine.policy_version}))
            await self._serve(side, tasks, sampler, setup)

    def _idle_update(self) -> bool:
        """The engine's idle task: a job of the trainer's update, once every group the bound allows is generated
        (a turn that waits for a tool would otherwise wait for the job too)."""
        if self.inflight:
            return False
        try:
            return self.helper.run_one()
        except BaseException as e:  # the trainer waits for this job's gradient: tell it instead, and it raises
            self.results.put(("error", {"message": f"a job of the update failed in the generator: "
                                                   f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                                        "user": False}))
            raise

    async def _wait_setup(self) -> Setup | None:
        """The trainer's Setup, or None when told to stop first."""
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while not (self.stop.is_set() or self._closing.is_set()):
            if await asyncio.to_thread(self.setup_in.poll, 0.1):
                return self.setup_in.recv()
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

    async def _serve(self, side: Any, tasks: list[dict[str, Any]], sampler: Any, setup: Setup) -> None:
        from rlfactory.rollout.agent_loop import mix_seed
        from rlfactory.rollout.horizon import horizon_for_step

        r = self.r
        gate = asyncio.Semaphore(r.rollout.max_concurrent_trajectories)
        inflight = self.inflight
        gids: dict[int, str] = {}
        skip = set(setup.skip)
        index = setup.start_index
        engine = side.engine
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(self.wake_in.fileno(), self._on_wake, loop, wake)
        next_pulse = 0.0
        try:
            while not (self.stop.is_set() or self._closing.is_set()):
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
                    inflight[index] = asyncio.create_task(
                        self._group(side, gate, index, gid, task, horizon, mix_seed(r.trainer.seed, index, 7),
                                    version))
                    inflight[index].add_done_callback(lambda _: wake.set())  # its place may start another
                    gids[index] = gid
                    self.started += 1
                    index += 1
                if self.drop_stale:
                    self._cancel_stale(inflight, gids, engine)
                if self.helper is not None:
                    self.helper.take_messages()
                    self.helper.post_due()
                done = [i for i, t in inflight.items() if t.done()]
                for i in done:
                    inflight.pop(i).result()  # a failure inside a group is a bug here: raise it
                    self.group_oldest.pop(gids.pop(i), None)
                t0 = time.perf_counter()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), POLL_S)
                wake.clear()
                if not self._allowed():
                    self.gated_s += time.perf_counter() - t0
        finally:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(self.wake_in.fileno())
            for t in inflight.values():
                t.cancel()
            await asyncio.gather(*inflight.values(), return_exceptions=True)

    def _on_wake(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
        """The wake pipe is readable: read what is there and wake the serve loop. A closed pipe (the trainer is
        gone) stops being watched; the stop flag and the parent watch end the process."""
        try:
            while self.wake_in.poll():
                self.wake_in.recv_bytes()
        except (EOFError, OSError):
            loop.remove_reader(self.wake_in.fileno())
        wake.set()

    def _cancel_stale(self, inflight: dict[int, asyncio.Task], gids: dict[int, str], engine: Any) -> None:
        """A group whose oldest token is more than k versions behind the version the trainer trains next can never
        be trained: cancel it and count it dropped."""
        floor = self.weights.version - self.k
        for i in list(inflight):
            oldest = self.group_oldest.get(gids[i])
            if oldest is not None and oldest < floor and not inflight[i].done():
                inflight.pop(i).cancel()
                self.group_oldest.pop(gids.pop(i), None)
                self.dropped += 1
                if self.helper is not None:
                    self.helper.forget(i)
                self.results.put(("dropped", GroupDropped(i, self.r.rollout.samples_per_prompt, oldest,
                                                          self.stats(engine))))

    async def _group(self, side: Any, gate: asyncio.Semaphore, index: int, gid: str, task: dict[str, Any],
                     horizon: int, seed: int, version: int) -> None:
        from rlfactory.rollout.agent_loop import AgentLoop, mix_seed

        tools = None if side.tools is None else _GroupTools(side.tools, self.activity)
        loop = AgentLoop(_VersionWatch(side.engine, self.group_oldest, self.turn_slots, index), tools, side.chat,
                         self.r.rollout)

        async def one(k: int) -> Any:
            async with gate:
                return await loop.run_one(task, sample_index=k, group_id=gid, horizon=horizon, seed=mix_seed(seed, k))

        n = self.r.rollout.samples_per_prompt
        trajs = list(await asyncio.gather(*(one(k) for k in range(n))))
        metrics = list(await asyncio.gather(*(side.rewards.score([t]) for t in trajs)))
        counts = None if tools is None else tools.counts
        if self.helper is not None:
            self.helper.keep(index, trajs)
        self.activity.groups_done += 1
        self.results.put(("group", GroupResult(index, trajs, metrics, version, counts, self.stats(side.engine))))


class _GroupTools:
    """The ToolManager as one group's AgentLoop sees it, counting that group's calls (`tools/*` per step are then
    the step's own groups' calls, as in a synchronous step), and the calls in flight (`activity`, for the pulses)."""

    def __init__(self, tools: Any, activity: Activity):
        from rlfactory.tools.counters import empty_counters

        self.tools = tools
        self.counts = empty_counters()
        self.activity = activity

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tools, name)

    async def call(self, call: Any) -> Any:
        from rlfactory.tools.counters import count_result

        with self._in_flight(1):
            result = await self.tools.call(call)
        count_result(self.counts, result)
        return result

    async def call_many(self, calls: Any) -> Any:
        from rlfactory.tools.counters import count_result

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
    priority), and the oldest version served to the group is noted (for `drop`)."""

    def __init__(self, engine: Any, oldest: dict[str, int], slots: OrderedSlots, index: int):
        self.engine = engine
        self.oldest = oldest
        self.slots = slots
        self.index = index

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], sampling: Any, request_id: str | None = None) -> Any:
        async with self.slots.hold(self.index):
            out = await self.engine.generate(prompt_ids, sampling, request_id=request_id)
        if out.versions and request_id:
            gid = request_id.rsplit("/", 1)[0]
            low = min(out.versions)
            self.oldest[gid] = min(self.oldest.get(gid, low), low)
        return out
