"""Images from tools against text, side by side in one run: generation tokens/s through the HF engine, the update's
seconds on the same trajectories, and the image path's share of a step (issue 39).

    python bench/multimodal.py --json bench/results/multimodal.json [--model models/quickstart-vision]
                               [--prompts 4] [--samples 2] [--rounds 3] [--quick] [--set A.B=C ...]

Policy: the quickstart's vision-language model (`--model`, default `models/quickstart-vision`, made by
`rlfactory sft recipes/quickstart_vision_sft.yaml`). When that folder does not exist, `tiny-random-vl` with scripted
weights stands in (a real tiny Qwen3-VL whose text stack follows a script, tests/scripted_model.py: it calls
`calculator_picture` every turn, with the task's expression, so every tool turn holds a picture; a random model
never emits a call), and the output says so. Recipe: recipes/quickstart_vision.yaml when it exists, else
recipes/quickstart.yaml; its rollout settings (horizon, sampling, budgets) and algorithm; tasks from its train file.

Each round takes the next `--prompts` tasks (`--samples` samples each, a GRPO step's batch) and runs, in alternating
order (image, text; then text, image):
- **generation**: the rollout through a fresh HF engine (prefix cache as the recipe says) and the real MCP servers,
  once with the calls going to `calculator_picture` (envs/tools/digits_image.py, the result a PNG) and once to its
  text twin `calculator` (envs/tools/calculator.py), same prompts (the tool schemas shown are the picture tools'
  in both), same seeds. `generation_tokens_per_s` = tokens the engine generated / the engine's busy seconds
  (forward passes and sampling, the vision tower included); `rollout_tokens_per_s` per second of the rollout's wall.
- **update**: `Update.whole_batch` (trainer/update.py: advantages, micro-batched forward/backward, optimizer step)
  on the image rollout's trajectories and on their text twins: the same policy tokens, logprobs and rewards, each
  tool turn rendered as the AgentLoop renders the calculator's text result (the recorded turns replayed through the
  loop against the text server). Rewards are sample index mod 2, so that every row is trained. The weights and the
  optimizer state are restored after each update, so every rollout and update starts from the same policy.
- **image path**: seconds spent checking and decoding tool images (`mcp_client.decode_image`), turning them into
  pixels and mRoPE positions (`VisionProcessor._processed`, `hf_vision.prepare`, `PixelRows.build`; nested calls
  counted once) and in the vision tower's forward (generation and update) and backward (update), measured by wrapping
  those functions and hooking the tower (bench/multimodal_clock.py); `image_path_share_of_step` = those seconds /
  (image rollout wall + image update seconds).
A VL batch runs every row whole (algorithms/pixels.py), a text batch shares each prompt's forward pass across its
group (`algorithm.shared_prompt_forward`): `update_s_ratio_whole_rows` compares the image update with the text
twins' run whole too, which separates what the pictures cost from what losing the shared prompt costs.
Medians over rounds after a warm-up round (not counted); each ratio (image / text: > 1 means images cost more) is
the median of its rounds' ratios.
Left out: the vLLM engine (it takes no VL policy yet), prompt images (a task's own pictures: the same path), rewards
(synthetic, see above), and the verl engine.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # scripted_model: the stand-in policy when the quickstart's VL model is missing
sys.path.insert(0, str(REPO / "bench"))
from multimodal_clock import instrument
from rollout import RoutedTools

log = logging.getLogger("bench.multimodal")
DEFAULT_MODEL = REPO / "models" / "quickstart-vision"
PICTURE_TOOL, TEXT_TOOL = "calculator_picture", "calculator"
SCRIPTED_CALL = '<tool_call>{"name": "calculator_picture","arguments":{"expression":"1"}}</tool_call>'
"""What the scripted stand-in emits every turn (no token repeats, so its chain cannot branch); the expression is
replaced by the task's."""


