"""`rlfactory sft RECIPE` end to end: demonstrations through the real tools, tokenizer, model, phases, save, check.

The recipe is an ordinary training recipe (model, data, tools, rollout) plus an `sft:` section (`SFTConfig`). The
warm-up writes an HF model folder that a GRPO recipe can start from (`model.path`), and before finishing it rolls
the model out through the real tools on validation tasks and says whether it is a usable start for GRPO.

It trains on the CPU or one GPU (`sft.device`). Left out: distributed SFT (this is a warm-up for small models; large
models come warm from their authors), and packing several transcripts into one sequence.
"""
from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import torch
from pydantic import ValidationError

from rlfactory.data.tasks import read_rows
from rlfactory.errors import ConfigError
from rlfactory.models.devices import resolve_device
from rlfactory.models.folder import read_model_config
from rlfactory.models.loading import build_tiny_random, is_tiny_random, load_model, load_tokenizer
from rlfactory.models.tiny import build_tiny_qwen3, build_tiny_qwen3_vl
from rlfactory.models.vision import attach_vision, tiny_vision_processor, vision_of
from rlfactory.recipe.files import apply_overrides, load_yaml_mapping
from rlfactory.recipe.messages import format_validation_errors
from rlfactory.recipe.schema import Recipe, _abs
from rlfactory.recipe.sft import DemoSetConfig, SFTConfig, SFTPhase
from rlfactory.rollout.chat import ChatFormat
from rlfactory.rollout.horizon import max_horizon
from rlfactory.tools.manager import ToolManager
from rlfactory.warmup.check import check_tasks_file, usable_start_check
from rlfactory.warmup.demos import calculator_policy, generate_demos, make_arithmetic_tasks, write_jsonl
from rlfactory.warmup.env_demos import ENV_POLICIES, generate_env_demos
from rlfactory.warmup.sft import encode_example, policy_turns, save_model, train_phases
from rlfactory.warmup.tokenizer_builder import build_tokenizer, check_tokenizer

logger = logging.getLogger(__name__)

ProgressFn = Callable[[str, dict[str, Any]], None]
"""Called with an event name (`demos`, `tokenizer`, `model`, `step`, `check`, `saved`) and its figures."""


def load_sft_recipe(path: str | Path, overrides: list[str] | None = None, *, require_sft: bool = True
                    ) -> tuple[Any, SFTConfig | None]:
    """The recipe and its `sft:` section, validated; every problem reported at once with dotted field paths.

    Relative paths of the section (`output_dir`, `tasks_file`, phase `data` files) are resolved against the recipe's
    folder, like the rest of the recipe. With `require_sft=False` a recipe without the section gives (recipe, None)."""


    path = Path(path)
    raw = apply_overrides(load_yaml_mapping(path), overrides or [], source=str(path))
    section = raw.get("sft")
    if section is None and require_sft:
        raise ConfigError("no `sft:` section: add one (see recipes/quickstart_sft.yaml) to use `rlfactory sft`",
                          file=str(path))
    problems: list[str] = []
    sft = None
    if section is not None:
        try:
            sft = SFTConfig.model_validate(section)
        except ValidationError as e:
            problems += [f"sft.{p}" for p in format_validation_errors(e, SFTConfig)]
    rest = {k: v for k, v in raw.items() if k != "sft" or "sft" in Recipe.model_fields}
    try:
        recipe = Recipe.from_dict(rest, base_dir=path.resolve().parent, source=str(path))
    except ConfigError as e:
        problems += [p for p in e.problems if not p.startswith("sft")]
        recipe = None
    if problems or recipe is None:
        raise ConfigError(problems[0] if len(problems) == 1 else f"{len(problems)} problems in the recipe:",
                          file=str(path), problems=problems)
    if sft is None:
        return recipe, None
    base = path.resolve().parent

    def resolve(p: str) -> str:
        return _abs(p, base)  # the recipe's own rule: relative to its folder, or a pkg:// file

    sft.output_dir = resolve(sft.output_dir)
    for d in sft.demos:
        if d.tasks_file:
            d.tasks_file = resolve(d.tasks_file)
        for key in ("mcp_configs", "server_args"):
            if getattr(d, key) and d.policy == "calculator":
                raise ConfigError(f"sft.demos ({d.name}).{key}: only environment demonstrators play through "
                                  "their own servers; remove it", file=str(path))
        if d.mcp_configs:
            d.mcp_configs = [resolve(c) for c in d.mcp_configs]
    names = {d.name for d in sft.demos}
    for phase in sft.phases:
        resolved = [n if n in names else resolve(n) for n in phase.sources]
        phase.data = resolved[0] if isinstance(phase.data, str) else resolved
    return recipe, sft


