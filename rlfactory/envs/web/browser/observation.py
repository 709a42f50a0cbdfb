"""The observation WebArena gives its agents: the page's accessibility tree with element ids, the open tabs and the
URL, cut to a character budget (about 4 characters a token), with the notes of what happened since the last step.

Where the tree comes from (measured on this machine, chromium 156, a 60-node page): Playwright's AI snapshot
(`page.aria_snapshot(mode="ai")`, 4-6 ms warm) against the CDP accessibility tree (`Accessibility.getFullAXTree`,
3-6 ms). The CDP tree is what WebArena reads, but it would need our own pruning of Chrome's internal nodes
(InlineTextBox, ignored wrappers) and a backendDOMNodeId -> element resolution per action; the AI snapshot is
already pruned, names elements by ref (`[ref=e12]`), resolves a ref back to its element (`aria-ref=e12`, with
Playwright's visibility/enabled checks), keeps an element's ref across snapshots while its role and name hold,
includes iframes, and is what the official Playwright MCP server shows. Refs change form as a page navigates
(`e12`, then `f2e12`), so the ids shown are integers an `IdTable` hands out per (tab, ref) for the episode: an
element keeps its id while its ref holds, and no two elements of an episode share one. `parse_snapshot` keeps, per
id, the ref, role, name and link target (used to refuse a click on a link out of the episode's sites before it is
made).

Rendering, per line: a tab per depth, `[id] role 'name'` and WebArena-style properties (`focused: True`,
`disabled: True`, `checked: True`, `level: 2`); text is `StaticText 'text'`; a nameless `generic` wrapper is
dropped and its children moved up a level (the largest saving on real pages). Link URLs are not shown (WebArena
does not show them) unless `show_urls`. A page that fits the budget is shown whole; one that does not loses first
the lines wholly above the view (the snapshot carries each element's box), then its end, each with a line saying
so — so `scroll` brings a long page's later part into the text. Left out: images' pixels (`screenshot` is the tool
for those).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

_Loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # BaseLoader: every scalar stays a string ("yes", "10")
_KEY = re.compile(r'^(?P<role>[A-Za-z][\w-]*)(?: "(?P<name>(?:[^"\\]|\\.)*)")?(?P<attrs>(?: \[[^\]]*\])*)$')
_ATTR = re.compile(r"\[([^\]=]+)(?:=([^\]]*))?\]")
_PROPS = {"active": "focused", "disabled": "disabled", "checked": "checked", "expanded": "expanded",
          "selected": "selected", "pressed": "pressed", "level": "level"}
DEFAULT_MAX_CHARS = 8000


@dataclass(frozen=True)
class Element:
    """What an id in the observation stands for."""

    ref: str
    role: str
    name: str
    url: str | None = None


@dataclass
class Tree:
    lines: list[str]
    elements: dict[str, Element] = field(default_factory=dict)
    bottoms: list[float | None] = field(default_factory=list)
    """Per line, where its element ends below the viewport's top (negative: above the view), when known."""


