"""CLI: `rlfactory sft RECIPE` (supervised warm-up) and `rlfactory demos RECIPE` (demonstrations through real tools)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlfactory.cli.common import console, fail, recipe_file, run_async
from rlfactory.errors import ConfigError


def _load(recipe: Path, overrides: list[str] | None, require_sft: bool) -> tuple[Any, Any]:
    from rlfactory.warmup.run import load_sft_recipe  # here, not at the top: keeps `rlfactory --help` fast

    try:
        return load_sft_recipe(recipe_file(recipe), overrides or [], require_sft=require_sft)
    except ConfigError as e:
        fail(str(e))


def sft_cmd(
    recipe: Path = typer.Argument(..., help="A recipe with an `sft:` section, e.g. recipes/quickstart_sft.yaml."),
    overrides: Optional[list[str]] = typer.Option(None, "--set", help="Override a field: dotted.key=value (repeat)."),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Model folder to write (sft.output_dir)."),
    check_only: bool = typer.Option(False, "--check-only",
                                    help="Only run the usable-start check on the model folder already written."),
) -> None:
    """Supervised warm-up on demonstrations made through the recipe's real tools; writes an HF model folder."""
    from rlfactory.warmup.run import check_saved, run_sft  # here, not at the top: keeps `rlfactory --help` fast

    extra = list(overrides or []) + ([f"sft.output_dir={output_dir.resolve()}"] if output_dir else [])
    r, sft = _load(recipe, extra, require_sft=True)
    progress = Progress(TextColumn("[bold]sft[/bold] step {task.completed}/{task.total}"), BarColumn(),
                        TextColumn("loss {task.fields[loss]:.3f}  phase {task.fields[phase]}"), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=console, transient=False)
    demos = Progress(TextColumn("[bold]demos[/bold] {task.fields[name]} {task.completed}/{task.total} episodes, "
                                "{task.fields[kept]} kept"), BarColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                     console=console, transient=True)
    bar: dict[str, Any] = {}

    def on_event(kind: str, info: dict[str, Any]) -> None:
        if kind == "demo_episode":  # an environment demonstrator's episodes as they end: a bar (a line per tenth)
            if "demos" not in bar:
                bar["demos"] = demos.add_task("demos", total=info["total"], name=info["name"], kept=0)
                demos.start()
            demos.update(bar["demos"], completed=info["played"], kept=info["kept"])
            if not console.is_terminal and info["played"] * 10 // info["total"] > \
                    (info["played"] - 1) * 10 // info["total"]:
                console.print(f"demos {info['name']}: {info['played']}/{info['total']} episodes, {info['kept']} kept")
            return
        if "demos" in bar:  # the set is made
            demos.stop()
            bar.pop("demos")
        if kind == "demos" and "tool" in info:
            console.print(f"demos [bold]{info['name']}[/bold]: {info['tool']} through the tool, {info['direct']} "
                          f"direct, {info['tool_errors'] + info['wrong_results']} dropped ({info['seconds']:.1f} s)")
        elif kind == "demos":  # an environment demonstrator: kept per style, dropped per reason
            kept = ", ".join(f"{v:.0f} {k}" for k, v in info.items() if k not in ("name", "seconds")
                             and not k.startswith("dropped_"))
            dropped = ", ".join(f"{v:.0f} {k[8:]}" for k, v in info.items() if k.startswith("dropped_"))
            console.print(f"demos [bold]{info['name']}[/bold]: kept {kept or 'none'}; dropped {dropped or 'none'} "
                          f"({info['seconds']:.1f} s)")
        elif kind == "model":
            console.print(f"model: {info['parameters'] / 1e6:.2f} M parameters, vocab {info['vocab']}, prompt "
                          f"{info['prompt_tokens']:.0f} tokens, transcripts {info['transcript_tokens_mean']:.0f} "
                          f"tokens on average")
            progress.start()
            bar["id"] = progress.add_task("sft", total=info["steps"], loss=float("nan"), phase=0)
        elif kind == "step":
            progress.update(bar["id"], completed=info["step"], loss=info["loss"], phase=info["phase"])
            if not console.is_terminal and info["step"] % 100 == 0:  # a log file gets a line now and then
                console.print(f"step {info['step']}: loss {info['loss']:.3f} (phase {info['phase']})")
        elif kind == "saved":
            progress.stop()
            console.print(f"saved [bold]{info['path']}[/bold]")
        elif kind == "check":
            verdict = "[green]usable start for GRPO[/green]" if info["usable"] else \
                f"[red]NOT a usable start[/red] ({'; '.join(info['problems'])}): train longer or change sft.seed"
            if "success" in info:
                split = "training" if info.get("split") == "train" else "validation"
                console.print(f"check on {info['trajectories']} {split} tasks through the real environment: "
                              f"success {info['success']:.2f}, {info['turns_mean']:.1f} turns per episode, "
                              f"well-formed calls {info['well_formed']:.2f} -> {verdict}", highlight=False)
                return
            console.print(f"check on {info['trajectories']} validation tasks through the real tools: call rate "
                          f"{info['call_rate']:.2f}, call accuracy {info['call_accuracy']:.2f}, copy accuracy "
                          f"{info['copy_accuracy']:.2f}, reward {info['reward']:.2f} -> {verdict}", highlight=False)

    if check_only:
        summary = run_async(check_saved(r, sft, on_event))
        if summary["check"] and not summary["check"]["usable"]:
            raise typer.Exit(2)
        return
    try:
        summary = run_async(run_sft(r, sft, on_event))
    finally:
        progress.stop()
    console.print(f"done in {summary['total_s']:.0f} s ({summary['steps']} steps, {summary['train_s']:.0f} s "
                  f"training); loss {summary['loss_first']:.2f} -> {summary['loss_last']:.3f}")
    if summary["check"] and not summary["check"]["usable"]:
        raise typer.Exit(2)


