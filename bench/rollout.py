"""Rollout benchmark: our AgentLoop (one asyncio task per trajectory, no barrier) vs a barrier-per-turn loop, and vs
the critical path.

    python bench/rollout.py --json bench/results/rollout.json

Workload: 32 trajectories of 4 tool-using turns each (an assistant turn with a tool call, then the tool's response;
a 5th assistant turn is cut by the horizon), through the real HF engine and a real MCP server
(`bench/tool_server.py`, `sleep_ms`). The policy is a tiny Qwen3 whose weights follow a script (a call every turn,
greedy). Tool latency is heavy-tailed: lognormal (median 80 ms, sigma 1.5) clipped to 50 ms..2 s, drawn per
(trajectory, turn) from the seed, so both loops see exactly the same latencies; the run checks that they also
generate exactly the same tokens.

- `speedup_vs_barrier` = barrier loop time / ours. The barrier loop is the same AgentLoop with a phase barrier
  around generation and tool calls: all trajectories generate, then all tools run, then the next turn (what the
  AgentGym-RL and RL-Factory loops do). Goal >= 2.0. `speedup_bound_from_latencies` (sum over turns of the slowest
  call / the slowest trajectory's total latency) is what the latency draw allows without generation; across seeds
  it is about 2.2 at the median (1.5 to 2.6) for this distribution, 2.38 for seed 0.
- `ratio_to_critical_path` = ours / the lower bound: the longest single trajectory's own generation time (every
  trajectory is first run alone on the idle engine with instant tools) plus its own tool time (its scheduled
  latencies plus the per-call overhead measured alone). Goal <= 1.3.
Each loop runs `--repeats` times, alternating; medians are reported. The policy uses a small BPE vocabulary trained
on the benchmark's transcripts so that generation is cheap next to tool latency, as on a GPU engine: with Qwen's
151k-row LM head on 2 CPU cores, generation itself is the bottleneck and no loop can overlap it.
`--thought-mean N` adds a sampled "thought" of geometric length (mean N tokens) before each call, so generation
length varies per turn too.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the scripted Qwen3 model the rollout tests use
CALL = '<tool_call>{"name": "sleep_ms", "arguments": {"ms": 0}}</tool_call>'
"""The call the policy emits every turn; the `ms` argument is replaced by the latency schedule."""
THOUGHT = "x"
"""The policy "thinks" a run of this token before each call; the run's length is geometric (the chain's self-loop),
so generation length varies per (trajectory, turn) like real reasoning does."""
log = logging.getLogger("bench.rollout")


# ------------------------------------------------------------------------------------------------ tool latency
class LatencySchedule:
    """Seeded heavy-tailed latency per (trajectory, turn): the same for every loop that asks."""

    def __init__(self, seed: int, median_s: float, sigma: float, lo_s: float, hi_s: float):
        self.seed, self.mu, self.sigma, self.lo, self.hi = seed, math.log(median_s), sigma, lo_s, hi_s

    @classmethod
    def instant(cls) -> "LatencySchedule":
        """No added latency: for timing a trajectory's own generation and the bare per-call overhead."""
        return cls(0, 1.0, 0.0, 0.0, 0.0)

    def latency_s(self, trajectory: str, turn: int) -> float:
        rng = random.Random(f"{self.seed}|{trajectory}|{turn}")
        return min(self.hi, max(self.lo, rng.lognormvariate(self.mu, self.sigma)))

    def ms_for_call(self, call_id: str) -> int:
        # AgentLoop call ids are "<trajectory id>#<turn>.<index>"
        trajectory, _, rest = call_id.rpartition("#")
        return round(1000 * self.latency_s(trajectory, int(rest.split(".")[0])))


class RoutedTools:
    """The ToolManager with each call rewritten from its id, so every run sends the same calls: the scripted policy
    always emits one call, and `route(call_id)` gives (tool name, or None to keep it; arguments) for it."""

    def __init__(self, manager: Any, route: Callable[[str], tuple[str | None, dict[str, Any]]]):
        self.manager, self.route = manager, route

    @property
    def specs(self) -> list[Any]:
        return self.manager.specs

    def openai_schemas(self) -> list[dict[str, Any]]:
        return self.manager.openai_schemas()

    async def call_many(self, calls: list[Any]) -> list[Any]:
        routed = []
        for c in calls:
            name, arguments = self.route(c.id)
            routed.append(c.model_copy(update={"arguments": arguments, **({"name": name} if name else {})}))
        return await self.manager.call_many(routed)

    def reset_metrics(self) -> None:
        self.manager.reset_metrics()

    def metrics(self) -> dict[str, float]:
        return self.manager.metrics()


