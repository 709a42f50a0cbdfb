"""The image campaign of the chaos benchmark (issue 39): tools that return huge, corrupt, unsupported and too many
images, to a vision-language policy and to a text-only one, round after round.

    python bench/chaos_images.py --json bench/results/chaos_images.json [--seed 0] [--quick]

A real MCP server subprocess (tests/tools/servers/image_toolbox.py, `max_image_bytes` 1 MiB as
mcp_configs/vision.json sets it) answers every call with one case, drawn from a seeded deck that holds each case
equally often per round: `good` (a 64x64 PNG), `huge_bytes` (a 700x700 noise PNG, 1.5 MB), `huge_pixels` (a
4,000 x 4,000 PNG: within the bounds, decoded whole, then resized by the vision processor), `bomb` and
`bomb_past_pil` (PNG headers claiming 10,000 and 50,000 pixels square: refused by our bound, and by PIL's own before
it), `corrupt` (a PNG cut in half), `not_an_image`, `unsupported` (a TIFF), `thin` (a 1 x 305 strip the processor
refuses), `many` (100 images in one result, over `max_images_per_result`), `several` (8 images, the most allowed)
and `mixed` (a good image beside a corrupt one). Two policies play through it: scripted tiny Qwen3-VL
(tests/scripted_model.py, a real Qwen3-VL forward with a random vision tower) and scripted tiny Qwen3 (text-only),
each calling a tool every turn; the HF engine, AgentLoop and ToolManager are the real ones.

Figures: `image_rollout_crashes` (rollouts that raised or ended as errors: must be 0; every trajectory plays all its
turns), `image_feedback_missing` (calls of a bad case, or any image to the text-only policy, whose tool turn does not
say what happened: must be 0), errors by kind and one feedback text per case and policy, images shown, and resident
memory: the process's RSS after each round and its peak (sampled every 10 ms) over the RSS after a first benign
round of the same shape; `image_max_rss_growth_mb` is that peak growth, `image_rss_drift_mb` the RSS after the last
round less after the first hostile one (a leak grows it round by round). Also the HF engine's answer when images
are sent to a text-only policy directly (`text_engine_refusal`).
Left out: training on these trajectories (bench/multimodal.py runs the update on images), images in task prompts
(a bad one ends its trajectory as an error that names it: tests/rollout/test_rollout_images.py), and the vLLM engine.
"""
from __future__ import annotations

import asyncio
import base64
import copy
import json
import random
import sys
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # scripted_model: the policies; tools/servers/image_toolbox.py: the server
sys.path.insert(0, str(REPO / "bench"))
from chaos_tools import RssSampler
from rollout import RoutedTools

TOOLBOX = REPO / "tests" / "tools" / "servers" / "image_toolbox.py"
CALL = '<tool_call>{"name": "square","arguments":{"size":"1"}}</tool_call>'
"""What the scripted policies emit every turn (no token repeats); `RoutedTools` sets the case's tool and arguments."""
CASES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "good": ("square", {"size": 64}, None),
    "huge_bytes": ("noise", {"side": 700}, "over this server's max_image_bytes"),
    "huge_pixels": ("square", {"size": 4000}, None),
    "bomb": ("bomb", {"side": 10000}, "over this server's max_image_pixels"),
    "bomb_past_pil": ("bomb", {"side": 50000}, "refused as a decompression bomb"),
    "corrupt": ("truncated", {}, "is corrupt"),
    "not_an_image": ("not_an_image", {}, "not an image in a readable format"),
    "unsupported": ("tiff", {}, "format TIFF (image/tiff) is not supported"),
    "thin": ("strip", {}, "not shown: the model's image processor refused it"),
    "many": ("squares", {"count": 100}, "over this server's max_images_per_result (8)"),
    "several": ("squares", {"count": 8}, None),
    "mixed": ("mixed", {}, "is corrupt"),
}
"""case -> (tool, arguments, what the tool turn must say to the VL policy; None: nothing is wrong)."""
TEXT_ONLY_SAYS = "not shown: this model cannot see images"
TOOL_SIDE = {"huge_bytes", "bomb", "bomb_past_pil", "corrupt", "not_an_image", "unsupported", "many"}
"""Cases refused before any image reaches a policy: both policies read the same error."""


