"""CLI for environments: `envs tasks` (task rows, optionally read off a running AgentGym server) and `envs doctor`
(one episode end to end on each environment server of a config)."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from rlfactory.cli.common import console, fail, run_async
from rlfactory.errors import RLFactoryError

envs_app = typer.Typer(help="Environment task rows and end-to-end checks of environment servers.",
                       no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(envs_app, name="envs")


def _ids(text: str) -> list[int]:
    """`START:STOP` (a range) or `1,5,9`."""
    try:
        if ":" in text:
            start, stop = text.split(":", 1)
            return list(range(int(start), int(stop)))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--ids {text!r}: write START:STOP (e.g. 0:544) or a comma list (e.g. 1,5,9)")


@envs_app.command("tasks")
def tasks(
    env: str = typer.Option(..., "--env", help="textcraft, babyai, sciworld, deepsearch, webarena or web."),
    out: Path = typer.Option(..., "--out", help="JSONL file to write the rows to."),
    ids: str = typer.Option("0:100", "--ids", help="Task ids: START:STOP or a comma list."),
    task_set: str = typer.Option("rlfactory", "--task-set",
                                 help="rlfactory (our servers' own tasks) or agentgym (AgentGym's ids, neutral "
                                      "prompts; TextCraft and BabyAI)."),
    server: Optional[str] = typer.Option(None, "--server", help="URL of a running AgentGym-protocol server: read "
                                         "each task's goal off its reset observation and name it in the prompt "
                                         "(implies --task-set agentgym)."),
    server_name: Optional[str] = typer.Option(None, "--server-name",
                                              help="mcpServers name the rows open their episode on (default: ENV)."),
    goals_out: Optional[Path] = typer.Option(None, "--goals-out", help="With --server: also write the goals by "
                                             "task id as JSON (TextCraft: our server's --goal-order file)."),
) -> None:
    """Write task rows (`{id, prompt, answer: null, env: {server, task_id}}`) for a recipe's data section."""
    from rlfactory.envs.tasks import PROMPTS, server_goals, task_rows

    if env not in PROMPTS:
        fail(f"--env {env!r}: use one of {', '.join(PROMPTS)}")
    wanted = _ids(ids)
    goals = None
    if server is not None:
        task_set = "agentgym"
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per reset would bury the answer
        try:
            goals = server_goals(env, server, wanted)
        except (ValueError, RLFactoryError) as e:
            fail(str(e))
    elif goals_out is not None:
        fail("--goals-out needs --server (the goals are read off the server)")
    try:
        rows = task_rows(env, wanted, task_set, server=server_name, goals=goals)
    except ValueError as e:
        fail(f"--task-set: {e}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if goals_out is not None and goals is not None:
        if wanted != list(range(len(wanted))):
            console.print("[yellow]note:[/yellow] --ids does not start at 0 or has gaps; the goals file lists the "
                          "goals in --ids order", highlight=False)
        goals_out.write_text(json.dumps({"about": f"goals by task id as {server} states them", "server": server,
                                         "goals": [goals[i] for i in wanted]}, indent=1) + "\n")
    console.print(f"wrote {len(rows)} {env} rows ({task_set} task set) to {out}"
                  + (f" and the goals to {goals_out}" if goals_out else ""), highlight=False)


@envs_app.command("doctor")
def doctor(
    configs: Optional[List[Path]] = typer.Argument(
        None, help="mcpServers JSON files (default: mcp_configs/envs.json)."),
    config_opts: Optional[List[Path]] = typer.Option(None, "--config", "-c", help="An mcpServers JSON file."),
    servers: Optional[List[str]] = typer.Option(None, "--server", "-s", help="Check only this server (repeatable)."),
    task_id: int = typer.Option(0, "--task-id", help="The task to reset."),
    action: Optional[str] = typer.Option(None, "--action", help="The step to play (default: one that ends nothing, "
                                         "e.g. `inventory`, `check available actions`)."),
) -> None:
    """Play one episode (health, reset, step, observe, close) on each environment server; exit 1 if any stage
    fails. For the AgentGym bridge this checks the AgentGym server behind it end to end."""
    from rlfactory.envs.doctor import run_doctor

    reports = run_async(run_doctor([*(configs or []), *(config_opts or [])], servers, task_id, action))
    for report in reports:
        mark = "[green]ok[/green]" if report.ok else "[red]failed[/red]"
        console.print(f"[bold]{report.server}[/bold] {mark}", highlight=False)
        for stage in report.stages:
            sign = "[green]✓[/green]" if stage.ok else "[red]✗[/red]"
            first = escape(stage.detail.replace("\n", " | ")[:320])
            console.print(f"  {sign} {escape(stage.name)} {stage.latency_s * 1e3:.0f} ms  {first}", highlight=False)
    bad = [r.server for r in reports if not r.ok]
    if bad:
        fail(f"environment check failed: {', '.join(bad)}")
