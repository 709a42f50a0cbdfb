"""The tutorials' command blocks, run as written: each block a page marks `<!-- runnable -->` runs in a fresh folder,
page after page of a chapter in the same folder, as a reader would type them.

A marked ```bash block is run line by line in one shell (`set -e`: the first command that fails fails the test); a
marked block with `title="PATH"` is written to PATH (the file the page tells the reader to write). A marker may
shorten a command for the CPU: `<!-- runnable: train += --set trainer.total_steps=1 -->` appends those arguments to
each `rlfactory train` line of its block. The pages say so where they use it. The README's example recipe, a short
version of the tutorial's, is validated in the tutorial's project."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# Pages run in order in one folder; every page with a runnable block must be in one of these.
CHAPTERS = {"your-tool-and-recipe": ["getting-started/your-tool.md", "getting-started/your-recipe.md"]}
BLOCK = re.compile(r"<!-- runnable(?::\s*(?P<cmd>[\w-]+) \+= (?P<extra>[^>]*?))?\s*-->\n"
                   r"```(?P<lang>\w+)(?P<attrs>[^\n]*)\n(?P<body>.*?)\n```", re.DOTALL)


def _code_end(line: str) -> int:
    """Where a shell line's code ends: the index of an unquoted ` #` comment, else the line's length."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return len(line)


def script(page: str) -> list[str]:
    """The shell lines a page's runnable blocks make, in page order."""
    out: list[str] = []
    for m in BLOCK.finditer((DOCS / page).read_text()):
        title = re.search(r'title="([^"]+)"', m["attrs"])
        if title:
            out += [f"mkdir -p \"$(dirname '{title[1]}')\"", f"cat > '{title[1]}' <<'RLFACTORY_DOC_EOF'", m["body"],
                    "RLFACTORY_DOC_EOF"]
            continue
        assert m["lang"] == "bash", f"{page}: a runnable ```{m['lang']} block needs title=\"PATH\""
        for line in m["body"].replace("\\\n", " ").splitlines():
            end = _code_end(line)
            code = line[:end].rstrip()
            if m["cmd"] and re.match(rf"rlfactory {re.escape(m['cmd'])}\b", code):
                code += " " + m["extra"].strip()
            if code:
                out += [f"echo '+ {code.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'", code]
    return out


def test_every_page_with_runnable_blocks_is_in_a_chapter():
    marked = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "<!-- runnable" in p.read_text())
    listed = sorted(page for pages in CHAPTERS.values() for page in pages)
    assert marked == listed, f"runnable pages {marked} vs chapters {listed}: add the page to CHAPTERS"
    for page in listed:
        assert len(list(BLOCK.finditer((DOCS / page).read_text()))) == (DOCS / page).read_text().count(
            "<!-- runnable"), f"{page}: a runnable marker not followed by a fenced block"


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_the_tutorial_runs_as_written(chapter, tmp_path):
    lines = ["set -euo pipefail"] + [line for page in CHAPTERS[chapter] for line in script(page)]
    (tmp_path / "tutorial.sh").write_text("\n".join(lines) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "200", "NO_COLOR": "1"}
    r = subprocess.run(["bash", str(tmp_path / "tutorial.sh")], cwd=work, env=env, capture_output=True, text=True,
                       timeout=600, check=False)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"the tutorial {chapter} failed (exit {r.returncode}):\n{log[-4000:]}"
    assert "Traceback" not in log, log[-4000:]
    if chapter == "your-tool-and-recipe":
        # what the pages say the reader sees: the call's result, and a run folder with its step
        assert re.search(r"^4$", r.stdout, re.MULTILINE), r.stdout[-2000:]
        rows = (work / "myproject/runs/wordcount/metrics.jsonl").read_text().splitlines()
        assert len(rows) == 1 and "reward/called_wordcount" in json.loads(rows[0])
        assert (work / "myproject/runs/wordcount/transcripts.html").is_file()
        # The README's short version of the same recipe is a valid recipe in the same project.
        readme = (REPO / "README.md").read_text()
        block = re.search(r"```yaml\n# recipes/wordcount.yaml\n(.*?)```", readme, re.DOTALL)
        assert block, "README.md: no ```yaml block starting with `# recipes/wordcount.yaml`"
        (work / "myproject/recipes/readme.yaml").write_text(block[1])
        v = subprocess.run(["rlfactory", "validate", "recipes/readme.yaml"], cwd=work / "myproject", env=env,
                           capture_output=True, text=True, timeout=300, check=False)
        assert v.returncode == 0, f"README.md's recipe does not validate:\n{v.stdout[-2000:]}\n{v.stderr[-2000:]}"