def _policy(kind: str, tools: Any, schemas: list[dict[str, Any]]) -> tuple[Any, Any]:
    """(engine, AgentLoop) of the scripted VL or text-only policy over `tools`."""
    import torch
    from scripted_model import build_scripted_qwen3, build_scripted_qwen3_vl

    from rlfactory.models.tokenizer import load_qwen_tokenizer
    from rlfactory.models.vision import attach_vision, tiny_vision_processor, vl_chat_template
    from rlfactory.recipe.rollout import RolloutConfig
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.rollout.engines.hf import HFEngine

    torch.set_num_threads(1)
    tok = load_qwen_tokenizer()
    if kind == "vl":
        tok = copy.copy(tok)  # the offline tokenizer is shared within the process: the text policy's stays as it is
        tok.chat_template = vl_chat_template()
        attach_vision(tok, tiny_vision_processor(tok))
    ids = tok.encode(CALL + "<|im_end|>", add_special_tokens=False)
    if len(set(ids)) != len(ids):
        raise SystemExit(f"the scripted call {CALL!r} repeats a token; the scripted policy would branch")
    chat = ChatFormat(tok, schemas)
    build = build_scripted_qwen3_vl if kind == "vl" else build_scripted_qwen3
    model = build(tok, [(CALL + "<|im_end|>", 1.0)], start_token_ids=[chat.generation_prompt_ids[-1]],
                  junk_prob=1e-9)
    engine = HFEngine(model, pad_token_id=151643, eos_token_ids=chat.stop_token_ids, max_batch_size=32,
                      vision=chat.vision)
    cfg = RolloutConfig(max_context_tokens=4096, max_response_tokens=2048, tool_response_max_tokens=96,
                        max_concurrent_trajectories=32, sampling={"temperature": 0.0, "max_new_tokens_per_turn": 32})
    return engine, AgentLoop(engine, tools, chat, cfg)


async def _text_engine_refusal(engine: Any) -> str:
    """What the text-only policy's engine answers when a request carries an image anyway."""
    from rlfactory.envs.tools.digits_image import render_png
    from rlfactory.rollout.engines.protocol import SamplingParams
    from rlfactory.tools.images import ImageLimits, decode_image

    image = decode_image(base64.b64encode(render_png("42")).decode(), "image/png", ImageLimits())
    try:
        await engine.generate([151644, 872, 198], SamplingParams(max_new_tokens=2), images=[image])
    except ValueError as e:
        return str(e)
    return "generated: the images were ignored without a word"


def _tally(trajs: list[Any], case_of: Any, kind: str, out: dict[str, Any]) -> None:
    """Add a round's calls to `out`: per case, calls, errors by kind, images shown, feedback seen or missing."""
    for t in trajs:
        for c in t.tool_calls:
            case = case_of(t, c.turn)
            row = out.setdefault(case, {"calls": 0, "errors": {}, "images_shown": 0, "feedback_missing": 0,
                                        "feedback": None})
            row["calls"] += 1
            if c.is_error:
                row["errors"][c.error_kind or "?"] = row["errors"].get(c.error_kind or "?", 0) + 1
            row["images_shown"] += len(c.images)
            says = CASES[case][2] if kind == "vl" or case in TOOL_SIDE else TEXT_ONLY_SAYS
            if says is not None:
                tool_turns = [s.text for s in t.turns if s.role == "tool"]
                seen = tool_turns[c.turn] if c.turn < len(tool_turns) else ""
                if says not in c.result or says not in seen:
                    row["feedback_missing"] += 1
                    row.setdefault("missing_example", c.result[-240:])
                elif row["feedback"] is None:
                    row["feedback"] = c.result[-240:]


