"""CLI: `rlfactory rollout RECIPE --limit N --out FILE.jsonl [--html FILE.html]` — rollouts without training.

Runs the recipe's policy, tools and rewards on the first N tasks exactly as a training step would (same AgentLoop,
same engine, same reward functions), writes one Trajectory per JSONL line, and optionally the HTML transcript viewer.
The stack is built by `rlfactory.rollout_side` (shared with training); this module only drives it.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.table import Table

from rlfactory.cli.common import RECIPE_HELP, SET_HELP, check_or_fail, console, fail, run_async

if TYPE_CHECKING:  # type names only: the recipe module loads inside the commands
    from rlfactory.recipe.schema import Recipe


def rollout_cmd(
    recipe: Path = typer.Argument(..., help=RECIPE_HELP),
    out: Path = typer.Option(..., "--out", help="Write trajectories here, one JSON object per line."),
    limit: int = typer.Option(8, "--limit", min=1, help="Use the first N tasks of the split."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the HTML transcript viewer here."),
    split: str = typer.Option("train", "--split", help="Which tasks: train (data.train_file) or val (data.val_file)."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1,
                                          help="Trajectories per task (default: rollout.samples_per_prompt)."),
    step: int = typer.Option(0, "--step", min=0, help="Training step whose horizon to use (scaling_inter)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (default: trainer.seed)."),
    no_rewards: bool = typer.Option(False, "--no-rewards", help="Skip the reward functions."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Run rollouts with the recipe's policy, tools and rewards (no training) and save the trajectories."""
    if split not in ("train", "val"):
        fail(f"--split {split!r}: use train or val")
    r = check_or_fail(recipe, list(set_), for_training=False)
    path = r.data.train_file if split == "train" else r.data.val_file
    if not path:
        fail(f"{recipe}: --split val needs data.val_file in the recipe")
    if samples is not None:
        try:
            r.rollout.branching.roots(samples, of=f"--samples {samples}")
        except ValueError as e:
            fail(f"{recipe}: {e}")
    summary = run_async(_run(r, Path(path), out, html, limit=limit, samples=samples, step=step,
                             seed=r.trainer.seed if seed is None else seed, rewards=not no_rewards))
    _print_summary(summary, out, html)


async def _run(r: Recipe, tasks_path: Path, out: Path, html: Path | None, *, limit: int, samples: int | None,
               step: int, seed: int, rewards: bool) -> dict[str, Any]:
    import torch  # here, not at the top: keeps `rlfactory --help` fast

    from rlfactory.data.tasks import load_tasks
    from rlfactory.models.devices import resolve_device
    from rlfactory.models.loading import load_policy, load_tokenizer
    from rlfactory.report.transcript_images import bounded
    from rlfactory.report.transcripts import transcript_line
    from rlfactory.report.viewer import write_html
    from rlfactory.rollout.horizon import horizon_for_step
    from rlfactory.rollout_side import open_rollout_side

    torch.set_num_threads(r.trainer.torch_threads)
    tasks = load_tasks(tasks_path, r.data, limit=limit)
    device = resolve_device(r.trainer.device)
    tokenizer = load_tokenizer(r)
    model = load_policy(r, device)
    horizon = horizon_for_step(r.rollout.horizon, step)
    with tempfile.TemporaryDirectory(prefix="rlfactory-rollout-") as scratch:  # the embedded tool cache's file
        async with open_rollout_side(r, model, tokenizer, device, scratch) as side:
            trajs, metrics = await side.loop.run_batch(tasks, samples_per_prompt=samples, horizon=horizon, seed=seed,
                                                       branching=True)
            if rewards and r.rewards.functions:
                metrics.update(await side.rewards.score(trajs))
    out.parent.mkdir(parents=True, exist_ok=True)
    # the rows a run's transcripts hold (images bounded the same way), and the viewer drawn from them
    cap = r.trainer.log.transcript_image_bytes
    trajs = [bounded(t, cap) for t in trajs]
    with out.open("w") as f:
        for t in trajs:
            f.write(transcript_line(t, cap) + "\n")  # bounding is idempotent under one cap
    if html is not None:
        write_html(trajs, html, title=f"{r.name}: {len(trajs)} rollouts (step {step}, horizon {horizon})",
                   tokenizer=tokenizer)
    return {"tasks": len(tasks), "trajectories": len(trajs), "horizon": horizon, "metrics": metrics}


def _print_summary(summary: dict[str, Any], out: Path, html: Path | None) -> None:
    m = summary["metrics"]
    table = Table(title=f"{summary['trajectories']} trajectories from {summary['tasks']} tasks "
                        f"(horizon {summary['horizon']})", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    shown = ["rollout/num_turns_mean", "rollout/response_tokens_mean", "rollout/tool_calls_mean",
             "rollout/tool_call_errors", "rollout/errors", "rollout/infra_failed", "tools/cache_hit_rate",
             "reward/mean"]
    shown += sorted(k for k in m if k.startswith("rollout/finish_") and m[k])
    shown += sorted(k for k in m if k.startswith("reward/") and k not in shown)
    for key in shown:
        if key in m:
            value = m[key]
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print(f"wrote {out}" + (f" and {html}" if html else ""), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout_cmd)