class ScheduledTools(RoutedTools):
    """The ToolManager with each call's `ms` set from the schedule (by the call's trajectory and turn)."""

    def __init__(self, manager: Any, schedule: LatencySchedule):
        super().__init__(manager, lambda call_id: (None, {"ms": schedule.ms_for_call(call_id)}))
        self.schedule = schedule


# ------------------------------------------------------------------------------------------------ the baseline
class PhaseBarrier:
    """All trajectories still running must arrive before any proceeds; finished trajectories leave."""

    def __init__(self, parties: int):
        self.parties, self.waiting, self.event = parties, 0, asyncio.Event()

    async def wait(self) -> None:
        self.waiting += 1
        if self.waiting >= self.parties:
            self._release()
            return
        await self.event.wait()

    def leave(self) -> None:
        self.parties -= 1
        if self.waiting and self.waiting >= self.parties:
            self._release()

    def _release(self) -> None:
        event, self.event, self.waiting = self.event, asyncio.Event(), 0
        event.set()


class BarrierEngine:
    def __init__(self, engine: Any, barrier: PhaseBarrier):
        self.engine, self.barrier = engine, barrier

    async def generate(self, prompt_ids, sampling, request_id=None):  # noqa: ANN001, ANN201
        await self.barrier.wait()  # every trajectory finished its tools: start the next turn together
        return await self.engine.generate(prompt_ids, sampling, request_id=request_id)


class BarrierTools(ScheduledTools):
    def __init__(self, tools: ScheduledTools, barrier: PhaseBarrier):
        super().__init__(tools.manager, tools.schedule)
        self.barrier = barrier

    async def call_many(self, calls: list[Any]) -> list[Any]:
        await self.barrier.wait()  # every trajectory finished generating: run all tools together
        return await super().call_many(calls)


async def run_ours(loop: Any, tasks: list[dict[str, Any]], horizon: int) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    trajs, _ = await loop.run_batch(tasks, samples_per_prompt=1, horizon=horizon, seed=0)
    return time.perf_counter() - t0, trajs


async def run_barrier(loop_cls: Any, engine: Any, tools: ScheduledTools, chat: Any, cfg: Any,
                      tasks: list[dict[str, Any]], horizon: int) -> tuple[float, list[Any]]:
    from rlfactory.data.seeds import mix_seed

    barrier = PhaseBarrier(len(tasks))
    loop = loop_cls(BarrierEngine(engine, barrier), BarrierTools(tools, barrier), chat, cfg)

    async def one(ti: int, task: dict[str, Any]) -> Any:
        try:  # same ids and seeds as AgentLoop.run_batch, so the schedule and the tokens match
            return await loop.run_one(task, sample_index=0, group_id=f"{task.get('id', ti)}@{ti}", horizon=horizon,
                                      seed=mix_seed(0, ti, 0))
        finally:
            barrier.leave()

    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(one(ti, t) for ti, t in enumerate(tasks)))
    return time.perf_counter() - t0, list(trajs)


# ------------------------------------------------------------------------------------------------ setup
def build_tokenizer(tool_schemas: list[dict[str, Any]]) -> Any:
    from rlfactory.warmup.tokenizer_builder import build_tokenizer as train_bpe

    transcripts = [{"tools": tool_schemas, "messages": [
        {"role": "user", "content": f"Task {i}: wait for the tool."},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": f"slept {ms} ms"},
        {"role": "assistant", "content": CALL},
    ]} for i, ms in enumerate(range(50, 2000, 37))]
    return train_bpe(transcripts, vocab_size=1000, model_max_length=4096)


def policy_tokens(t: Any) -> list[int]:
    return [i for i, m in zip(t.response_ids, t.loss_mask) if m]


def check_trajectories(trajs: list[Any], horizon: int, label: str) -> None:
    """The workload must be what it claims: every trajectory ran `horizon` turns with a real call per tool round."""
    for t in trajs:
        if t.finish_reason != "max_turns" or t.num_turns != horizon or len(t.tool_calls) != horizon - 1:
            raise SystemExit(f"{label}: trajectory {t.id} did not run the scripted workload: {t.finish_reason}, "
                             f"{t.num_turns} turns, {len(t.tool_calls)} calls, error={t.error}")
        bad = [c for c in t.tool_calls if c.is_error]
        if bad:
            raise SystemExit(f"{label}: tool call failed: {bad[0].result}")