async def make_demo_sets(recipe: Recipe, sft: SFTConfig, out_dir: Path, progress: ProgressFn | None = None
                         ) -> dict[str, list[dict[str, Any]]]:
    """Generate every demo set of the recipe through its real tools; each is also written to `out_dir/NAME.jsonl`."""
    sets: dict[str, list[dict[str, Any]]] = {}
    if not sft.demos:
        return sets
    if not recipe.tools.mcp_configs:
        raise ConfigError("sft.demos need tools: set tools.mcp_configs to the servers the demonstrations call",
                          file=recipe.source)
    async with ToolManager.from_recipe(recipe.tools) as shared:
        for d in sft.demos:
            tools = d.tools_for(recipe.tools)
            if tools is recipe.tools:
                sets[d.name] = await _make_demo_set(recipe, d, shared, out_dir, progress)
            else:  # other settings, same server names: the same tools shown; its servers stop when it is made
                async with ToolManager.from_recipe(tools) as own:
                    sets[d.name] = await _make_demo_set(recipe, d, own, out_dir, progress)
    return sets


async def _make_demo_set(recipe: Recipe, d: DemoSetConfig, manager: ToolManager, out_dir: Path,
                         progress: ProgressFn | None) -> list[dict[str, Any]]:
    """One demo set through `manager`'s tools, written to `out_dir/NAME.jsonl`."""
    t0 = time.perf_counter()
    tasks = read_rows(d.tasks_file)[: d.n] if d.tasks_file else make_arithmetic_tasks(
        d.n, seed=d.seed, digits=d.digits, id_prefix=f"demo-{d.name}")
    if d.policy == "calculator":
        demos, stats = await generate_demos(tasks, manager, direct_fraction=d.direct_fraction, seed=d.seed,
                                            policy=functools.partial(calculator_policy, tool_name=d.tool),
                                            system_prompt=recipe.rollout.system_prompt)
    else:
        if len(tasks) < d.n:  # an environment's task file is finite: go round it again
            tasks = [tasks[i % len(tasks)] for i in range(d.n)]
        max_turns = d.max_turns or max_horizon(recipe.rollout.horizon)
        try:
            demos, stats = await generate_env_demos(
                tasks, manager, policy=d.policy, styles=d.styles or {ENV_POLICIES[d.policy][0]: 1.0},
                max_turns=max_turns, seed=d.seed, system_prompt=recipe.rollout.system_prompt,
                on_episode=(lambda played, kept: progress("demo_episode", {"name": d.name, "played": played,
                                                                            "kept": kept, "total": len(tasks)}))
                if progress else None)
        except ValueError as e:
            raise ConfigError(f"sft.demos ({d.name}): {e}", file=recipe.source) from e
        if not demos:
            raise ConfigError(f"sft.demos ({d.name}): the {d.policy} demonstrator solved none of its "
                              f"{len(tasks)} tasks within {max_turns} turns ({stats}); raise max_turns or "
                              f"change the tasks", file=recipe.source)
    write_jsonl(demos, out_dir / f"{d.name}.jsonl")
    if progress:
        progress("demos", {"name": d.name, **stats, "seconds": time.perf_counter() - t0})
    return demos


def _build_model(recipe: Recipe, sft: SFTConfig, tokenizer: Any) -> Any:
    """The model to train, in float32 on the CPU (`run_sft` moves it to `sft.device`)."""
    if sft.init == "model" and is_tiny_random(recipe):
        model = build_tiny_random(recipe, "float32", "cpu")
    elif sft.init == "model":
        model = load_model(recipe.model.path, dtype="float32", device="cpu")
    else:
        s = sft.scratch_model
        shape = dict(hidden_size=s.hidden_size, num_layers=s.num_hidden_layers, heads=s.num_attention_heads,
                     kv_heads=s.num_key_value_heads, head_dim=s.head_dim, intermediate_size=s.intermediate_size,
                     max_position_embeddings=s.max_position_embeddings)
        if s.vision is None:
            model = build_tiny_qwen3(len(tokenizer), seed=sft.seed, tie_word_embeddings=True, **shape)
        else:
            model = build_tiny_qwen3_vl(len(tokenizer), seed=sft.seed, vision_hidden_size=s.vision.hidden_size,
                                        vision_depth=s.vision.depth, vision_heads=s.vision.num_heads, **shape)
            vision = vision_of(tokenizer)
            assert vision is not None  # run_sft attaches the processor to a VL scratch tokenizer
            model.config.image_token_id = vision.image_token_id
            model.config.vision_start_token_id = vision.vision_start_id
            model.config.vision_end_token_id = vision.vision_end_id
        # The tokenizer is our own, so its ids (not Qwen's) are the special ones.
        for cfg in (getattr(model.config, "text_config", model.config), model.config, model.generation_config):
            cfg.pad_token_id = tokenizer.pad_token_id
            cfg.eos_token_id = tokenizer.eos_token_id
            cfg.bos_token_id = None
    return model


