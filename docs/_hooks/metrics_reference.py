"""The metrics reference page, generated when the site is built from the registry the code checks every row against
(rlfactory/report/metric_names.py), then the charts of the dashboard and `rlfactory report` from their one list
(rlfactory/report/charts.py). Left out: summary.json and the eval/*.json files (the run-folder page covers them).
"""
from __future__ import annotations

NAMESPACES = {
    "step": "The row's own keys",
    "reward": "`reward/`: the reward functions",
    "rollout": "`rollout/`: the step's trajectories",
    "data": "`data/`: the tasks drawn",
    "credit": "`credit/`: credit per turn",
    "tools": "`tools/`: tool calls",
    "loss": "`loss/`: the update",
    "perf": "`perf/` and `time/`: stage times and throughput",
    "time": None,  # with perf/
    "eval": "`eval/`: evaluation during training",
    "async": "`async/`: asynchronous training",
    "off_policy": "`off_policy/`: the correction of stale tokens",
}
"""Section titles of rlfactory's own namespaces, in page order (verl's own names come last, in one section)."""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", r"\|")


def _written(m) -> str:
    from rlfactory.report.metric_names import ENGINE_TITLES

    if not m.when:
        return "every step"
    if m.when_on is None:
        return _cell(m.when)
    others = [ENGINE_TITLES[e] for e in m.engines if e not in m.when_on]
    return _cell(f"{', '.join(ENGINE_TITLES[e] for e in m.when_on)}: {m.when}; {', '.join(others)}: every step")


def _engines(m) -> str:
    from rlfactory.report.metric_names import ENGINE_TITLES, ENGINES

    if set(m.engines) == set(ENGINES):
        return "all"
    if set(m.engines) == {"sync", "async"}:
        return "local"
    return ", ".join(ENGINE_TITLES[e] for e in m.engines)


def _table(metrics) -> list[str]:
    # in a div of its own, so that the page's stylesheet keeps names on one line (docs/stylesheets/metrics.css)
    lines = ['<div class="metric-table" markdown>', "",
             "| name | meaning | unit | engines | written |", "|---|---|---|---|---|"]
    for m in metrics:
        lines.append(f"| `{m.name}` | {_cell(m.meaning)} | {m.unit} | {_engines(m)} | {_written(m)} |")
    return lines + ["", "</div>", ""]


def _charts() -> list[str]:
    from rlfactory.report.charts import SECTIONS

    lines = ["## What the dashboard charts", "",
             "`rlfactory dashboard` and `rlfactory report` draw these, from their one list (`rlfactory/report/charts.py`).",
             "A chart plots the first of its keys that a run logs, so one chart covers both engines' names (the local",
             "engine's `loss/*`, verl's `actor/*`); a pattern chart draws every key that matches, one series each.", ""]
    for section in SECTIONS:
        lines += [f"### {section['title']}", ""]
        if section.get("only_if"):
            lines += [f"Shown for runs that log keys matching `{section['only_if']}`.", ""]
        lines += ["| chart | keys |", "|---|---|"]
        lines += [f"| {title} | {', '.join(f'`{k}`' for k in keys)} |" for _, title, keys in section["charts"]]
        lines += [f"| {title} | keys matching `{rx}` |" for _, title, rx in section["multi"]]
        lines.append("")
    return lines


def render() -> str:
    from rlfactory.report.metric_names import LOCAL_METRICS, VERL_METRICS

    lines = [
        "# Metrics",
        "",
        "Every key a run writes to `metrics.jsonl` (one object per step, mirrored to TensorBoard and the trackers of",
        "`trainer.loggers`), read when the site is built from the registry in `rlfactory/report/metric_names.py`. The",
        "code checks every row against it: a key the registry lacks is logged as a warning when the row is written,",
        "and a test runs short real runs (synchronous, asynchronous, branched groups with credit per turn, evaluation)",
        "and fails on a key missing here or an entry no run writes.",
        "",
        "- **engines**: *local sync* is the local engine's synchronous loop (`trainer.max_staleness_steps: 0`),",
        "  *local async* its asynchronous loop (k >= 1), *local* both, *verl* the verl engine's run folder, *all*",
        "  the three.",
        "- **written**: *every step* means every trained step's row; otherwise the circumstance it needs.",
        "- **names**: `<x>` in a name stands for one path segment (a reward function's or a server's name),",
        "  `<x...>` for the rest of the key; an exact name wins over a pattern.",
        "- On verl, a step whose trajectories were not recorded has only verl's own names.",
        "",
    ]
    groups: dict[str, list] = {}
    for m in LOCAL_METRICS:
        groups.setdefault("perf" if m.namespace == "time" else m.namespace, []).append(m)
    unknown = sorted(set(groups) - set(NAMESPACES))
    if unknown:
        raise ValueError(f"docs/_hooks/metrics_reference.py: give the namespaces {unknown} a title in NAMESPACES")
    for namespace, title in NAMESPACES.items():
        if title and namespace in groups:
            lines += [f"## {title}", ""] + _table(groups[namespace])
    lines += ["## verl's own names", "",
              "verl's trainer logs these under its own names; the run folder keeps them in each row beside rlfactory's",
              "(`rlfactory/verl/run_folder.py`), and copies the main ones under the local engine's names too (`loss/pg`",
              "is `actor/pg_loss`, `perf/step_s` is `timing_s/step`, ...: the tables above say which). What verl logs",
              "depends on its configuration; [verl's documentation](https://verl.readthedocs.io/) has the details.", ""]
    lines += _table(VERL_METRICS)
    return "\n".join(lines + _charts())


if __name__ == "__main__":
    print(render())