class IdTable:
    """Integer ids for Playwright refs, per episode: the same (tab, ref) always gets the same id."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, str], str] = {}

    def id_for(self, tab: int, ref: str) -> str:
        key = (tab, ref)
        if key not in self._ids:
            self._ids[key] = str(len(self._ids) + 1)
        return self._ids[key]


def parse_snapshot(snapshot: str, *, ids: IdTable | None = None, tab: int = 0, show_urls: bool = False) -> Tree:
    """The AI snapshot's YAML as WebArena-style lines and the table of ids (`ids`: the episode's; `tab`: which tab's
    refs these are). A snapshot taken with boxes (`[box=x,y,w,h]`, viewport-relative) also gives each line the
    bottom of its element, which `render` uses to leave out what is above the view when the page does not fit."""
    ids = ids or IdTable()
    try:
        doc = yaml.load(snapshot, Loader=_Loader) or []
    except yaml.YAMLError:  # never seen; a page must not break the episode over it
        return Tree(lines=[f"StaticText {_quote(line.strip())}" for line in snapshot.splitlines() if line.strip()])
    builder = _Builder(lambda ref: ids.id_for(tab, ref), show_urls)
    builder.walk(doc if isinstance(doc, list) else [doc], 0, None)
    return builder.tree


class _Builder:
    def __init__(self, id_for: Callable[[str], str], show_urls: bool):
        self.tree = Tree(lines=[])
        self.id_for = id_for
        self.show_urls = show_urls

    def add(self, line: str, bottom: float | None) -> None:
        self.tree.lines.append(line)
        self.tree.bottoms.append(bottom)

    def walk(self, items: list[Any], depth: int, bottom: float | None) -> None:
        for item in items:
            if isinstance(item, dict):
                for key, value in item.items():
                    self.node(str(key), value, depth, bottom)
            elif item is not None:
                self.node(str(item), None, depth, bottom)

    def node(self, key: str, value: Any, depth: int, parent_bottom: float | None) -> None:
        pad = "\t" * depth
        if key == "text":
            self.add(f"{pad}StaticText {_quote(str(value or ''))}", parent_bottom)
            return
        if key.startswith("/"):  # a property line of the parent (`/url: ...`, `/placeholder: ...`), handled there
            return
        m = _KEY.match(key)
        if m is None:
            self.add(f"{pad}StaticText {_quote(key)}", parent_bottom)
            return
        role, name = m.group("role"), _unescape(m.group("name") or "")
        attrs = {a: (v if v is not None else "") for a, v in _ATTR.findall(m.group("attrs") or "")}
        bottom = _bottom(attrs.get("box"), parent_bottom)
        children = value if isinstance(value, list) else []
        inline = value if isinstance(value, str) else ""
        url = next((str(c["/url"]) for c in children if isinstance(c, dict) and "/url" in c), None)
        ref = attrs.get("ref")
        if role == "generic" and not name and not inline and "cursor" not in attrs:
            self.walk(children, depth, bottom)  # a layout wrapper: its children take its place
            return
        if not name and inline:
            name, inline = inline, ""
        parts = []
        if ref:
            eid = self.id_for(ref)
            self.tree.elements[eid] = Element(ref=ref, role=role, name=name, url=url)
            parts.append(f"[{eid}]")
        parts.append(role)
        if name:
            parts.append(_quote(name))
        for attr, prop in _PROPS.items():
            if attr in attrs:
                parts.append(f"{prop}: {attrs[attr] if attrs[attr] else 'True'}")
        if self.show_urls and url:
            parts.append(f"url: {url}")
        self.add(pad + " ".join(parts), bottom)
        if inline:
            self.add(f"{pad}\tStaticText {_quote(inline)}", bottom)
        self.walk(children, depth + 1, bottom)


def _bottom(box: str | None, default: float | None) -> float | None:
    """The bottom edge (viewport-relative y + height) of `x,y,w,h`, or `default`."""
    try:
        _, y, _, h = (float(v) for v in (box or "").split(","))
    except ValueError:
        return default
    return y + h


def _unescape(name: str) -> str:
    return name.replace('\\"', '"').replace("\\\\", "\\")


def _quote(text: str) -> str:
    return "'" + " ".join(text.split()) + "'"


def render(*, tree: Tree, url: str, tabs: list[str], active_tab: int, notes: list[str],
           max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The observation text: notes, tabs, URL, then the tree cut to fit `max_chars` in all (with a line saying what
    was cut)."""
    head = [f"Note: {n}" for n in notes]
    head.append(" | ".join(f"Tab {i}{' (current)' if i == active_tab else ''}: {t or '(untitled)'}"
                           for i, t in enumerate(tabs)))
    head.append(f"URL: {url}")
    text = "\n".join(head) + "\n"
    room = max_chars - len(text)
    lines = tree.lines
    total = sum(len(x) + 1 for x in lines)
    if total <= room:
        return text + "\n".join(lines)
    # Too long: first leave out what is wholly above the view (scrolled past), then cut at the end.
    bottoms = tree.bottoms if len(tree.bottoms) == len(lines) else [None] * len(lines)
    above = sum(1 for b in bottoms if b is not None and b < 0)
    if above:
        lines = [x for x, b in zip(lines, bottoms) if b is None or b >= 0]
        text += f"[… {above} lines above the visible part of the page are not shown: scroll up for them]\n"
        room = max_chars - len(text)
        total = sum(len(x) + 1 for x in lines)
        if total <= room:
            return text + "\n".join(lines)
    room -= len(_cut_line(len(lines), total, max_chars)) + 1  # the longest the cut line can be
    kept: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > room:
            break
        kept.append(line)
        used += len(line) + 1
    cut = lines[len(kept):]
    kept.append(_cut_line(len(cut), sum(len(x) + 1 for x in cut), max_chars))
    return text + "\n".join(kept)


def _cut_line(lines: int, chars: int, max_chars: int) -> str:
    return (f"[… {lines} more lines ({chars} characters) of this page are not shown: cut to {max_chars} characters; "
            f"scroll down for them]")