def phase_examples(phases: list[SFTPhase], encoded: dict[str, list[Any]]) -> list[tuple[SFTPhase, list[Any]]]:
    """Each phase with its examples: those of every demo set or file it names, in one pool, each cut after its first
    `max_turns` policy turns, and its loss kept on its last turn alone (`loss_turns: last`), when the phase says
    so."""
    out = []
    for i, p in enumerate(phases):
        examples = [e for name in p.sources for e in encoded[name]]
        if p.max_turns is not None:
            if any(len(e) > 2 and e[2] for e in examples):
                raise ValueError(f"sft.phases.{i}.max_turns: its transcripts hold images, which a cut would split "
                                 "from their placeholders; remove max_turns from this phase")
            examples = [first_turns(e, p.max_turns) for e in examples]
        if p.loss_turns == "last":
            examples = [last_turn_only(e) for e in examples]
        out.append((p, examples))
    return out


def last_turn_only(example: Any) -> Any:
    """An encoded transcript (ids, mask, ...) whose loss mask keeps only its last policy turn (the last run of mask
    1s); the ids, and so the context the turn is trained in, stay whole."""
    ids, mask = example[0], example[1]
    start, end = (policy_turns(mask) or [(0, 0)])[-1]
    return (ids, [1 if start <= i < end else 0 for i in range(len(mask))], *example[2:])


def first_turns(example: Any, turns: int) -> Any:
    """An encoded transcript (ids, mask, ...) cut right after its `turns`-th policy turn (a run of mask 1s, the turn's
    end token included); whole when it has no more turns than that."""
    spans = policy_turns(example[1])
    if len(spans) < turns:
        return example
    end = spans[turns - 1][1]
    return (example[0][:end], example[1][:end], *example[2:])


def _check_init(recipe: Recipe, sft: SFTConfig) -> None:
    """`init: model` continues the recipe's model: it must be there before any demonstration is played."""
    if sft.init != "model" or is_tiny_random(recipe):
        return
    _, problem = read_model_config(recipe.model.path)
    if problem is not None:
        raise ConfigError(f"sft.init is `model`, so model.path must be a model folder ({problem}): make that model "
                          "first (the recipe's comments name the command), or set sft.init: scratch",
                          file=recipe.source)