# ------------------------------------------------------------------------------------------------ setup
def load_recipe(model: Path | None, overrides: list[str] | None = None) -> tuple[Any, str]:
    """The recipe the benchmark runs (model, rollout and algorithm settings) and what the model is."""
    from rlfactory.recipe.schema import Recipe

    base = REPO / "recipes" / "quickstart_vision.yaml"
    base = base if base.exists() else REPO / "recipes" / "quickstart.yaml"
    sets = [f"tools.mcp_configs=[{REPO / 'mcp_configs' / 'vision.json'}, {REPO / 'mcp_configs' / 'default.json'}]",
            "tools.servers=[digits_image, calculator]", "tools.cache={backend: none}", "trainer.torch_threads=1",
            f"model.path={model if model is not None else 'tiny-random-vl'}", "model.dtype=float32",
            "model.lora.enabled=false"]
    if model is None:  # Qwen's tokenizer spells the prompt and the tool schemas in more tokens than the quickstart's
        sets += ["rollout.max_context_tokens=2048", "rollout.max_response_tokens=512"]
    name = str(model) if model is not None else "tiny-random-vl (scripted)"
    return Recipe.from_yaml(base, sets + list(overrides or [])), name


def scripted_policy(policy: Any, chat: Any) -> Any:
    """`policy` (tiny-random-vl) with the scripted VL model's weights and a fresh optimizer over them."""
    import torch
    from scripted_model import build_scripted_qwen3_vl

    ids = policy.tokenizer.encode(SCRIPTED_CALL + "<|im_end|>", add_special_tokens=False)
    if len(set(ids)) != len(ids):
        raise SystemExit(f"the scripted call {SCRIPTED_CALL!r} repeats a token; the scripted policy would branch")
    model = build_scripted_qwen3_vl(policy.tokenizer, [(SCRIPTED_CALL + "<|im_end|>", 1.0)],
                                    start_token_ids=[chat.generation_prompt_ids[-1]], junk_prob=1e-9)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = policy.recipe.algorithm.optimizer
    optimizer = torch.optim.AdamW(params, lr=policy.recipe.algorithm.learning_rate, betas=tuple(opt.betas),
                                  weight_decay=opt.weight_decay, eps=opt.eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1.0)
    return dataclasses.replace(policy, model=model.to(policy.device), params=params, optimizer=optimizer,
                               scheduler=scheduler, reference=None)


def router(variant: str, tasks_by_id: dict[str, dict[str, Any]], scripted: bool) -> Callable[[Any], Any]:
    """How a call the policy emitted is sent: to the picture tool (`image`) or its text twin (`text`); the scripted
    stand-in's expression is replaced by its task's."""

    def route(call: Any) -> Any:
        args = dict(call.arguments or {})
        if scripted:  # call ids: "<task id>@<index>/<sample>#<turn>.<k>"
            args = {"expression": tasks_by_id[call.id.split("@")[0]]["expression"]}
        if variant == "text" and call.name in (PICTURE_TOOL, "render_digits"):
            args = {"expression": args.get("expression", args.get("text", ""))}
            return call.model_copy(update={"name": TEXT_TOOL, "arguments": args})
        return call.model_copy(update={"arguments": args})

    return route


class CallRouter(RoutedTools):
    """The ToolManager with each call rewritten by `route(call)`."""

    def __init__(self, manager: Any, route: Callable[[Any], Any]):
        super().__init__(manager, lambda _call_id: (None, {}))
        self.route_call = route

    async def call_many(self, calls: list[Any]) -> list[Any]:
        return await self.manager.call_many([self.route_call(c) for c in calls])


class Replay:
    """Answers each request with the policy tokens (and logprobs) a recorded trajectory generated in that turn, so
    the AgentLoop re-renders the trajectory's tool turns from another server's results: the text twins."""

    policy_version = 0

    def __init__(self, trajectories: list[Any]):
        self.turns = {t.id: [(t.response_ids[s.start:s.end], t.logprobs[s.start:s.end])
                             for s in t.turns if s.role == "assistant"] for t in trajectories}

    async def generate(self, prompt_ids: list[int], sampling: Any, request_id: str | None = None,
                       **_: Any) -> Any:
        from rlfactory.rollout.engines.protocol import GenerationOutput

        trajectory, _, turn = (request_id or "").rpartition("#")
        turns = self.turns.get(trajectory, [])
        if int(turn) >= len(turns):
            return GenerationOutput(token_ids=[], logprobs=[], finish_reason="length")
        ids, lps = turns[int(turn)]
        ids, lps = ids[:sampling.max_new_tokens], lps[:sampling.max_new_tokens]
        return GenerationOutput(token_ids=ids, logprobs=lps,
                                finish_reason="stop" if ids and ids[-1] in sampling.stop_token_ids else "length")

    async def update_weights(self, state_dict: Any) -> None:
        return None

    async def close(self) -> None:
        return None


