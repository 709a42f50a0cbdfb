"""`AgentLoop`: multi-turn tool-use rollouts, one asyncio task per trajectory, no barrier between turns.

Each trajectory runs its own loop: generate an assistant turn (token ids in, token ids out), parse tool calls from
the decoded text, run them through the ToolManager, append the chat template's tool-turn delta, repeat. While some
trajectories wait on slow tools, others generate; the engine batches whatever requests are in flight. Loops that
wait for every trajectory's tools each turn (AgentGym-RL, RL-Factory) pay for the slowest call every turn
(bench/rollout.py measures the difference).

Token-exactness: the policy's tokens are appended exactly as generated (never decoded and re-encoded); tool turns
are `ChatFormat.tool_response_delta` ids. `loss_mask` is 1 exactly on generated tokens, 0 on template/tool tokens,
and logprobs are 0.0 where the mask is 0. A trajectory stops with a finish reason:
- `stop`: the turn had no tool call (the final answer);
- `max_turns`: the horizon was reached (calls in the last turn are not run: no turn would read their results);
- `token_budget`: `max_response_tokens` ran out, or a turn hit `max_new_tokens_per_turn` with no call in it;
- `context_length`: the next generation or tool turn would not fit in `max_context_tokens` (never exceeded);
- `env_done`: an environment server said `done: true` in a tool turn's structured content (after that turn);
- `error`: anything raised; the trajectory keeps what it had, the error text, and the batch goes on.

Environment servers (`env_glue.py`): calls to tools taking `episode_id` get the trajectory's own episode; a task
row with `env: {server, task_id}` has its episode reset before the first turn, the observation appended to the
prompt as a user message; the trajectory's episodes are closed when it ends, whatever the reason.

Images (tool results' and the task's, `images.py`) are message parts for a vision-language policy, recorded on the
trajectory (`Trajectory.images`) and passed to the engine with each request; a text-only policy reads a note instead
(the image kept for the viewer with `rollout.keep_unseen_images`).
Left out: rewards (`rlfactory.reward`), tool-call syntax (`rlfactory.tools.format`), text truncation
(`truncation.py`), a turn's tool messages and call records (`tool_turn.py`), batching inside the engine
(`engines/hf.py`), a batch's metrics (`metrics.py`).
"""
from __future__ import annotations

import asyncio
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from rlfactory.data.seeds import mix_seed
from rlfactory.recipe.rollout import RolloutConfig
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.protocol import GenerationEngine, SamplingParams
from rlfactory.rollout.env_glue import EpisodeBinding, new_episode_id, reset_observation
from rlfactory.rollout.gate import TrajectoryGate
from rlfactory.rollout.horizon import horizon_for_step
from rlfactory.rollout.images import prompt_with_images, unseen
from rlfactory.rollout.images import records as image_records
from rlfactory.rollout.metrics import rollout_metrics
from rlfactory.rollout.tool_turn import ToolTurn, tool_turn
from rlfactory.rollout.trajectory import Branch, Trajectory, TurnSpan
from rlfactory.rollout.truncation import truncate_tokens
from rlfactory.tools.format import parse_tool_calls
from rlfactory.tools.types import ToolCall, ToolResult, ToolSpec

if TYPE_CHECKING:
    from rlfactory.tools.manager import ToolManager

logger = logging.getLogger(__name__)

class _Builder:
    """The growing response of one trajectory; every append keeps ids, mask, logprobs and spans in step."""

    def __init__(self, traj: Trajectory):
        self.t = traj

    def append(self, role: str, ids: list[int], logprobs: list[float] | None, text: str,
               versions: list[int] | None = None) -> None:
        t = self.t
        start = len(t.response_ids)
        t.response_ids.extend(ids)
        policy = role == "assistant"
        t.loss_mask.extend([1 if policy else 0] * len(ids))
        t.logprobs.extend(logprobs if policy and logprobs is not None else [0.0] * len(ids))
        t.policy_versions.extend(versions if policy and versions is not None else [-1] * len(ids))
        t.turns.append(TurnSpan(role=role, start=start, end=len(t.response_ids), text=text))  # type: ignore[arg-type]


@dataclass
class _Live:
    """A trajectory being played: its record, its episodes, its seconds so far, and whether it goes on."""

    traj: Trajectory
    env: EpisodeBinding
    timings: dict[str, float] = field(default_factory=lambda: {"generate_s": 0.0, "tools_s": 0.0, "total_s": 0.0})
    going: bool = True


