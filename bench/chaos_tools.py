"""The tool-layer campaigns of `bench/chaos.py`, in one process: a real HF engine (the scripted tiny Qwen3 of
`bench/rollout.py`, which calls a tool every turn), the real AgentLoop and ToolManager, real MCP server
subprocesses.

- `server_kills`: 64 prompts x 8 samples, 3 tool turns each, against `bench/tool_server.py` (4 sessions). Calls
  alternate by call id between `lookup` (read-only and idempotent: a call lost to a crash runs again once the server
  is back) and `sleep_ms` (not idempotent: lost, it is an infrastructure failure). `kill -9`s land at seeded random
  moments: during the first start, under calls, and on a replacement process while it starts.
- `fuzz`: the same loop against `bench/fuzz_server.py`, 8 tool turns a trajectory, one hostile output a call:
  10,000 `fuzz` outputs plus 50 MB outputs, binary, invalid UTF-8, raw non-UTF-8 bytes and 100,000-deep JSON.
  The process's resident memory is sampled every 10 ms; its growth is counted from the end of a benign run of the
  same shape (256 trajectories of ordinary outputs filling the same token budget), so the engine's own working
  memory is not counted as the fuzz's.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # scripted_model: the policy bench/rollout.py uses
sys.path.insert(0, str(REPO / "bench"))
from rollout import RoutedTools  # noqa: E402 - bench/rollout.py: calls rewritten from their ids

SLEEP_CALL = '<tool_call>{"name": "sleep_ms", "arguments": {"ms": 0}}</tool_call>'
EMIT_CALL = '<tool_call>{"name": "emit", "arguments": {}}</tool_call>'
"""What the scripted policy emits each turn; `RoutedTools` sets the real tool and arguments from the call's id."""


def _turn(call_id: str) -> tuple[str, int]:
    trajectory, _, rest = call_id.rpartition("#")  # AgentLoop call ids: "<trajectory id>#<turn>.<index>"
    return trajectory, int(rest.split(".")[0])


def _tokenizer(schemas: list[dict[str, Any]], call: str) -> Any:
    """A small BPE vocabulary trained on transcripts of this workload (generation stays cheap next to the tools)."""
    from rlfactory.warmup.tokenizer_builder import build_tokenizer

    transcripts = [{"tools": schemas, "messages": [
        {"role": "user", "content": f"Task {i}: use the tool."}, {"role": "assistant", "content": call},
        {"role": "tool", "content": f"slept {ms} ms"}, {"role": "assistant", "content": call},
    ]} for i, ms in enumerate(range(50, 2000, 37))]
    tok = build_tokenizer(transcripts, vocab_size=1000, model_max_length=8192)
    ids = tok.encode(call + "<|im_end|>", add_special_tokens=False)
    if len(set(ids)) != len(ids):
        raise SystemExit(f"the scripted call {call!r} repeats a token; the scripted policy would branch")
    return tok


async def _policy(manager: Any, tools: Any, *, call: str, max_batch: int, concurrency: int, tool_tokens: int
                  ) -> tuple:
    """The scripted policy (it emits `call` every turn), its engine and an AgentLoop over `tools`."""
    import torch
    from scripted_model import build_scripted_qwen3

    from rlfactory.recipe.rollout import RolloutConfig
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.rollout.engines.hf import HFEngine

    torch.set_num_threads(1)
    schemas = manager.openai_schemas()
    tok = _tokenizer(schemas, call)
    chat = ChatFormat(tok, schemas, enable_thinking=False)
    model = build_scripted_qwen3(tok, [(call + "<|im_end|>", 1.0)], start_token_ids=[chat.generation_prompt_ids[-1]],
                                 junk_prob=1e-9)
    engine = HFEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=chat.stop_token_ids,
                      max_batch_size=max_batch, batch_wait_ms=1.0)
    cfg = RolloutConfig(max_context_tokens=8192, max_response_tokens=6144, tool_response_max_tokens=tool_tokens,
                        max_concurrent_trajectories=concurrency,
                        sampling={"temperature": 0.0, "max_new_tokens_per_turn": 64})
    return tok, engine, AgentLoop(engine, tools, chat, cfg)


def _write(trajs: list[Any], path: Path) -> int:
    with path.open("w") as f:
        for t in trajs:
            f.write(json.dumps(t.model_dump(mode="json"), ensure_ascii=False) + "\n")
    with path.open() as f:
        return sum(1 for line in f if line.strip())


def _trained_on_infra(trajs: list[Any], tokenizer: Any) -> int:
    """The trainer's own accounting (trainer/loop.py): trajectories hit by infrastructure failures that keep a
    trained token in the GRPO batch."""
    from rlfactory.algorithms.grpo import build_batch, exclude_infra_failures, trained_on_infra_failures
    from rlfactory.models.loading import pad_id_of

    hit = [t.infra_failed for t in trajs]
    batch = build_batch(exclude_infra_failures(trajs), pad_id_of(tokenizer))
    return trained_on_infra_failures(hit, batch)


