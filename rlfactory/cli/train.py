"""CLI: `rlfactory validate`, `train`, `eval`, `report`.

Every command validates the recipe first and starts nothing when it is invalid. Heavy libraries (torch,
transformers, verl) are imported inside the commands. The work itself lives in `rlfactory.api` (train and eval, the
same code path as the Python API) and `rlfactory.train.report`.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from rlfactory.cli.common import RECIPE_HELP, SET_HELP, check_or_fail, console, err_console, fail, recipe_file
from rlfactory.errors import RLFactoryError

if TYPE_CHECKING:  # type names only: the recipe module loads inside the commands
    from rlfactory.recipe.schema import Recipe


def validate_cmd(
    recipe: Path = typer.Argument(..., help=RECIPE_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Check a recipe (fields, arithmetic, files, reward functions) and report every problem at once."""
    from rlfactory.preflight import check_recipe  # here, not at the top: keeps `rlfactory --help` fast

    recipe = recipe_file(recipe)
    check = check_recipe(recipe, set_)
    for w in check.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
    if not check.ok:
        for e in check.errors:
            err_console.print(f"[bold red]error:[/bold red] {escape(e)}", highlight=False, soft_wrap=True)
        n = len(check.errors)
        err_console.print(f"{recipe}: {n} problem{'s' if n > 1 else ''}", highlight=False)
        raise typer.Exit(1)
    r = check.recipe
    console.print(
        f"[green]ok[/green] {recipe}: {r.name} — engine {r.engine}, {r.trainer.total_steps} steps x "
        f"{r.trainer.prompts_per_step} prompts x {r.rollout.samples_per_prompt} samples, "
        f"{len(r.tools.mcp_configs)} mcp config(s), {len(r.rewards.functions)} reward function(s)"
        + (f", {len(check.warnings)} warning(s)" if check.warnings else ""),
        highlight=False, soft_wrap=True,
    )


def train_cmd(
    recipe: Path = typer.Argument(..., help=RECIPE_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Run folder (overrides trainer.output_dir)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the run folder."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in the run folder (its "
                                   "metrics, transcripts and checkpoints are deleted)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="local | verl (overrides the recipe's engine)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="verl: build and check the verl config, start nothing."),
) -> None:
    """Train a policy with GRPO as the recipe says."""
    overrides = list(set_)
    if engine is not None:
        if engine not in ("local", "verl"):
            fail(f"--engine {engine!r}: use local or verl")
        overrides.append(f"engine={engine}")
    if output_dir is not None:
        overrides.append(f"trainer.output_dir={json.dumps(str(output_dir.resolve()))}")  # JSON is YAML: any path
    r = check_or_fail(recipe, overrides, for_training=not (dry_run or engine == "verl"))
    if dry_run:
        _verl(r, dry_run=True, resume=resume)
        return
    from rlfactory.report.run_folder import lock_run_folder, refuse_to_replace

    with contextlib.ExitStack() as held:
        try:
            # One run per folder from here to the end, before the heavy imports (run_dir.py): a second run is
            # refused, naming this one; the engines take the same lock again (re-entrant).
            held.enter_context(lock_run_folder(r.trainer.output_dir))
            refuse_to_replace(r.trainer.output_dir, resume=resume, overwrite=overwrite)
        except RLFactoryError as e:
            fail(str(e))
        if r.engine == "verl":
            _verl(r, dry_run=False, resume=resume)
            return
        from rlfactory.api import train as run_train  # here, not at the top: keeps `rlfactory --help` fast

        try:
            summary = run_train(r, resume=resume, progress=True, overwrite=overwrite)
        except RLFactoryError as e:
            fail(str(e))
    _print_done(summary)
    if summary.get("stopped_by") == "SIGTERM":
        console.print(f"stopped by SIGTERM after step {summary.get('steps')} with a checkpoint; continue with the same "
                      f"command and --resume", highlight=False, soft_wrap=True)
        raise SystemExit(143)  # 128 + SIGTERM, as a job killed by it would report


def _print_done(summary: dict) -> None:
    console.print(
        f"[bold]done[/bold] {summary.get('steps', 0)} steps in {summary.get('wall_s', 0):.0f}s — reward first-5 "
        f"{summary.get('reward_first5', float('nan')):.3f}, last-5 {summary.get('reward_last5', float('nan')):.3f}, "
        f"rise {summary.get('reward_rise', float('nan')):+.3f}; run folder {summary.get('output_dir')}",
        highlight=False, soft_wrap=True,
    )


def _verl(recipe: Recipe, *, dry_run: bool, resume: bool) -> None:
    from rlfactory.verl.launch import run_verl  # here, not at the top: keeps `rlfactory --help` fast

    try:
        summary = run_verl(recipe, dry_run=dry_run, resume=resume)
    except RLFactoryError as e:
        fail(str(e))
    for w in (summary or {}).get("warnings", []):
        err_console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
    if summary and not summary.get("launched"):
        console.print(f"[green]ok[/green] verl config checked against verl's schema: {summary['config']} "
                      f"(overrides in {summary['overrides']}, {summary['train_rows']} training rows); nothing "
                      f"was started", highlight=False, soft_wrap=True)
    elif summary:
        _print_done(summary)


def eval_cmd(
    recipe: Path = typer.Argument(..., help=RECIPE_HELP + " Its data.val_file is evaluated."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="A checkpoint folder or HF model folder "
                                              "(default: the recipe's model)."),
    k: Optional[int] = typer.Option(None, "--k", help="Samples per task for pass@k (default: "
                                    "trainer.eval_samples_per_prompt)."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Where results and transcripts go "
                                              "(default: <trainer.output_dir>/eval)."),
) -> None:
    """Mean reward and pass@k on the validation set; transcripts saved."""
    overrides = list(set_)
    if k is not None:
        overrides.append(f"trainer.eval_samples_per_prompt={k}")
        if k > 1:
            overrides.append("trainer.eval_temperature=1.0")
    r = check_or_fail(recipe, overrides, for_training=checkpoint is None)
    if not r.data.val_file:
        fail(f"{recipe}: data.val_file is empty; add a validation file (or pass --set data.val_file=PATH)")
    from rlfactory.api import evaluate  # here, not at the top: keeps `rlfactory --help` fast

    try:
        res = evaluate(r, checkpoint=checkpoint, output_dir=output_dir)
    except RLFactoryError as e:
        fail(str(e))
    kk = res["k"]
    console.print(f"eval on {res['tasks']} tasks: mean reward {res['reward/mean']:.4f}, pass@1 {res['pass@1']:.4f}"
                  + (f", pass@{kk} {res[f'pass@{kk}']:.4f}" if kk > 1 else "")
                  + f"; results in {res['output_dir']}", highlight=False, soft_wrap=True)


def report_cmd(output_dir: Path = typer.Argument(..., help="A run folder written by `rlfactory train`.")) -> None:
    """Regenerate the reward-curve PNG, the dashboard's charts as PNGs and the transcript viewer of a run folder."""
    from rlfactory.report.run_report import write_report  # here, not at the top: keeps `rlfactory --help` fast

    try:
        files = write_report(output_dir, charts=True)
    except RLFactoryError as e:
        fail(str(e))
    for f in files:
        console.print(f"wrote {f}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)
    app.command("train")(train_cmd)
    app.command("eval")(eval_cmd)
    app.command("report")(report_cmd)