# ------------------------------------------------------------------------------------------------ measuring
async def rollout(policy: Any, chat: Any, tools: Any, tasks: list[dict], samples: int, seed: int
                  ) -> tuple[list[Any], dict[str, float]]:
    """One rollout on a fresh HF engine: its trajectories and figures."""
    from rlfactory.models.loading import pad_id_of
    from rlfactory.rollout.agent_loop import AgentLoop
    from rlfactory.rollout.engines.hf import HFEngine

    r = policy.recipe
    engine = HFEngine(policy.model, pad_token_id=pad_id_of(policy.tokenizer), eos_token_ids=chat.stop_token_ids,
                      max_batch_size=64, device=policy.device, tokenizer=policy.tokenizer,
                      prefix_cache=r.rollout.prefix_cache, vision=chat.vision)
    try:
        t0 = time.perf_counter()
        trajs, metrics = await AgentLoop(engine, tools, chat, r.rollout).run_batch(tasks, samples_per_prompt=samples,
                                                                                   seed=seed)
        wall_s = time.perf_counter() - t0
    finally:
        await engine.close()
    st = engine.stats
    if not st.generated_tokens:
        raise SystemExit(f"the rollout generated no tokens ({trajs[0].finish_reason}, {trajs[0].error}): when it is "
                         f"context_length, the prompt is over rollout.max_context_tokens "
                         f"({r.rollout.max_context_tokens}); raise it with --set rollout.max_context_tokens=N")
    return trajs, {"rollout_s": wall_s, "engine_busy_s": st.busy_s, "generated_tokens": st.generated_tokens,
                   "generation_tokens_per_s": st.generated_tokens / st.busy_s if st.busy_s else 0.0,
                   "rollout_tokens_per_s": st.generated_tokens / wall_s,
                   "prefill_tokens": st.prefill_tokens, "tool_calls": metrics.get("tools/calls", 0.0),
                   "tool_errors": metrics.get("tools/errors", 0.0),
                   "images": sum(len(t.images) for t in trajs),
                   "image_tokens": sum(im.tokens for t in trajs for im in t.images),
                   "response_tokens": sum(len(t.response_ids) for t in trajs)}


async def text_twins(trajs: list[Any], chat: Any, tools: Any, recipe: Any, tasks: list[dict], samples: int,
                     seed: int) -> list[Any]:
    """The trajectories again with each tool turn rendered from the text server's result."""
    from rlfactory.rollout.agent_loop import AgentLoop

    twins, _ = await AgentLoop(Replay(trajs), tools, chat, recipe.rollout).run_batch(tasks, samples_per_prompt=samples,
                                                                                      seed=seed)
    return twins