def demos_cmd(
    recipe: Path = typer.Argument(..., help="A recipe whose tools (tools.mcp_configs) and tasks (data) to use."),
    out: Path = typer.Option(..., "--out", help="JSONL file to write, one transcript per line."),
    n: int = typer.Option(100, "--n", min=1, help="Demonstrations to write (the first N training tasks)."),
    direct_fraction: float = typer.Option(0.0, "--direct-fraction", min=0.0, max=1.0,
                                          help="Share answered directly instead of through the tool."),
    seed: int = typer.Option(0, "--seed", help="Seed for which tasks answer directly."),
    overrides: Optional[list[str]] = typer.Option(None, "--set", help="Override a field: dotted.key=value (repeat)."),
) -> None:
    """Write demonstrations made by a scripted policy through the recipe's REAL tools (calculator tasks)."""
    from rlfactory.data.tasks import load_tasks  # here, not at the top: keeps `rlfactory --help` fast
    from rlfactory.tools.manager import ToolManager
    from rlfactory.warmup.demos import generate_demos, write_jsonl

    r, _ = _load(recipe, overrides, require_sft=False)
    if not r.tools.mcp_configs:
        fail(f"{recipe}: tools.mcp_configs is empty; demonstrations need the tools they call")
    try:
        tasks = load_tasks(r.data.train_file, r.data, limit=n)
    except ConfigError as e:
        fail(str(e))

    async def go() -> dict[str, int]:
        async with ToolManager.from_recipe(r.tools) as manager:
            demos, stats = await generate_demos(tasks, manager, direct_fraction=direct_fraction, seed=seed,
                                                system_prompt=r.rollout.system_prompt)
        write_jsonl(demos, out)
        return stats

    try:
        stats = run_async(go())
    except ValueError as e:  # a task the scripted policy cannot solve
        fail(f"{r.data.train_file}: {e}")
    console.print(f"wrote {stats['tool'] + stats['direct']} demonstrations to {out} ({stats['tool']} through the "
                  f"tool, {stats['direct']} direct; {stats['tool_errors'] + stats['wrong_results']} dropped)")


def register(app: typer.Typer) -> None:
    app.command("sft")(sft_cmd)
    app.command("demos")(demos_cmd)
