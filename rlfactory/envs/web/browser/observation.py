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
does not show them) unless `show_urls`. Left out: a viewport-only view (the whole page is rendered and cut at the
end, so `scroll` moves the page but not this text) and images' pixels (`screenshot` is the tool for those).
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
    refs these are)."""
    ids = ids or IdTable()
    try:
        doc = yaml.load(snapshot, Loader=_Loader) or []
    except yaml.YAMLError:  # never seen; a page must not break the episode over it
        return Tree(lines=[f"StaticText {_quote(line.strip())}" for line in snapshot.splitlines() if line.strip()])
    tree = Tree(lines=[])
    _walk(doc if isinstance(doc, list) else [doc], 0, tree, lambda ref: ids.id_for(tab, ref), show_urls)
    return tree


def _walk(items: list[Any], depth: int, tree: Tree, id_for: Callable[[str], str], show_urls: bool) -> None:
    for item in items:
        if isinstance(item, dict):
            for key, value in item.items():
                _node(str(key), value, depth, tree, id_for, show_urls)
        elif item is not None:
            _node(str(item), None, depth, tree, id_for, show_urls)


def _node(key: str, value: Any, depth: int, tree: Tree, id_for: Callable[[str], str], show_urls: bool) -> None:
    pad = "\t" * depth
    if key == "text":
        tree.lines.append(f"{pad}StaticText {_quote(str(value or ''))}")
        return
    if key.startswith("/"):  # a property line of the parent (`/url: ...`, `/placeholder: ...`), handled there
        return
    m = _KEY.match(key)
    if m is None:
        tree.lines.append(f"{pad}StaticText {_quote(key)}")
        return
    role, name = m.group("role"), _unescape(m.group("name") or "")
    attrs = {a: (v if v is not None else "") for a, v in _ATTR.findall(m.group("attrs") or "")}
    children = value if isinstance(value, list) else []
    inline = value if isinstance(value, str) else ""
    url = next((str(c["/url"]) for c in children if isinstance(c, dict) and "/url" in c), None)
    ref = attrs.get("ref")
    if role == "generic" and not name and not inline and "cursor" not in attrs:
        _walk(children, depth, tree, id_for, show_urls)  # a layout wrapper: its children take its place
        return
    if not name and inline:
        name, inline = inline, ""
    parts = []
    if ref:
        eid = id_for(ref)
        tree.elements[eid] = Element(ref=ref, role=role, name=name, url=url)
        parts.append(f"[{eid}]")
    parts.append(role)
    if name:
        parts.append(_quote(name))
    for attr, prop in _PROPS.items():
        if attr in attrs:
            parts.append(f"{prop}: {attrs[attr] if attrs[attr] else 'True'}")
    if show_urls and url:
        parts.append(f"url: {url}")
    tree.lines.append(pad + " ".join(parts))
    if inline:
        tree.lines.append(f"{pad}\tStaticText {_quote(inline)}")
    _walk(children, depth + 1, tree, id_for, show_urls)


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
    total = sum(len(x) + 1 for x in tree.lines)
    if total <= room:
        return text + "\n".join(tree.lines)
    room -= len(_cut_line(len(tree.lines), total, max_chars)) + 1  # the longest the cut line can be
    kept: list[str] = []
    used = 0
    for line in tree.lines:
        if used + len(line) + 1 > room:
            break
        kept.append(line)
        used += len(line) + 1
    cut = tree.lines[len(kept):]
    kept.append(_cut_line(len(cut), sum(len(x) + 1 for x in cut), max_chars))
    return text + "\n".join(kept)


def _cut_line(lines: int, chars: int, max_chars: int) -> str:
    return f"[… {lines} more lines ({chars} characters) of this page are not shown: cut to {max_chars} characters]"