def engine_figures() -> dict[str, Any]:
    """H3's engine-throughput figures (bench/engines.py), when that benchmark offers a function for it."""
    path = Path(__file__).with_name("engines.py")
    if not path.exists():
        return {}
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location("bench_engines", path)
        mod = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(mod)
        fn = getattr(mod, "throughput", None) or getattr(mod, "measure_throughput", None)
        if fn is None:
            return {}
        figures = fn(quick=True) if "quick" in getattr(fn, "__code__").co_varnames else fn()
        return {f"engines/{k}": v for k, v in dict(figures).items()}
    except Exception as e:  # the engines benchmark is optional here; its own run reports its failures
        log.warning("bench/engines.py figures unavailable: %s", e)
        return {"engines/error": f"{type(e).__name__}: {e}"}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from scripted_model import build_scripted_qwen3

    from rlfactory.data.seeds import mix_seed
    from rlfactory.recipe.rollout import RolloutConfig
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.rollout.engines.hf import HFEngine
    from rlfactory.tools.manager import ToolManager

    torch.set_num_threads(1)
    schedule = LatencySchedule(args.seed, args.median_ms / 1000, args.sigma, 0.05, 2.0)
    tmp = Path(tempfile.mkdtemp(prefix="rlf-bench-rollout-"))
    config = tmp / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"bench": {
        "command": "python", "args": [str(REPO / "bench" / "tool_server.py")],
        "rlfactory": {"max_concurrency": 256, "tool_timeout_s": 30, "cache": False}}}}))
    horizon, n = args.tool_turns + 1, args.trajectories
    tasks = [{"prompt": f"Task {i}: wait for the tool.", "id": i} for i in range(n)]
    async with ToolManager.from_files([config]) as manager:
        tools = ScheduledTools(manager, schedule)
        schemas = [s for s in manager.openai_schemas() if s["function"]["name"] == "sleep_ms"]
        tok = build_tokenizer(schemas)
        chat = ChatFormat(tok, schemas, enable_thinking=False)
        # A thought of mean length m: the script has m copies of the thought token, i.e. a self-loop taken with
        # probability (m-1)/m, then the call (whose tokens must be distinct, so the chain cannot branch inside it).
        call_ids = tok.encode(CALL + "<|im_end|>", add_special_tokens=False)
        thought_ids = tok.encode(THOUGHT, add_special_tokens=False)
        if len(set(call_ids)) != len(call_ids) or len(thought_ids) != 1 or thought_ids[0] in call_ids:
            raise SystemExit("the benchmark's script repeats a token; the scripted policy would branch")
        script = THOUGHT * args.thought_mean + CALL + "<|im_end|>"
        # Without a thought there is nothing to sample: greedy decoding skips the sampler's per-row work.
        temperature = 1.0 if args.thought_mean > 1 else 0.0
        model = build_scripted_qwen3(tok, [(script, 1.0)],
                                     start_token_ids=[chat.generation_prompt_ids[-1]], junk_prob=1e-9)
        engine = HFEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=chat.stop_token_ids,
                          max_batch_size=64, batch_wait_ms=1.0)
        cfg = RolloutConfig(max_context_tokens=4096, max_response_tokens=2048, tool_response_max_tokens=64,
                            max_concurrent_trajectories=256, sampling={"temperature": temperature,
                                                                        "max_new_tokens_per_turn": 512})
        loop = AgentLoop(engine, tools, chat, cfg)
        try:
            # warm-up (first forward passes, server code paths); then every trajectory alone on the idle engine with
            # instant tools: its own generation time and the per-call overhead, the parts of the lower bound
            await loop.run_one(tasks[0], horizon=2, seed=1)
            solo_loop = AgentLoop(engine, ScheduledTools(manager, LatencySchedule.instant()), chat, cfg)
            solo_generate_s: dict[str, float] = {}
            solo_tokens: dict[str, list[int]] = {}
            overheads = []
            for ti, task in enumerate(tasks):
                t = await solo_loop.run_one(task, group_id=f"{task['id']}@{ti}", horizon=horizon,
                                            seed=mix_seed(0, ti, 0))
                check_trajectories([t], horizon, "solo")
                solo_generate_s[t.id] = t.timings["generate_s"]
                solo_tokens[t.id] = policy_tokens(t)  # tool texts differ ("slept 0 ms"); policy tokens must not
                overheads.append(t.timings["tools_s"] / (horizon - 1))
            call_overhead_s = statistics.median(overheads)
            ours_s, barrier_s = [], []
            busy = {"ours": [], "barrier": []}
            for _ in range(args.repeats):
                before = (engine.stats.busy_s, engine.stats.prefill_batches, engine.stats.decode_steps)
                wall, trajs = await run_ours(loop, tasks, horizon)
                busy["ours"].append([round(engine.stats.busy_s - before[0], 3),
                                     engine.stats.prefill_batches - before[1],
                                     engine.stats.decode_steps - before[2]])
                before = (engine.stats.busy_s, engine.stats.prefill_batches, engine.stats.decode_steps)
                check_trajectories(trajs, horizon, "ours")
                ours_s.append(wall)
                wall, btrajs = await run_barrier(AgentLoop, engine, tools, chat, cfg, tasks, horizon)
                check_trajectories(btrajs, horizon, "barrier")
                busy["barrier"].append([round(engine.stats.busy_s - before[0], 3),
                                        engine.stats.prefill_batches - before[1],
                                        engine.stats.decode_steps - before[2]])
                barrier_s.append(wall)
                if [t.response_ids for t in trajs] != [t.response_ids for t in btrajs] or any(
                        solo_tokens[t.id] != policy_tokens(t) for t in trajs):
                    diff = [(t.id, len(t.response_ids), len(b.response_ids), len(solo_tokens[t.id]))
                            for t, b in zip(trajs, btrajs) if t.response_ids != b.response_ids
                            or solo_tokens[t.id] != policy_tokens(t)]
                    raise SystemExit("the loops generated different tokens, "
                                     f"so the comparison would not be fair: {diff}")
            stats = engine.stats
        finally:
            await engine.close()

    own_tool_s = [sum(schedule.latency_s(t.id, turn) for turn in range(horizon - 1)) + (horizon - 1) * call_overhead_s
                  for t in trajs]
    own_s = [solo_generate_s[t.id] + tool_s for t, tool_s in zip(trajs, own_tool_s)]
    critical_path_s = max(own_s)
    ours, barrier = statistics.median(ours_s), statistics.median(barrier_s)
    crit = max(range(len(trajs)), key=lambda i: own_s[i])
    per_turn_max = [max(schedule.latency_s(t.id, turn) for t in trajs) for turn in range(horizon - 1)]
    result: dict[str, Any] = {
        "speedup_vs_barrier": round(barrier / ours, 3),
        "ratio_to_critical_path": round(ours / critical_path_s, 3),
        "ours_s": round(ours, 3),
        "barrier_s": round(barrier, 3),
        "critical_path_s": round(critical_path_s, 3),
        "ours_runs_s": [round(x, 3) for x in ours_s],
        "barrier_runs_s": [round(x, 3) for x in barrier_s],
        "solo_generate_s_critical": round(solo_generate_s[trajs[crit].id], 4),
        "solo_generate_s_max": round(max(solo_generate_s.values()), 4),
        "tool_call_overhead_s": round(call_overhead_s, 4),
        "sum_of_per_turn_max_latency_s": round(sum(per_turn_max), 3),
        "max_trajectory_tool_latency_s": round(max(own_tool_s), 3),
        "ours_critical_trajectory": {k: round(v, 3) for k, v in trajs[crit].timings.items()},
        "trajectories": n,
        "tool_turns": horizon - 1,
        "assistant_turns": horizon,
        "speedup_bound_from_latencies": round(sum(per_turn_max) / max(
            sum(schedule.latency_s(t.id, turn) for turn in range(horizon - 1)) for t in trajs), 3),
        "policy_tokens_per_trajectory_mean": round(statistics.mean(sum(t.loss_mask) for t in trajs), 1),
        "policy_tokens_per_turn_max": max(s.end - s.start for t in trajs for s in t.turns if s.role == "assistant"),
        "latency": {"dist": "lognormal", "median_ms": args.median_ms, "sigma": args.sigma, "clip_ms": [50, 2000],
                    "seed": args.seed},
        "engine_busy_s_prefills_decode_steps": busy,
        "engine": {"requests": stats.requests, "prefill_batches": stats.prefill_batches,
                   "decode_steps": stats.decode_steps, "max_batch_rows": stats.max_batch_rows},
        "vocab_size": len(tok),
    }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the figures to this JSON file")
    p.add_argument("--trajectories", type=int, default=32)
    p.add_argument("--tool-turns", type=int, default=4, help="tool-using turns per trajectory (horizon = this + 1)")
    p.add_argument("--median-ms", type=float, default=80.0)
    p.add_argument("--sigma", type=float, default=1.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--thought-mean", type=int, default=0,
                   help="mean length (tokens) of the policy's text before each call; geometric, at least 1")
    p.add_argument("--no-engines", action="store_true", help="skip bench/engines.py's throughput figures")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = asyncio.run(main_async(args))
    if not args.no_engines:
        result.update(engine_figures())
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    print(f"speedup_vs_barrier={result['speedup_vs_barrier']} (goal >= 2.0); "
          f"ratio_to_critical_path={result['ratio_to_critical_path']} (goal <= 1.3)")


if __name__ == "__main__":
    sys.exit(main())