async def play(kind: str, config: Path, *, trajectories: int, turns: int, rounds: int, seed: int
                ) -> dict[str, Any]:
    """One policy (`vl` or `text`) through the server of `config`: a benign round, then `rounds` hostile ones of
    `trajectories` x `turns` calls each; its figures (see the module's docstring)."""
    from rlfactory.tools.manager import ToolManager

    names = list(CASES)
    decks: dict[int, list[str]] = {}

    def case_of_index(rnd: int, i: int) -> str:
        if rnd < 0:
            return "good"  # the benign baseline round
        if rnd not in decks:
            deck = [names[j % len(names)] for j in range(trajectories * turns)]
            random.Random(f"{seed}|{kind}|{rnd}").shuffle(deck)
            decks[rnd] = deck
        return decks[rnd][i]

    current = {"round": -1}

    def route(call_id: str) -> tuple[str, dict[str, Any]]:
        trajectory, _, rest = call_id.rpartition("#")  # AgentLoop call ids: "<task id>@<index>/<sample>#<turn>.<k>"
        i = int(trajectory.split("@")[0]) * turns + int(rest.split(".")[0])
        tool, args, _ = CASES[case_of_index(current["round"], i)]
        return tool, args

    async with ToolManager.from_files([config]) as manager:
        engine, loop = _policy(kind, RoutedTools(manager, route), manager.openai_schemas())
        refusal = await _text_engine_refusal(engine) if kind == "text" else None
        tasks = [{"prompt": f"Task {i}: look at the picture.", "id": i} for i in range(trajectories)]
        proc = psutil.Process()
        by_case: dict[str, Any] = {}
        crashes, errors, finished, rss_after = 0, [], 0, []
        try:
            await loop.run_batch(tasks, samples_per_prompt=1, horizon=turns + 1, seed=seed)  # benign: the baseline
            baseline_mb = proc.memory_info().rss / 2**20
            with RssSampler() as rss:
                for rnd in range(rounds):
                    current["round"] = rnd
                    try:
                        trajs, _ = await loop.run_batch(tasks, samples_per_prompt=1, horizon=turns + 1,
                                                        seed=seed + rnd)
                    except Exception as e:  # noqa: BLE001 - what this campaign counts
                        crashes += 1
                        errors.append(f"{type(e).__name__}: {e}")
                        continue
                    bad = [t for t in trajs if t.finish_reason == "error" or len(t.tool_calls) != turns]
                    crashes += sum(t.finish_reason == "error" for t in trajs)
                    errors += [f"{t.id}: {t.finish_reason} {t.error}" for t in bad][:3]
                    finished += len(trajs) - len(bad)
                    _tally(trajs, lambda t, turn, r=rnd: case_of_index(r, int(t.task_id) * turns + turn), kind,
                           by_case)
                    rss_after.append(round(proc.memory_info().rss / 2**20, 1))
        finally:
            await engine.close()
    return {
        "trajectories_expected": trajectories * rounds, "trajectories_finished": finished,
        "rollout_crashes": crashes, "errors": errors[:5],
        "feedback_missing": sum(r["feedback_missing"] for r in by_case.values()),
        "errors_by_kind": _sum_kinds(by_case), "images_shown": sum(r["images_shown"] for r in by_case.values()),
        "rss_baseline_mb": round(baseline_mb, 1), "rss_after_round_mb": rss_after,
        "max_rss_growth_mb": round(rss.growth_mb, 1),
        "rss_drift_mb": round(rss_after[-1] - rss_after[0], 1) if rss_after else None,
        "text_engine_refusal": refusal, "by_case": by_case,
    }


def _sum_kinds(by_case: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in by_case.values():
        for k, n in row["errors"].items():
            out[k] = out.get(k, 0) + n
    return out


def campaign(tmp: Path, *, seed: int = 0, quick: bool = False) -> dict[str, Any]:
    """Both policies through the hostile image server; the figures."""
    config = tmp / "images.json"
    config.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [str(TOOLBOX)],
        "rlfactory": {"max_concurrency": 32, "tool_timeout_s": 60, "cache": False, "max_image_bytes": 2**20,
                      "max_images_per_result": 8}}}}))
    size = {"trajectories": 12 if quick else 24, "turns": 4, "rounds": 2 if quick else 5, "seed": seed}
    runs = {kind: asyncio.run(play(kind, config, **size)) for kind in ("vl", "text")}
    return {
        "image_rollout_crashes": sum(r["rollout_crashes"] for r in runs.values()),
        "image_trajectories_finished": sum(r["trajectories_finished"] for r in runs.values()),
        "image_trajectories_expected": sum(r["trajectories_expected"] for r in runs.values()),
        "image_feedback_missing": sum(r["feedback_missing"] for r in runs.values()),
        "image_max_rss_growth_mb": max(r["max_rss_growth_mb"] for r in runs.values()),
        "image_rss_drift_mb": max(r["rss_drift_mb"] or 0.0 for r in runs.values()),
        **size, "quick": quick, "policies": runs,
    }


def main() -> None:
    from campaign_cli import run_campaign  # bench/ is on the path when this file runs as a script

    run_campaign(__doc__, campaign, name="images", quick_help="12 trajectories x 2 rounds per policy (not the figures)")


if __name__ == "__main__":
    main()