# ------------------------------------------------------------------------------------------------ server kills
class Killer:
    """`kill -9` of the campaign's tool-server processes, at seeded random moments."""

    def __init__(self, seed: int, marker: str):
        self.rng, self.marker = random.Random(seed), marker
        self.kills: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def processes(self) -> set[int]:
        found = set()
        for p in psutil.Process().children(recursive=True):
            try:
                if any(self.marker in part for part in p.cmdline()):
                    found.add(p.pid)
            except psutil.Error:
                continue
        return found

    def kill(self, pid: int, phase: str) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.kills.append({"t_s": round(time.monotonic() - self.t0, 3), "pid": pid, "phase": phase})
        return True

    async def new_process(self, known: set[int], limit_s: float = 20.0) -> int | None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            fresh = self.processes() - known
            if fresh:
                return min(fresh)
            await asyncio.sleep(0.01)
        return None

    async def during_first_start(self) -> None:
        pid = await self.new_process(set())
        if pid is not None:
            await asyncio.sleep(self.rng.uniform(0.02, 0.2))
            self.kill(pid, "first start")

    async def during_rollout(self, server: Any, target: int, done: asyncio.Event) -> None:
        while not done.is_set() and len(self.kills) < target:
            await asyncio.sleep(self.rng.uniform(0.3, 0.9))
            ready = [p for p in server.pids if psutil.pid_exists(p)]
            if not ready or done.is_set():
                continue
            known = self.processes()
            if not self.kill(self.rng.choice(ready), "under calls"):
                continue
            if self.rng.random() < 0.4:  # and its replacement, while that starts
                pid = await self.new_process(known)
                if pid is not None and not done.is_set():
                    await asyncio.sleep(self.rng.uniform(0.0, 0.15))
                    if pid not in server.pids:
                        self.kill(pid, "during restart")


async def server_kills(tmp: Path, *, prompts: int = 64, samples: int = 8, seed: int = 0,
                       target_kills: int = 16) -> dict[str, Any]:
    from rlfactory.tools.manager import ToolManager

    config = tmp / "kills.json"
    config.write_text(json.dumps({"mcpServers": {"bench": {
        "command": sys.executable, "args": [str(REPO / "bench" / "tool_server.py")],
        "rlfactory": {"max_concurrency": 64, "sessions": 4, "tool_timeout_s": 60, "cache": False}}}}))

    def route(call_id: str) -> tuple[str, dict[str, Any]]:
        rng = random.Random(f"{seed}|{call_id}")
        ms = rng.randint(200, 800)
        if rng.random() < 0.5:
            return "lookup", {"key": call_id, "ms": ms}
        return "sleep_ms", {"ms": ms}

    killer = Killer(seed, str(REPO / "bench" / "tool_server.py"))
    first = asyncio.create_task(killer.during_first_start())
    t0 = time.perf_counter()
    async with ToolManager.from_files([config]) as manager:
        start_s = time.perf_counter() - t0
        await first
        tok, engine, loop = await _policy(manager, RoutedTools(manager, route), call=SLEEP_CALL, max_batch=64,
                                          concurrency=64, tool_tokens=48)
        try:
            tasks = [{"prompt": f"Task {i}: wait for the tool.", "id": i} for i in range(prompts)]
            done = asyncio.Event()
            chaos = asyncio.create_task(killer.during_rollout(manager.servers["bench"], target_kills, done))
            t1 = time.perf_counter()
            crashed = None
            try:
                trajs, metrics = await loop.run_batch(tasks, samples_per_prompt=samples, horizon=4, seed=seed)
            except Exception as e:  # noqa: BLE001 - a crashed rollout is what this campaign counts
                crashed, trajs, metrics = f"{type(e).__name__}: {e}", [], {}
            rollout_s = time.perf_counter() - t1
            done.set()
            await chaos
            tool_metrics = manager.metrics()
        finally:
            await engine.close()
    written = _write(trajs, tmp / "kills_trajectories.jsonl")
    leftovers = killer.processes()
    calls = [c for t in trajs for c in t.tool_calls]
    phases = [k["phase"] for k in killer.kills]
    return {
        "trajectories_expected": prompts * samples,
        "trajectories_written": written,
        "server_kills": len(killer.kills),
        "server_kills_by_phase": {p: phases.count(p) for p in sorted(set(phases))},
        "tool_calls": len(calls),
        "infra_failed_calls": sum(c.infra for c in calls),
        "retried_calls": int(tool_metrics.get("tools/retried", 0)),
        "restarts": int(tool_metrics.get("tools/restarts", 0)),
        "infra_failed_trajectories": sum(t.infra_failed for t in trajs),
        "trained_on_infra_failures": _trained_on_infra(trajs, tok) if trajs else None,
        "rollout_errors": sum(t.finish_reason == "error" for t in trajs),
        "rollout_crash": crashed,
        "calls_not_answered_by_the_tool": sum(c.is_error and not c.infra for c in calls),
        "first_start_s": round(start_s, 2),
        "rollout_s": round(rollout_s, 2),
        "servers_left_running": len(leftovers),
        "kills": killer.kills,
        "rollout_metrics": {k: v for k, v in metrics.items() if k.startswith(("rollout/infra", "rollout/errors"))},
    }