async def run_sft(recipe: Recipe, sft: SFTConfig, progress: ProgressFn | None = None) -> dict[str, Any]:
    """The whole warm-up; returns its summary (also written to `<output_dir>/sft_summary.json`)."""
    _check_init(recipe, sft)
    t_start = time.perf_counter()
    torch.set_num_threads(sft.torch_threads)
    torch.manual_seed(sft.seed)
    work = Path(sft.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    sets = await make_demo_sets(recipe, sft, work / "demos", progress)
    phase_data = {n: sets[n] if n in sets else read_rows(n) for p in sft.phases for n in p.sources}

    if sft.init == "scratch":
        tokenizer = build_tokenizer([t for rows in phase_data.values() for t in rows],
                                    vocab_size=sft.tokenizer.vocab_size, min_frequency=sft.tokenizer.min_frequency,
                                    model_max_length=sft.scratch_model.max_position_embeddings,
                                    enable_thinking=recipe.rollout.enable_thinking,
                                    environment_words=sft.tokenizer.environment_words,
                                    bare_words=sft.tokenizer.bare_words, name_space=sft.tokenizer.name_space,
                                    vision=sft.scratch_model.vision is not None)
        problems = check_tokenizer(tokenizer)
        if problems:
            raise RuntimeError("the built tokenizer is unusable: " + "; ".join(problems))
        if sft.scratch_model.vision is not None:
            attach_vision(tokenizer, tiny_vision_processor(tokenizer))
    else:
        # the recipe's tokenizer rules (tokenizer.path, qwen3-offline, tiny-random, the model folder's own)
        tokenizer = load_tokenizer(recipe)
    device = resolve_device(sft.device)
    model = _build_model(recipe, sft, tokenizer).to(device)
    n_params = sum(p.numel() for p in model.parameters())

    # Tools as the policy will see them: from any transcript (demos carry them), else from the servers.
    tools = next((t.get("tools") for rows in phase_data.values() for t in rows if t.get("tools")), None)
    chat = ChatFormat(tokenizer, tools, enable_thinking=recipe.rollout.enable_thinking,
                      system_prompt=recipe.rollout.system_prompt)
    encoded = {name: [encode_example(chat, t["messages"]) for t in rows] for name, rows in phase_data.items()}
    lengths = [len(e[0]) for rows in encoded.values() for e in rows]
    # Prompt length = tokens before the first policy token, averaged over the transcripts.
    prompt_lengths = [e[1].index(1) for rows in encoded.values() for e in rows]
    prompt_tokens = sum(prompt_lengths) / len(prompt_lengths)
    if progress:
        progress("model", {"parameters": n_params, "vocab": len(tokenizer), "prompt_tokens": prompt_tokens,
                           "device": str(device),
                           "transcript_tokens_mean": sum(lengths) / len(lengths),
                           "steps": sum(p.steps for p in sft.phases)})

    t_train = time.perf_counter()
    history = train_phases(
        model, phase_examples(sft.phases, encoded), batch_size=sft.batch_size,
        pad_id=tokenizer.pad_token_id, grad_clip=sft.grad_clip, weight_decay=sft.weight_decay, betas=sft.betas,
        seed=sft.seed, on_step=(lambda row: progress("step", row)) if progress else None,
        vision=vision_of(tokenizer),
    )
    train_s = time.perf_counter() - t_train
    out = save_model(model, tokenizer, sft.output_dir)
    if progress:
        progress("saved", {"path": str(out)})

    summary = {
        "output_dir": str(out), "parameters": n_params, "vocab_size": len(tokenizer), "prompt_tokens": prompt_tokens,
        "steps": len(history), "train_s": train_s, "total_s": time.perf_counter() - t_start,
        "loss_first": history[0]["loss"], "loss_last": sum(r["loss"] for r in history[-20:]) / min(20, len(history)),
        "phases": [p.model_dump() for p in sft.phases], "torch_threads": sft.torch_threads, "seed": sft.seed,
        "device": str(device),
        "check": {}, "made_by": f"rlfactory sft {_shown(recipe.source)}",
    }
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(work / "sft_history.jsonl", "w") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")
    summary["check"] = await check_model(recipe, sft, model, tokenizer, progress)
    summary["total_s"] = time.perf_counter() - t_start
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _shown(source: str | None) -> str:
    """The recipe path as a user would type it: relative to the working folder when inside it."""
    if not source:
        return "RECIPE"
    try:
        return str(Path(source).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(source)


async def check_model(recipe: Recipe, sft: SFTConfig, model: Any = None, tokenizer: Any = None,
                      progress: ProgressFn | None = None) -> dict[str, Any]:
    """The usable-start check (rollouts through the real tools); loads `sft.output_dir` when no model is given.
    Empty when `sft.check.tasks` is 0 or the recipe has no validation file."""
    if not (sft.check.tasks and check_tasks_file(recipe, sft.check)):
        return {}
    if model is None:
        model = load_model(sft.output_dir, dtype="float32", device=resolve_device(sft.device))
        tokenizer = load_tokenizer(recipe, model_path=sft.output_dir)  # a VL folder: with its image processor
    async with ToolManager.from_recipe(recipe.tools) as manager:
        tool = next((d.tool for d in sft.demos if d.policy == "calculator"), "calculator")
        check = await usable_start_check(recipe, sft.check, model, tokenizer, manager, seed=sft.seed, tool_name=tool)
    if progress:
        progress("check", check)
    return check


async def check_saved(recipe: Recipe, sft: SFTConfig, progress: ProgressFn | None = None) -> dict[str, Any]:
    """`rlfactory sft RECIPE --check-only`: check the model folder the recipe wrote, record it in its summary."""
    torch.set_num_threads(sft.torch_threads)
    out = Path(sft.output_dir)
    if not (out / "config.json").exists():
        raise ConfigError(f"sft.output_dir: {out} holds no model yet; run `rlfactory sft` without --check-only first",
                          file=recipe.source)
    check = await check_model(recipe, sft, progress=progress)
    path = out / "sft_summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {"output_dir": str(out)}
    summary["check"] = check
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary
