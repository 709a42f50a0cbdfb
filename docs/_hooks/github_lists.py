"""MkDocs hook: lists written as GitHub renders them render the same on the site.

The pages are also read on GitHub (README.md links into docs/, and bench/README.md is copied in), so they are written
for GitHub's Markdown, where a list may start right under a paragraph and nests with two spaces. Python-Markdown
needs a blank line before a list and four spaces per nesting level; without this hook such a list renders as one
paragraph of dashes. Only the page text handed to Markdown changes, never the files: a blank line goes before a
list that follows a paragraph, and the indentation of a nested item (and of an item's own paragraphs and tables
after a blank line) is doubled. Fenced code blocks are left as they are.
"""
from __future__ import annotations

import re

ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+\.)\s+\S")
FENCE = re.compile(r"^\s*(```|~~~)")


def github_lists(markdown: str) -> str:
    out: list[str] = []
    fence: str | None = None
    in_list = in_block = False
    prev_blank = True
    for line in markdown.split("\n"):
        opened = FENCE.match(line)
        if fence is not None:  # inside a fenced block: as it is, until its closing fence
            if opened and opened.group(1) == fence:
                fence = None
            out.append(line)
            continue
        if opened:
            fence = opened.group(1)
            out.append(line)
            prev_blank = False
            continue
        if not line.strip():
            out.append(line)
            prev_blank = True
            continue
        item = ITEM.match(line)
        if item:
            if (not in_list or in_block) and not prev_blank:
                out.append("")  # a list right under a paragraph, or the next item right under an item's own block
            indent = len(item.group(1))
            if indent and in_list:
                line = " " * (2 * indent) + line.lstrip()
            in_list, in_block = True, False
        elif in_list and line.startswith(" ") and (prev_blank or in_block):
            # a paragraph or table of the item above, after a blank line: indented as Python-Markdown nests blocks
            line = " " * (2 * (len(line) - len(line.lstrip()))) + line.lstrip()
            in_block = True
        elif prev_blank and not line.startswith(" "):
            in_list = in_block = False
        prev_blank = False
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return github_lists(markdown)