# ------------------------------------------------------------------------------------------------ fuzzing
class RssSampler:
    """Peak resident memory of this process, sampled every 10 ms on a thread."""

    def __init__(self) -> None:
        self.proc, self.peak, self.stop = psutil.Process(), 0, threading.Event()
        self.base = self.proc.memory_info().rss
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __enter__(self) -> "RssSampler":
        self.base = self.peak = self.proc.memory_info().rss
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


SPECIAL = {"huge": 3, "binary": 20, "invalid_utf8": 20, "raw_bytes": 20, "nested": 20}


async def fuzz(tmp: Path, *, fuzzed: int = 10_000, turns: int = 8, seed: int = 0, huge_mb: float = 50.0
               ) -> dict[str, Any]:
    from rlfactory.tools.manager import ToolManager

    config = tmp / "fuzz.json"
    config.write_text(json.dumps({"mcpServers": {"fuzz": {
        "command": sys.executable, "args": [str(REPO / "bench" / "fuzz_server.py"), "--huge-mb", str(huge_mb)],
        "rlfactory": {"max_concurrency": 64, "sessions": 2, "tool_timeout_s": 60, "cache": False}}}}))
    cases = [case for case, n in SPECIAL.items() for _ in range(n)] + ["fuzz"] * fuzzed
    random.Random(seed).shuffle(cases)
    n_traj = -(-len(cases) // turns)

    benign = {"on": True}

    def case_of(i: int) -> str:
        """The output of call i (task id x turns + turn)."""
        return cases[i] if i < len(cases) else "fuzz"

    def route(call_id: str) -> tuple[str, dict[str, Any]]:
        trajectory, turn = _turn(call_id)  # trajectory ids: "<task id>@<index>/<sample>", or "<task id>/<sample>"
        i = int(trajectory.split("@")[0].split("/")[0]) * turns + turn
        return "emit", {"case": "plain" if benign["on"] else case_of(i), "seed": i}

    async with ToolManager.from_files([config]) as manager:
        tok, engine, loop = await _policy(manager, RoutedTools(manager, route), call=EMIT_CALL, max_batch=64,
                                          concurrency=128, tool_tokens=64)
        try:
            tasks = [{"prompt": f"Task {i}: read the tool.", "id": i} for i in range(n_traj)]
            # The baseline: the same rollout shape (as many trajectories as run at once, as many turns, responses
            # that fill the same token budget) with benign outputs, so the engine's own working memory is in it.
            t0 = time.perf_counter()
            await loop.run_batch(tasks[:256], samples_per_prompt=1, horizon=turns + 1, seed=seed + 1)
            baseline_s = time.perf_counter() - t0
            benign["on"] = False
            rss_baseline_mb = psutil.Process().memory_info().rss / 2**20
            crashed = None
            t0 = time.perf_counter()
            with RssSampler() as rss:
                try:
                    trajs, _ = await loop.run_batch(tasks, samples_per_prompt=1, horizon=turns + 1, seed=seed)
                except Exception as e:  # noqa: BLE001 - what this campaign counts
                    crashed, trajs = f"{type(e).__name__}: {e}", []
            fuzz_s = time.perf_counter() - t0
            tool_metrics = manager.metrics()
        finally:
            await engine.close()
    calls = [c for t in trajs for c in t.tool_calls]
    by_case: dict[str, dict[str, int]] = {}
    for t in trajs:
        for c in t.tool_calls:
            case = case_of(int(t.task_id) * turns + c.turn)
            row = by_case.setdefault(case, {"calls": 0, "errors": 0, "timeouts": 0})
            row["calls"] += 1
            row["errors"] += c.is_error
            row["timeouts"] += c.error_kind == "timeout"
    broken = [t.id for t in trajs if not (len(t.response_ids) == len(t.loss_mask) == len(t.logprobs))]
    return {
        "outputs": len(cases),
        "fuzzed_outputs": fuzzed,
        "huge_mb": huge_mb,
        "trajectories": len(trajs),
        "tool_calls": len(calls),
        "rollout_crashes": (1 if crashed else 0) + sum(t.finish_reason == "error" for t in trajs),
        "rollout_crash": crashed,
        "token_invariants_broken": len(broken),
        "max_rss_growth_mb": round(rss.growth_mb, 1),
        "rss_after_benign_baseline_mb": round(rss_baseline_mb, 1),
        "benign_baseline_s": round(baseline_s, 2),
        "fuzz_s": round(fuzz_s, 2),
        "restarts": int(tool_metrics.get("tools/restarts", 0)),
        "by_case": by_case,
        "tool_response_tokens_median": statistics.median(
            s.end - s.start for t in trajs for s in t.turns if s.role == "tool") if trajs else None,
    }
