"""Recipe -> verl config: every recipe in recipes/ translates and passes verl's own schema checks (validate_config,
omega_conf_to_dataclass), the meaningful fields round-trip into verl's keys and units, errors name recipe fields, and
`rlfactory train --engine verl --dry-run` writes the run folder a verl launch reads. No GPU, nothing started."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def _fit_gpus(recipe) -> list[str]:
    """CPU smoke recipes keep tiny batches: give them as many GPUs (<= 8) as their batch splits over."""
    from rlfactory.verl.config import recipe_problems

    if not any("GPUs" in p for p in recipe_problems(recipe)):
        return []
    n = recipe.trainer.prompts_per_step // recipe.algorithm.mini_batches_per_step * recipe.rollout.samples_per_prompt
    gpus = max(g for g in range(1, 9) if n % g == 0)
    return [f"verl.gpus_per_node={gpus}", "verl.nnodes=1", "verl.tensor_parallel_size=1"]


@pytest.fixture(scope="module")
def translated(tmp_path_factory):
    """{recipe name: (Recipe, VerlPrepared, extra overrides used)} for every recipe file."""
    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import prepare

    out = {}
    for path in RECIPES:
        # the GPU translation (a CPU run's settings are checked in test_verl_cpu_training.py)
        base = ["engine=verl", "verl.device=cuda", f"trainer.output_dir={tmp_path_factory.mktemp(path.stem)}"]
        recipe = Recipe.from_yaml(path, base)
        extra = _fit_gpus(recipe)
        if extra:
            recipe = Recipe.from_yaml(path, base + extra)
        out[path.stem] = (recipe, prepare(recipe), extra)
    return out


def test_every_recipe_translates_and_passes_verls_schema(translated):
    from verl.utils.config import omega_conf_to_dataclass

    assert len(translated) == len(RECIPES) >= 2
    for name, (recipe, prep, extra) in translated.items():
        cfg = prep.config
        assert cfg.algorithm.adv_estimator == "grpo", name
        # the sections verl turns into dataclasses load (validate() already ran them once)
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        assert rollout.agent.default_agent_loop == "rlfactory_agent"
        assert prep.files.config_yaml.is_file() and prep.files.overrides_txt.is_file()
        if not extra:  # a recipe sized for a cluster needs no adjustment
            assert cfg.trainer.n_gpus_per_node == recipe.verl.gpus_per_node, name


def test_fields_round_trip_in_verls_units(translated):
    from omegaconf import OmegaConf
    from pydantic import TypeAdapter

    from rlfactory.recipe.rollout import HorizonConfig
    from rlfactory.rollout.horizon import horizon_for_step

    for name, (r, prep, _) in translated.items():
        cfg = prep.config
        actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
        n = r.rollout.samples_per_prompt
        assert rollout.n == n, name
        assert cfg.data.train_batch_size == r.trainer.prompts_per_step  # PROMPTS per step
        assert actor.ppo_mini_batch_size == r.trainer.prompts_per_step // r.algorithm.mini_batches_per_step
        per_gpu = actor.ppo_mini_batch_size * n // (r.verl.nnodes * r.verl.gpus_per_node)  # TRAJECTORIES per GPU
        assert actor.ppo_micro_batch_size_per_gpu == min(r.algorithm.micro_batch_size, per_gpu)
        assert per_gpu % actor.ppo_micro_batch_size_per_gpu == 0
        assert cfg.data.max_response_length == rollout.response_length == r.rollout.max_response_tokens
        assert cfg.data.max_prompt_length + cfg.data.max_response_length == r.rollout.max_context_tokens
        assert rollout.max_model_len == r.rollout.max_context_tokens
        assert math.isclose(actor.optim.lr, r.algorithm.learning_rate)
        assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (
            r.algorithm.clip_ratio_low, r.algorithm.clip_ratio_high, r.algorithm.clip_ratio_c)
        assert actor.loss_agg_mode == r.algorithm.loss_agg_mode
        assert actor.use_kl_loss == (r.algorithm.kl.use_reference and r.algorithm.kl.coef > 0)
        assert actor.kl_loss_type == r.algorithm.kl.type and math.isclose(actor.kl_loss_coef, r.algorithm.kl.coef)
        assert cfg.algorithm.norm_adv_by_std_in_grpo == r.algorithm.norm_adv_by_std
        assert rollout.temperature == r.rollout.sampling.temperature
        assert rollout.tensor_model_parallel_size == r.verl.tensor_parallel_size
        assert cfg.trainer.total_training_steps == r.trainer.total_steps
        # enough epochs for the steps (verl drops each epoch's last partial batch)
        assert cfg.trainer.total_epochs * (prep.train_rows // r.trainer.prompts_per_step) >= r.trainer.total_steps
        custom = cfg.actor_rollout_ref.rollout.custom.rlfactory
        back = TypeAdapter(HorizonConfig).validate_python(OmegaConf.to_container(custom.horizon))
        assert back == r.rollout.horizon, name
        for step in (0, 1, 10_000):
            assert horizon_for_step(back, step) == horizon_for_step(r.rollout.horizon, step)
        assert Path(custom.recipe).is_file() and cfg.reward.custom_reward_function.path.startswith("pkg://")


def test_kl_and_multi_gpu_settings_round_trip(tmp_path):
    from verl.trainer.ppo.utils import need_reference_policy

    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import prepare

    r = Recipe.from_yaml(REPO / "recipes" / "qwen3_1_7b_calculator.yaml", [
        "engine=verl", f"trainer.output_dir={tmp_path}", "algorithm.kl.use_reference=true", "algorithm.kl.coef=0.01",
        "verl.nnodes=2", "verl.gpus_per_node=4", "verl.tensor_parallel_size=2", "algorithm.learning_rate=3e-6",
        "rollout.horizon={type: scaling_inter, horizons: [2, 4, 8], interval_steps: 50}",
        "verl.extra_overrides=[actor_rollout_ref.actor.fsdp_config.param_offload=true]"])
    cfg = prepare(r).config
    assert need_reference_policy(cfg) and cfg.actor_rollout_ref.actor.use_kl_loss
    assert cfg.actor_rollout_ref.actor.kl_loss_coef == 0.01 and cfg.actor_rollout_ref.actor.optim.lr == 3e-6
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 4)
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload is True  # extra_overrides win
    assert list(cfg.actor_rollout_ref.rollout.custom.rlfactory.horizon.horizons) == [2, 4, 8]


@pytest.mark.parametrize("override,field", [
    ("verl.gpus_per_node=3", "trainer.prompts_per_step"),
    ("verl.tensor_parallel_size=3", "verl.tensor_parallel_size"),
    ("rollout.max_context_tokens=200", "rollout.max_context_tokens"),
    ("verl.extra_overrides=[actor_rollout_ref.actor.no_such_key=1]", "verl.extra_overrides"),
])
def test_errors_name_the_recipe_field(tmp_path, override, field):
    from rlfactory.errors import ConfigError
    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import prepare

    r = Recipe.from_yaml(REPO / "recipes" / "quickstart.yaml",
                         ["engine=verl", "verl.device=cuda", f"trainer.output_dir={tmp_path}", override])
    with pytest.raises(ConfigError) as e:
        prepare(r)
    assert field in str(e.value)


def test_cli_dry_run_writes_what_verl_reads(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "rlfactory.cli", "train", str(REPO / "recipes" / "quickstart.yaml"),
                           "--engine", "verl", "--dry-run", "--output-dir", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checked against verl's schema" in proc.stdout
    cfg = yaml.safe_load((out / "verl_config.yaml").read_text())
    assert cfg["actor_rollout_ref"]["rollout"]["n"] == 8 and cfg["data"]["train_batch_size"] == 8
    loops = yaml.safe_load((out / "agent_loop.yaml").read_text())
    assert loops[0]["_target_"] == "rlfactory.verl.agent_loop.RLFactoryAgentLoop"
    assert Path(loops[0]["recipe_path"]).is_file()
    rows = pq.read_table(out / "data" / "train.parquet").to_pylist()
    assert len(rows) == 2000
    first = rows[0]
    assert first["prompt"] == [{"role": "user", "content": "What is 361 * 220?"}]
    assert first["reward_model"]["ground_truth"] == "79420" and first["agent_name"] == "rlfactory_agent"
    assert first["extra_info"]["index"] == 0 and '"answer": "79420"' in first["extra_info"]["task_json"]


def test_a_cuda_run_without_a_gpu_stops_clearly(tmp_path):
    """`verl.device: cuda` on a machine without CUDA (or without vLLM) is refused before Ray starts, saying what is
    missing and how to run anyway."""
    import torch

    from rlfactory.errors import RLFactoryError
    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import run_verl

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = Recipe.from_yaml(REPO / "recipes" / "quickstart.yaml",
                         ["engine=verl", "verl.device=cuda", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(RLFactoryError) as e:
        run_verl(r, dry_run=False)
    msg = str(e.value)
    assert "no GPU is visible" in msg and "verl.device=cpu" in msg or "vLLM is not installed" in msg
    assert (tmp_path / "verl_config.yaml").is_file()  # the run folder was prepared and checked first
    assert not (tmp_path / "metrics.jsonl").exists()  # and nothing ran


def test_transfer_queue_storage_fits_a_small_local_ray(translated):
    """verl's v1 trainer starts 8 TransferQueue storage units of one logical CPU each; on a local Ray with few
    cores they would wait for CPUs forever, so launch() caps them at a quarter of the cores (at least 1)."""
    import copy

    from rlfactory.verl.launch import fit_transfer_queue

    _, prep, _ = next(iter(translated.values()))
    assert prep.config.trainer.use_v1  # verl's default trainer is kept
    units = prep.config.transfer_queue.backend.SimpleStorage.num_data_storage_units
    assert units == 8
    for cpus, want in ((2, 1), (8, 2), (16, 4), (64, None), (128, None)):
        cfg = copy.deepcopy(prep.config)
        assert fit_transfer_queue(cfg, cpus) == want, cpus
        assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == (want or units)


def test_v1_trainer_is_used_when_transfer_queue_is_installed(translated):
    import copy

    from verl.trainer import main_ppo

    from rlfactory.verl.launch import task_runner_class

    pytest.importorskip("transfer_queue")
    cfg = copy.deepcopy(next(iter(translated.values()))[1].config)
    assert task_runner_class(cfg) is main_ppo.TaskRunnerV1 and cfg.trainer.use_v1


def test_a_dry_run_never_writes_over_a_run(tmp_path):
    """`--dry-run` into a folder that holds a run refuses before writing (the run's recipe and config stay the ones
    that made its metrics); `--resume` may check there; a folder a live run holds is refused naming the holder."""
    import multiprocessing

    from rlfactory.errors import RLFactoryError
    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import run_verl

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "recipe.yaml").write_text("# the recipe that made metrics.jsonl\n")
    r = Recipe.from_yaml(REPO / "recipes" / "quickstart.yaml", ["engine=verl", f"trainer.output_dir={run}"])
    with pytest.raises(RLFactoryError) as e:
        run_verl(r, dry_run=True)
    assert "already holds a run (metrics.jsonl)" in str(e.value) and "--output-dir" in str(e.value)
    assert (run / "recipe.yaml").read_text() == "# the recipe that made metrics.jsonl\n"
    assert not (run / "verl_config.yaml").exists()
    assert run_verl(r, dry_run=True, resume=True)["launched"] is False  # resume's check writes what resume would

    fresh = tmp_path / "fresh"
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_run_folder, args=(str(fresh), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        fr = Recipe.from_yaml(REPO / "recipes" / "quickstart.yaml", ["engine=verl", f"trainer.output_dir={fresh}"])
        with pytest.raises(RLFactoryError) as e:
            run_verl(fr, dry_run=True)
        assert str(holder.pid) in str(e.value)
        assert not (fresh / "verl_config.yaml").exists()
    finally:
        release.set()
        holder.join(30)


def _hold_run_folder(folder: str, ready, release) -> None:
    from rlfactory.report.run_folder import lock_run_folder

    with lock_run_folder(folder):
        ready.set()
        release.wait(60)
