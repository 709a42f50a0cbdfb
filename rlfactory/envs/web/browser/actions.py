"""WebArena's action language, parsed from the text the policy writes.

`click [id]`, `type [id] [text] [press_enter]` (press_enter 0 or 1, default 1), `hover [id]`, `press [keys]`,
`scroll [up|down]`, `goto [url]`, `go_back`, `go_forward`, `new_tab`, `tab_focus [i]`, `close_tab`, `stop [answer]`.
Brackets around arguments are WebArena's; a bare argument (`click 12`, `scroll down`) is accepted too, and the
action may sit inside a ```` ``` ```` fence or follow a phrase such as "In summary, the next action I will perform
is" (WebArena's prompts end that way): the last action found in the text is the one played.
A text that holds no action raises `ActionParseError`, whose message is feedback for the model.
Nothing here touches a browser.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ELEMENT_ACTIONS = ("click", "type", "hover")
ACTIONS = ("click", "type", "hover", "press", "scroll", "goto", "go_back", "go_forward", "new_tab", "tab_focus",
           "close_tab", "stop")
USAGE = ("Actions: click [id], type [id] [text] [press_enter], hover [id], press [keys], scroll [up|down], "
         "goto [url], go_back, go_forward, new_tab, tab_focus [tab index], close_tab, stop [answer].")

_START = re.compile(r"(?<![\w-])(" + "|".join(ACTIONS) + r")\b", re.IGNORECASE)
_BRACKETED = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]")  # one level of nested brackets inside an argument


class ActionParseError(ValueError):
    """The text holds no well-formed action; the message says why and shows the action language."""


@dataclass(frozen=True)
class Action:
    name: str
    element: str | None = None
    """The element id as shown in the observation (`12`, or a frame's `f1e3`)."""
    text: str = ""
    """type: the text; press: the keys; scroll: up/down; goto: the URL; stop: the answer."""
    press_enter: bool = True
    tab: int | None = None

    def describe(self) -> str:
        parts = [self.name] + ([f"[{self.element}]"] if self.element else [])
        if self.name in ("type", "press", "scroll", "goto", "stop"):
            parts.append(f"[{self.text}]")
        if self.name == "type":
            parts.append(f"[{int(self.press_enter)}]")
        if self.tab is not None:
            parts.append(f"[{self.tab}]")
        return " ".join(parts)


def parse_action(text: str) -> Action:
    """The last action in `text`; raises ActionParseError with feedback for the model."""
    body = text.strip()
    fenced = re.findall(r"```(?:\w+\n)?(.*?)```", body, re.DOTALL)
    if fenced:
        body = fenced[-1].strip()
    starts = list(_START.finditer(body))
    if not starts:
        raise ActionParseError(f"No action found in {_clip(text)!r}. {USAGE}")
    m = starts[-1]
    # An action name inside a `type` or `stop` argument ("type [3] [click here]") must not count: prefer the last
    # start that is not inside brackets.
    for cand in reversed(starts):
        if body[:cand.start()].count("[") == body[:cand.start()].count("]"):
            m = cand
            break
    name, rest = m.group(1).lower(), body[m.end():].strip()
    args = _arguments(rest)
    return _build(name, args, text)


def _arguments(rest: str) -> list[str]:
    if rest.startswith("["):
        args = []
        pos = 0
        while True:
            found = _BRACKETED.match(rest, pos)
            if not found:
                break
            args.append(found.group(1).strip())
            pos = found.end()
            while pos < len(rest) and rest[pos] == " ":
                pos += 1
        return args
    first_line = rest.splitlines()[0].strip() if rest else ""
    return first_line.split(maxsplit=1) if first_line else []


def _build(name: str, args: list[str], text: str) -> Action:
    def need(n: int, shape: str) -> None:
        if len(args) < n:
            raise ActionParseError(f"`{name}` needs {shape}; got {_clip(text)!r}. {USAGE}")

    if name in ELEMENT_ACTIONS:
        need(1, "an element id: " + ("type [id] [text] [press_enter]" if name == "type" else f"{name} [id]"))
        element = args[0].strip()
        if not re.fullmatch(r"[A-Za-z]*\d+(?:[A-Za-z]+\d+)*", element):
            raise ActionParseError(f"`{name}`: {element!r} is not an element id (the number in brackets before an "
                                   f"element in the observation, e.g. {name} [12]). {USAGE}")
        if name != "type":
            return Action(name, element=element)
        need(2, "the text to type: type [id] [text] [press_enter]")
        enter = True
        if len(args) >= 3:
            if args[2] not in ("0", "1"):
                raise ActionParseError(f"`type`: press_enter must be 0 or 1, got {args[2]!r}. {USAGE}")
            enter = args[2] == "1"
        return Action("type", element=element, text=args[1], press_enter=enter)
    if name in ("press", "goto", "stop"):
        if name != "stop":
            need(1, "press [keys], e.g. press [Control+a]" if name == "press" else "a URL: goto [url]")
        return Action(name, text=" ".join(args).strip() if name == "press" else (args[0] if args else ""))
    if name == "scroll":
        need(1, "a direction: scroll [up] or scroll [down]")
        direction = args[0].lower()
        if direction not in ("up", "down"):
            raise ActionParseError(f"`scroll`: direction must be up or down, got {args[0]!r}. {USAGE}")
        return Action("scroll", text=direction)
    if name == "tab_focus":
        need(1, "a tab index: tab_focus [0]")
        if not args[0].isdigit():
            raise ActionParseError(f"`tab_focus`: {args[0]!r} is not a tab index (0, 1, …). {USAGE}")
        return Action("tab_focus", tab=int(args[0]))
    return Action(name)


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