def timed_update(update: Any, trajs: list[Any], weights: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """`Update.whole_batch` on `trajs` (rewards: sample index mod 2), then the weights and optimizer state as before."""
    for t in trajs:
        t.reward = float(t.sample_index % 2)
    t0 = time.perf_counter()
    metrics = update.whole_batch(trajs)
    seconds = time.perf_counter() - t0
    policy = update.policy
    policy.model.load_state_dict(weights)
    policy.optimizer.state.clear()
    return seconds, metrics


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def measure(model: Path | None, prompts: int, samples: int, rounds: int, seed: int = 0,
                  warmup: int = 1, overrides: list[str] | None = None) -> dict[str, Any]:
    import torch

    from rlfactory.rollout.chat import ChatFormat
    from rlfactory.tools.manager import ToolManager
    from rlfactory.trainer.policy import Policy
    from rlfactory.trainer.update import Update

    torch.set_num_threads(1)
    recipe, model_name = load_recipe(model, overrides)
    scripted = model is None
    policy = Policy.load(recipe)
    rows = [json.loads(line) for line in Path(recipe.data.train_file).read_text().splitlines() if line.strip()]
    needed = prompts * (warmup + rounds)
    if len(rows) < needed:
        raise SystemExit(f"{recipe.data.train_file} has {len(rows)} tasks; {needed} are needed")
    for row in rows:  # "What is 361 * 220?" -> the scripted stand-in's expression "361 * 220"
        row["expression"] = row.get("prompt", "").removeprefix("What is ").rstrip("?") or "1"
    async with ToolManager.from_recipe(recipe.tools) as manager:
        schemas = [s.to_openai() for s in manager.specs if s.server == "digits_image"]
        chat = ChatFormat.for_rollout(policy.tokenizer, schemas, recipe.rollout)
        if chat.vision is None:
            raise SystemExit(f"{model_name} is not a vision-language policy (its tokenizer has no image processor)")
        if scripted:
            policy = scripted_policy(policy, chat)
        update = Update(policy)
        # A VL batch runs every row whole (algorithms/pixels.py); the text twins again with that too, so the ratio
        # splits what the images cost from what losing the shared prompt forward costs.
        algo = recipe.algorithm.model_copy(update={"shared_prompt_forward": False})
        whole_rows = Update(dataclasses.replace(policy, recipe=recipe.model_copy(update={"algorithm": algo})))
        weights = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
        clock = instrument(policy.model)
        runs: dict[str, list[dict[str, float]]] = defaultdict(list)
        try:
            for rnd in range(warmup + rounds):  # warm-up rounds: first forward passes, server code paths
                tasks = rows[rnd * prompts:(rnd + 1) * prompts]
                by_id = {str(t["id"]): t for t in tasks}
                tools = {v: CallRouter(manager, router(v, by_id, scripted)) for v in ("image", "text")}
                order = ("image", "text") if rnd % 2 == 0 else ("text", "image")
                trajs: dict[str, list[Any]] = {}
                figures: dict[str, dict[str, float]] = {}
                for variant in order:
                    before = clock.snapshot()
                    trajs[variant], figures[variant] = await rollout(policy, chat, tools[variant], tasks, samples,
                                                                     seed + rnd)
                    figures[variant].update({f"rollout_{k}": v for k, v in clock.since(before).items()})
                twins = await text_twins(trajs["image"], chat, tools["text"], recipe, tasks, samples, seed + rnd)
                same = all(sum(a.loss_mask) == sum(b.loss_mask) for a, b in zip(trajs["image"], twins))
                batches = {"image": trajs["image"], "text": twins}
                for variant in order:
                    before = clock.snapshot()
                    seconds, m = timed_update(update, batches[variant], weights)
                    figures[variant].update(update_s=seconds, update_rows_trained=m["rollout/rows_with_signal"],
                                            **{f"update_{k}": v for k, v in clock.since(before).items()})
                if recipe.algorithm.shared_prompt_forward:
                    figures["text"]["update_whole_rows_s"] = timed_update(whole_rows, twins, weights)[0]
                figures["image"]["twins_policy_tokens_equal"] = float(same)
                figures["image"]["update_tokens"] = sum(len(t.prompt_ids) + len(t.response_ids)
                                                        for t in trajs["image"])
                figures["text"]["update_tokens"] = sum(len(t.prompt_ids) + len(t.response_ids) for t in twins)
                log.info("round %d: %s", rnd, {v: {k: round(x, 3) for k, x in f.items()} for v, f in figures.items()})
                if rnd >= warmup:
                    for variant in order:
                        runs[variant].append(figures[variant])
        finally:
            clock.close()
    return summarise(runs, model_name, prompts, samples, rounds)


def summarise(runs: dict[str, list[dict[str, float]]], model_name: str, prompts: int, samples: int,
              rounds: int) -> dict[str, Any]:
    """Medians over rounds; each ratio is the median of its rounds' ratios (the two sides of a round ran next to
    each other, so a load spike on this shared machine hits both)."""
    med = {v: {k: _median([r.get(k, 0.0) for r in rs]) for k in sorted({k for r in rs for k in r})}
           for v, rs in runs.items()}
    img, txt = med["image"], med["text"]
    pairs = list(zip(runs["image"], runs["text"]))

    def ratio(image_key: str, text_key: str | None = None) -> float:
        return round(_median([i[image_key] / t.get(text_key or image_key, t[image_key]) for i, t in pairs]), 3)

    path_keys = [f"{phase}_{k}" for phase in ("rollout", "update") for k in (
        "tool_decode_s", "pixel_processing_s", "vision_tower_forward_s", "vision_tower_backward_s")]
    for r in runs["image"] + runs["text"]:
        r["step_s"] = r["rollout_s"] + r["update_s"]
        r["image_path_s"] = sum(r.get(k, 0.0) for k in path_keys)
    if not img.get("images"):
        log.warning("warning: the policy called no picture tool, so no image reached it: the two sides differ in "
                    "nothing but noise (a random model never emits a call; use the quickstart's VL model)")
    return {
        "model": model_name, "prompts": prompts, "samples": samples, "rounds": rounds,
        "image_generation_tokens_per_s": round(img["generation_tokens_per_s"], 1),
        "text_generation_tokens_per_s": round(txt["generation_tokens_per_s"], 1),
        "generation_tokens_per_s_ratio": ratio("generation_tokens_per_s"),
        "image_rollout_tokens_per_s": round(img["rollout_tokens_per_s"], 1),
        "text_rollout_tokens_per_s": round(txt["rollout_tokens_per_s"], 1),
        "rollout_tokens_per_s_ratio": ratio("rollout_tokens_per_s"),
        "image_update_s": round(img["update_s"], 3), "text_update_s": round(txt["update_s"], 3),
        "update_s_ratio": ratio("update_s"),
        "text_update_whole_rows_s": round(txt.get("update_whole_rows_s", txt["update_s"]), 3),
        "update_s_ratio_whole_rows": ratio("update_s", "update_whole_rows_s"),
        "image_step_s": round(_median([r["step_s"] for r in runs["image"]]), 3),
        "text_step_s": round(_median([r["step_s"] for r in runs["text"]]), 3),
        "step_s_ratio": ratio("step_s"),
        "image_path_s": round(_median([r["image_path_s"] for r in runs["image"]]), 3),
        "image_path_share_of_step": round(_median([r["image_path_s"] / r["step_s"] for r in runs["image"]]), 4),
        "image_path_s_by_part": {k: round(img.get(k, 0.0), 4) for k in path_keys},
        "images_per_step": img["images"], "image_tokens_per_step": img["image_tokens"],
        "twins_policy_tokens_equal": bool(img.get("twins_policy_tokens_equal")),
        "image": {k: round(v, 4) for k, v in img.items()}, "text": {k: round(v, 4) for k, v in txt.items()},
        "per_round": {v: [{k: round(x, 4) for k, x in r.items()} for r in rs] for v, rs in runs.items()},
        "cpu_count": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def run(model: Path | None = DEFAULT_MODEL, prompts: int = 4, samples: int = 2, rounds: int = 3,
        quick: bool = False, seed: int = 0, overrides: list[str] | None = None) -> dict[str, Any]:
    """The whole benchmark (quick: 2 prompts x 2 samples, 1 round, no warm-up). `model`: a VL model folder;
    None, or a folder that does not exist, runs the scripted tiny-random-vl. `overrides`: recipe `a.b=c` settings."""
    warmup = 1
    if quick:
        prompts, samples, rounds, warmup = 2, 2, 1, 0
    if model is not None and not Path(model).is_dir():
        log.warning("note: %s does not exist (make it with `rlfactory sft recipes/quickstart_vision_sft.yaml`); "
                    "using tiny-random-vl with scripted weights", model)
        model = None
    return asyncio.run(measure(model, prompts, samples, rounds, seed, warmup, overrides))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the figures to this JSON file")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a Qwen-VL model folder")
    p.add_argument("--prompts", type=int, default=4, help="tasks per round (a step's prompts)")
    # A VL batch's update holds whole [N, T, V] logits: 8 rows of the stand-in (Qwen's 151,936 words) are ~2 GB a copy.
    p.add_argument("--samples", type=int, default=2, help="samples per task")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (after one warm-up round)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="A.B=C", help="a recipe override (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="2 prompts x 2 samples, 1 round, no warm-up (a smoke run, not figures)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "transformers", "mcp", "rlfactory"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    figures = run(args.model, args.prompts, args.samples, args.rounds, args.quick, args.seed, args.set)
    text = json.dumps(figures, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    print(f"{figures['model']}: generation image/text {figures['generation_tokens_per_s_ratio']}, update image/text "
          f"{figures['update_s_ratio']}, step image/text {figures['step_s_ratio']}, image path "
          f"{100 * figures['image_path_share_of_step']:.1f} % of a step")


if __name__ == "__main__":
    main()