def _trajectory_id(task: dict[str, Any], group_id: str | None, sample_index: int) -> str:
    return f"{group_id or task.get('id') or 'task'}/{sample_index}"


class AgentLoop:
    """Runs trajectories for tasks: `await loop.run_batch(tasks)`, `await loop.run_group(task, n, ...)` (one GRPO
    group, flat or branched) or `await loop.run_one(task, ...)`."""

    def __init__(self, engine: GenerationEngine, tools: "ToolManager | None", chat: ChatFormat, cfg: RolloutConfig):
        self.engine = engine
        self.tools = tools
        self.chat = chat
        self.cfg = cfg
        self._tool_specs: dict[str, ToolSpec] | None = None

    # ---- helpers --------------------------------------------------------------------------------------------
    def default_sampling(self) -> SamplingParams:
        """Sampling settings of the recipe (`rollout.sampling`), with the chat format's stop tokens."""
        s = self.cfg.sampling
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                              max_new_tokens=s.max_new_tokens_per_turn, stop_token_ids=self.chat.stop_token_ids)

    def _specs(self) -> dict[str, ToolSpec] | None:
        if self.tools is None:
            return {}
        if self._tool_specs is None:
            specs: dict[str, ToolSpec] = {}
            for spec in self.tools.specs:
                specs[spec.name] = spec
                specs.setdefault(f"{spec.server}.{spec.tool}", spec)
            self._tool_specs = specs
        return self._tool_specs

    async def _run_calls(self, calls: list[ToolCall]) -> list[ToolResult]:
        if not calls:
            return []
        if self.tools is None:
            return [ToolResult(name=c.name, text="Error: no tools are available in this environment.",
                               is_error=True, error_kind="unknown_tool") for c in calls]
        return await self.tools.call_many(calls)

    def _truncate(self, text: str, *, error: bool = False) -> str:
        """Cut a tool response to its token budget; an error's text has its own (`tool_error_max_tokens`), so the
        model can read what went wrong even when tool responses are kept short."""
        budget = self.cfg.tool_response_max_tokens
        if error:
            budget = max(budget, self.cfg.tool_error_max_tokens)
        cut, _ = truncate_tokens(text, budget, self.cfg.tool_response_truncation, self.chat.encode, self.chat.decode)
        return cut

    # ---- one trajectory -------------------------------------------------------------------------------------
    async def run_one(
        self,
        task: dict[str, Any],
        *,
        sample_index: int = 0,
        group_id: str | None = None,
        horizon: int | None = None,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
    ) -> Trajectory:
        """Roll out one trajectory for `task` (`prompt`: a string or chat messages; optional `id`, `answer`,
        `metadata`, `system_prompt`). Never raises for rollout failures: they come back as finish_reason="error"."""
        horizon = horizon if horizon is not None else horizon_for_step(self.cfg.horizon, 0)
        live = self._start(task, sample_index, group_id, horizon)
        await self._play(live, task, horizon, sampling, seed)
        return await self._end(live)

    def _start(self, task: dict[str, Any], sample_index: int, group_id: str | None, horizon: int) -> _Live:
        task_id = None if task.get("id") is None else str(task["id"])
        traj = Trajectory(
            id=_trajectory_id(task, group_id, sample_index), task_id=task_id, sample_index=sample_index,
            group_id=group_id, prompt_ids=[], task=dict(task), horizon=horizon,
        )
        return _Live(traj, EpisodeBinding(self._specs() or {}, new_episode_id(traj.id)))

    async def _play(self, live: _Live, task: dict[str, Any] | None, horizon: int, sampling: SamplingParams | None,
                    seed: int | None, *, start: int = 0, stop: Callable[[Trajectory, int], bool] | None = None
                    ) -> None:
        """Open the episode (when `task` is given: the trajectory's start) and play turns `start`.. until the
        trajectory ends, or until `stop(traj, turn)` says to pause before turn `turn` (`live.going` stays True: it
        paused there). A failure ends it as an error, recorded on the trajectory."""
        traj, t0 = live.traj, time.perf_counter()
        try:
            if task is not None:
                traj.messages = self.chat.prompt_messages(task.get("prompt"), task.get("system_prompt"))
                reset = await live.env.open(task, self.tools)
                if reset is not None:  # part of the prompt: rendered once by the template, never a delta
                    traj.messages.append({"role": "user",
                                          "content": self._truncate(self.chat.neutralize(reset_observation(reset)))})
                traj.messages, shown = prompt_with_images(self.chat, traj.messages, task,
                                                          reset.images if reset is not None else [])
                traj.prompt_ids = self.chat.prompt_ids(traj.messages, shown)
                traj.images = image_records(traj.prompt_ids, 0, shown, self.chat)
                if self.cfg.keep_unseen_images and reset is not None:
                    traj.unseen_images = unseen(reset.images, shown)
            live.going = await self._turns(traj, horizon, sampling or self.default_sampling(), seed, live.timings,
                                           live.env, start=start, stop=stop)
        except asyncio.CancelledError:
            raise  # no close: the servers' idle expiry frees a cancelled trajectory's episodes
        except Exception as e:  # a failed rollout is data: recorded and counted, the batch goes on
            traj.finish_reason = "error"
            traj.error = f"{type(e).__name__}: {e}"
            logger.warning("trajectory %s failed: %s", traj.id, traj.error)
            logger.debug("trajectory %s traceback:\n%s", traj.id, traceback.format_exc())
            live.going = False
        finally:
            live.timings["total_s"] += time.perf_counter() - t0

    async def _end(self, live: _Live) -> Trajectory:
        t0 = time.perf_counter()
        await live.env.close(self.tools)
        live.timings["total_s"] += time.perf_counter() - t0
        live.traj.timings = dict(live.timings)
        return live.traj

    # ---- one group ------------------------------------------------------------------------------------------
    async def run_group(self, task: dict[str, Any], n: int, *, group_id: str | None, horizon: int,
                        seeds: list[int | None], sampling: SamplingParams | None = None,
                        gate: TrajectoryGate | None = None, branching: bool = True) -> list[Trajectory]:
        """One GRPO group of `n` trajectories for `task`, in sample order (`seeds[k]`: sample k's). Independent
        samples, or, with `rollout.branching.width` > 1 (and `branching`), a tree: `n / width` roots play the first
        `at_turn` turns, then each root's episodes are forked and `width` branches play on from there, the root's
        tokens shared (`Trajectory.branch`). `gate` bounds the trajectories in flight (a tree: a slot per branch)."""
        gate = gate or TrajectoryGate(n)
        b = self.cfg.branching
        if not branching or b.width <= 1:
            async def one(k: int) -> Trajectory:
                async with gate.one():
                    return await self.run_one(task, sample_index=k, group_id=group_id, horizon=horizon,
                                              sampling=sampling, seed=seeds[k])

            return list(await asyncio.gather(*(one(k) for k in range(n))))
        trees = await asyncio.gather(*(self._tree(task, r, group_id, horizon, seeds, sampling, gate)
                                       for r in range(b.roots(n, of=f"a group of {n}"))))
        return [t for tree in trees for t in tree]

    async def _tree(self, task: dict[str, Any], r: int, group_id: str | None, horizon: int,
                    seeds: list[int | None], sampling: SamplingParams | None,
                    gate: TrajectoryGate) -> list[Trajectory]:
        """Root `r` of a branched group and its branches (samples r*width .. r*width + width - 1)."""
        width = self.cfg.branching.width
        k0 = r * width
        async with gate.many(width):
            root = self._start(task, k0, group_id, horizon)
            await self._play(root, task, horizon, sampling, seeds[k0], stop=self._branch_here)
            point = Branch(root=r, child=0, prefix_tokens=len(root.traj.response_ids),
                           prefix_turns=root.traj.num_turns)
            lives = [root, *await asyncio.gather(*(self._branch(root, point, c, k0 + c) for c in range(1, width)))]
            root.traj.branch = point

            async def play_on(live: _Live, k: int) -> None:
                if live.going:
                    await self._play(live, None, horizon, sampling, seeds[k], start=point.prefix_turns)

            await asyncio.gather(*(play_on(live, k0 + c) for c, live in enumerate(lives)))
            return [await self._end(live) for live in lives]

    def _branch_here(self, traj: Trajectory, turn: int) -> bool:
        """Whether a root branches before turn `turn` (`rollout.branching`): at `at_turn`, or with `when: uncertain`
        after an earlier turn whose sampled tokens surprised the policy (mean -logprob, an estimate of the turn's
        entropy) at least `uncertainty`."""
        b = self.cfg.branching
        if turn >= b.at_turn:
            return True
        if b.when != "uncertain" or turn == 0:
            return False
        span = next(s for s in reversed(traj.turns) if s.role == "assistant")
        lps = traj.logprobs[span.start:span.end]
        return bool(lps) and -sum(lps) / len(lps) >= b.uncertainty

    async def _branch(self, root: _Live, point: Branch, child: int, k: int) -> _Live:
        """Branch `child` of `root` (sample `k`): the root's trajectory so far, in forks of its episodes."""
        task = root.traj.task
        traj = root.traj.model_copy(deep=True, update={
            "id": _trajectory_id(task, root.traj.group_id, k), "sample_index": k,
            "branch": point.model_copy(update={"child": child}), "timings": {}})
        live = _Live(traj, EpisodeBinding(self._specs() or {}, new_episode_id(traj.id)), going=root.going)
        if live.going:
            t0 = time.perf_counter()
            try:
                live.env = await root.env.fork(self.tools, live.env.episode_id)
            except Exception as e:  # the branch fails alone; its siblings go on
                traj.finish_reason, traj.error = "error", f"{type(e).__name__}: {e}"
                logger.warning("trajectory %s could not branch: %s", traj.id, traj.error)
                live.going = False
            live.timings["tools_s"] += time.perf_counter() - t0
        return live

    async def _turns(self, traj: Trajectory, horizon: int, sampling: SamplingParams, seed: int | None,
                     timings: dict[str, float], env: EpisodeBinding, *, start: int = 0,
                     stop: Callable[[Trajectory, int], bool] | None = None) -> bool:
        """Turns `start`.. of `traj`; True when it paused, still going, where `stop` said (see `_play`)."""
        cfg, chat = self.cfg, self.chat
        out_buf = _Builder(traj)
        stop_ids = set(sampling.stop_token_ids) | set(chat.stop_token_ids)
        if not set(chat.stop_token_ids) <= set(sampling.stop_token_ids):
            sampling = sampling.model_copy(update={"stop_token_ids": sorted(stop_ids)})
        for turn in range(start, horizon):
            if stop is not None and stop(traj, turn):
                return True
            used = len(traj.prompt_ids) + len(traj.response_ids)
            room_context = cfg.max_context_tokens - used
            room_budget = cfg.max_response_tokens - len(traj.response_ids)
            if room_context <= 0:
                traj.finish_reason = "context_length"
                return False
            if room_budget <= 0:
                traj.finish_reason = "token_budget"
                return False
            max_new = min(sampling.max_new_tokens, room_context, room_budget)
            turn_seed = None if seed is None else mix_seed(seed, turn)
            params = sampling.model_copy(update={"max_new_tokens": max_new, "seed": turn_seed})
            t0 = time.perf_counter()
            pixels = {"images": list(traj.images)} if traj.images else {}  # engines without images take none
            out = await self.engine.generate(traj.prompt_ids + traj.response_ids, params,
                                             request_id=f"{traj.id}#{turn}", **pixels)
            timings["generate_s"] += time.perf_counter() - t0
            ids = list(out.token_ids)
            if len(ids) > max_new:
                raise RuntimeError(f"the engine returned {len(ids)} tokens for max_new_tokens={max_new}")
            if out.logprobs is not None and len(out.logprobs) != len(ids):
                raise RuntimeError(f"the engine returned {len(out.logprobs)} logprobs for {len(ids)} tokens")
            ended_by_stop = bool(ids) and (ids[-1] in stop_ids or out.finish_reason == "stop")
            closed = bool(ids) and ids[-1] == chat.im_end_id
            # The turn's text for parsing, messages and rewards: without the closing special token.
            text = chat.decode(ids[:-1] if ids and ids[-1] in chat.turn_end_ids else ids)
            if out.versions is not None and len(out.versions) != len(ids):
                raise RuntimeError(f"the engine returned {len(out.versions)} versions for {len(ids)} tokens")
            versions = (list(out.versions) if out.versions is not None
                        else [getattr(self.engine, "policy_version", 0)] * len(ids))
            out_buf.append("assistant", ids, list(out.logprobs) if out.logprobs is not None else None, text, versions)
            traj.messages.append({"role": "assistant", "content": text})

            parsed = parse_tool_calls(text, max_calls=cfg.max_tool_calls_per_turn, tools=self._specs())
            if not parsed:
                if ended_by_stop:
                    traj.finish_reason = "stop"
                elif len(ids) >= room_context and room_context <= min(room_budget, sampling.max_new_tokens):
                    traj.finish_reason = "context_length"
                else:  # cut by the per-turn or the total token budget, with no call to answer
                    traj.finish_reason = "token_budget"
                return False
            if turn == horizon - 1:
                traj.finish_reason = "max_turns"
                return False

            calls = [c.model_copy(update={"id": f"{traj.id}#{turn}.{i}"}) for i, c in enumerate(parsed.calls)]
            t0 = time.perf_counter()
            results = parsed.merge(await self._run_calls(env.bind(calls)))
            timings["tools_s"] += time.perf_counter() - t0
            tt = tool_turn(chat, parsed.slots, results, turn=turn, truncate=self._truncate,
                           keep_unseen=cfg.keep_unseen_images)
            traj.tool_calls.extend(tt.calls)
            delta = chat.tool_response_delta(tt.messages, turn_closed=closed, images=tt.shown)
            used = len(traj.prompt_ids) + len(traj.response_ids)
            if env.ended(results):
                # The episode is over, whatever room is left: keep its last observation when it fits.
                if (used + len(delta) <= cfg.max_context_tokens
                        and len(traj.response_ids) + len(delta) <= cfg.max_response_tokens):
                    self._keep(traj, out_buf, tt, delta, turn)
                traj.finish_reason = "env_done"
                return False
            # Room must remain for at least one generated token after the tool turn.
            if used + len(delta) >= cfg.max_context_tokens:
                traj.finish_reason = "context_length"
                return False
            if len(traj.response_ids) + len(delta) >= cfg.max_response_tokens:
                traj.finish_reason = "token_budget"
                return False
            self._keep(traj, out_buf, tt, delta, turn)
        traj.finish_reason = "max_turns"  # the horizon was reached: only when start >= horizon (or horizon < 1)
        return False

    def _keep(self, traj: Trajectory, out_buf: _Builder, tt: ToolTurn, delta: list[int], turn: int) -> None:
        """Append a tool turn's delta, messages and images to `traj`."""
        used = len(traj.prompt_ids) + len(traj.response_ids)
        out_buf.append("tool", delta, None, self.chat.decode(delta))
        traj.messages.extend(tt.messages)
        traj.images.extend(image_records(delta, used, tt.shown, self.chat, turn=turn, tools=tt.shown_by))
        traj.unseen_images.extend(tt.unseen)

    # ---- a batch --------------------------------------------------------------------------------------------
    async def run_batch(
        self,
        tasks: list[dict[str, Any]],
        samples_per_prompt: int | None = None,
        horizon: int | None = None,
        seed: int | None = 0,
        sampling: SamplingParams | None = None,
        branching: bool = False,
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """`samples_per_prompt` trajectories per task (one GRPO group each, `run_group`; branched only with
        `branching`: training, not evaluation), all in flight at once (bounded by `TrajectoryGate.sized`).
        Returns trajectories in (task, sample) order and `rollout/*` + `tools/*` metrics. The ToolManager's counters
        are reset at the start, so `tools/*` covers this batch only."""
        n = samples_per_prompt or self.cfg.samples_per_prompt
        horizon = horizon if horizon is not None else horizon_for_step(self.cfg.horizon, 0)
        gate = TrajectoryGate.sized(self.cfg.max_concurrent_trajectories, self.tools)
        if self.tools is not None:
            self.tools.reset_metrics()

        async def group(ti: int, task: dict[str, Any]) -> list[Trajectory]:
            return await self.run_group(task, n, group_id=f"{task.get('id', ti)}@{ti}", horizon=horizon,
                                        seeds=[None if seed is None else mix_seed(seed, ti, k) for k in range(n)],
                                        sampling=sampling, gate=gate, branching=branching)

        t0 = time.perf_counter()
        trajs = [t for g in await asyncio.gather(*(group(ti, t) for ti, t in enumerate(tasks))) for t in g]
        wall_s = time.perf_counter() - t0
        metrics = rollout_metrics(trajs, wall_s)
        if self.tools is not None:
            metrics.update(self.tools.metrics())
        return trajs, metrics
