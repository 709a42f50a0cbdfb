"""MkDocs hook: the pages generated when the site is built, so that they cannot drift from what they describe.

- `reference/recipe.md`: every recipe field, from the pydantic models (recipe_reference.py);
- `reference/cli.md`: every command and option, from the `rlfactory` command (cli_reference.py);
- `reference/metrics.md`: every metric a run writes, from the registry the code checks rows against
  (rlfactory/report/metric_names.py), and what the dashboard charts (rlfactory/report/charts.py): metrics_reference.py;
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
import metrics_reference
import recipe_reference


def benchmarks_page() -> str:
    text = (REPO / "bench" / "README.md").read_text()
    head, _, rest = text.partition("\n")
    note = ("!!! note \"This page is `bench/README.md`\"\n    Copied from the repository when the site is built. Each "
            "benchmark is a script under `bench/`; run it as shown, or all of them with `make bench`.\n")
    return f"{head} in detail\n\n{note}\n{rest}".replace("](../docs/", "](../")


def on_files(files: Files, config) -> Files:
    pages = {
        "reference/recipe.md": recipe_reference.render(),
        "reference/cli.md": cli_reference.render(),
        "reference/metrics.md": metrics_reference.render(),
        "benchmarks/measurements.md": benchmarks_page(),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
