"""MkDocs hook: the pages generated when the site is built, so that they cannot drift from what they describe.

- `reference/recipe.md`: every recipe field, from the pydantic models (recipe_reference.py);
- `reference/cli.md`: every command and option, from the `rlfactory` command (cli_reference.py);
- `reference/metrics.md`: the metrics the dashboard and `rlfactory report` chart, from their one list
  (rlfactory/report/charts.py);
- `benchmarks/measurements.md`: bench/README.md as it is, its links to docs/ re-pointed at the site's pages.
The Python API page uses mkdocstrings, which reads the docstrings itself.
"""
from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import cli_reference  # (after the sys.path line above)
import recipe_reference


def benchmarks_page() -> str:
    text = (REPO / "bench" / "README.md").read_text()
    head, _, rest = text.partition("\n")
    note = ("!!! note \"This page is `bench/README.md`\"\n    Copied from the repository when the site is built. Each "
            "benchmark is a script under `bench/`; run it as shown, or all of them with `make bench`.\n")
    return f"{head} in detail\n\n{note}\n{rest}".replace("](../docs/", "](../")


def metrics_page() -> str:
    from rlfactory.report.charts import SECTIONS

    lines = ["# Metrics charted", "",
             "The metrics of `metrics.jsonl` that `rlfactory dashboard` and `rlfactory report` draw, read when the site is",
             "built from the one list both use (`rlfactory/report/charts.py`). A chart plots the first of its keys that a",
             "run logs, so one chart covers both engines' names (the local engine's `loss/*`, verl's `actor/*`); a",
             "pattern chart draws every key that matches, one series each. A run logs more than these: every row also",
             "has the rest of `reward/*`, `rollout/*`, `tools/*`, `loss/*` and `perf/*` ([the run",
             "folder](../concepts/run-folder.md)).", ""]
    for section in SECTIONS:
        lines += [f"## {section['title']}", ""]
        if section.get("only_if"):
            lines += [f"Shown for runs that log keys matching `{section['only_if']}`.", ""]
        lines += ["| chart | keys |", "|---|---|"]
        lines += [f"| {title} | {', '.join(f'`{k}`' for k in keys)} |" for _, title, keys in section["charts"]]
        lines += [f"| {title} | keys matching `{rx}` |" for _, title, rx in section["multi"]]
        lines.append("")
    return "\n".join(lines)


def on_files(files: Files, config) -> Files:
    pages = {
        "reference/recipe.md": recipe_reference.render(),
        "reference/cli.md": cli_reference.render(),
        "reference/metrics.md": metrics_page(),
        "benchmarks/measurements.md": benchmarks_page(),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
