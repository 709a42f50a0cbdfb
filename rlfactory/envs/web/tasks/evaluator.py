"""Score a finished web episode against a WebArena task config: WebArena's evaluators, re-implemented over HTTP.

Inputs are what an episode leaves behind: the final answer (`stop [answer]`), the final URL, the episode's
databases and its pages (fetched over HTTP). The score is the product of the config's `eval_types`, as in
WebArena's `evaluator_router`:
- `string_match`: `reference_answers` with `exact_match`, `must_include` (each item; when it is the only item and a
  short single token such as "4", a whole token of the answer: WebArena does this for one-character references only,
  so "12" would match "2012" there but not here) and `fuzzy_match` (through an LLM judge: `rewards/judge.py`'s
  `fuzzy_match_judge`, handed in; without a judge a config that needs one raises `JudgeRequired`, never a silent 0);
- `url_match`: `reference_url` (alternatives joined by " |OR| "), rule "GOLD in PRED": the reference's host+path
  is contained in the final URL's and every reference query value is among the final URL's;
- `program_html`: per target, the page at `url` ("last" = the final URL, or `func:` one of WebArena's helpers
  `shopping_get_latest_order_url()` / `reddit_get_post_url('__last_url__')`), narrowed by `locator` ("" = the whole
  page source, or `document.querySelector('<css>').outerText|innerText|textContent|value|outerHTML`), must hold
  the `required_contents` (`exact_match` or `must_include`, alternatives joined by " |OR| ").
Beyond WebArena (it ignores the key, so the files stay WebArena configs): `eval.db_state`, a list of
`{"site": "shopping"|"reddit", "sql", "params", "expected"}` checks whose first column of the first row must equal
`expected`, run on a read-only connection to the episode's database; and `eval.subgoal_urls`, pages the task passes
through (the page of the product or post it names), which the score ignores and `subgoals_reached` matches (by
`url_match`'s rule) for the environment's progress report.
URLs in a config may use WebArena's placeholders (`__SHOPPING__`, `__REDDIT__`); `urls` maps them to bases.
Left out: WebArena's JavaScript locators beyond querySelector (they need a live page: pass `locate` to evaluate
them in the browser) and its GitLab / map helpers.
"""
from __future__ import annotations

import html
import re
import sqlite3
import urllib.parse
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import lxml.html

Fetch = Callable[[str], Awaitable[str]]
Judge = Callable[[str, str, str], Awaitable[float]]  # (prediction, reference, intent) -> score in [0, 1]
Database = Callable[[str], sqlite3.Connection]  # WebArena site name ("shopping", "reddit") -> read-only connection
Locate = Callable[[str, str, str], Awaitable[str]]  # (url, page source, locator) -> the located text

_QUERY_SELECTOR = re.compile(
    r"""^document\.querySelector\((['"])(?P<css>.+?)\1\)\.(?P<prop>outerText|innerText|textContent|value|outerHTML)$""")
_POST_URL = re.compile(r"^(?P<post>.*?/f/[^/]+/\d+)(?:/.*)?$")
_TOKEN = re.compile(r"\w+(?:[.,']\w+)*|[^\w\s]")


class JudgeRequired(RuntimeError):
    """A `fuzzy_match` config met an evaluator without a judge."""


class UnsupportedConfig(ValueError):
    """A config asks for something this evaluator cannot check (names the task and the field)."""


@dataclass
class EvalResult:
    score: float
    parts: dict[str, float] = field(default_factory=dict)


def clean_answer(answer: str) -> str:
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def exact_match(ref: str, pred: str) -> float:
    return float(clean_answer(pred) == clean_answer(ref))


def must_include(ref: str, pred: str, tokenize: bool = False) -> float:
    ref, pred = clean_answer(ref), clean_answer(pred)
    # A single short token (e.g. "0" or "4") must be a whole token of the answer, not part of "2024".
    if tokenize and len(_TOKEN.findall(ref)) == 1 and len(ref) <= 3:
        return float(ref in _TOKEN.findall(pred))
    return float(ref in pred)


def fill(text: str, urls: dict[str, str]) -> str:
    for placeholder, base in urls.items():
        text = text.replace(placeholder, base.rstrip("/"))
    return text


def url_match(reference: str, pred: str, rule: str = "GOLD in PRED") -> float:
    if rule != "GOLD in PRED":
        raise UnsupportedConfig(f"eval.url_note {rule!r}: only 'GOLD in PRED' is supported")

    def parse(url: str) -> tuple[str, dict[str, list[str]]]:
        parsed = urllib.parse.urlparse(url.rstrip("/"))
        return parsed.netloc + parsed.path, urllib.parse.parse_qs(parsed.query)

    ref_paths, ref_queries = [], defaultdict(set)
    for ref in reference.split(" |OR| "):
        path, query = parse(ref.strip())
        ref_paths.append(path)
        for k, values in query.items():
            ref_queries[k].update(values)
    pred_path, pred_query = parse(pred)
    score = float(any(path in pred_path for path in ref_paths))
    for k, values in ref_queries.items():
        score *= float(any(v in pred_query.get(k, []) for v in values))
    return score


def subgoal_urls(config: dict) -> list[str]:
    """The config's `eval.subgoal_urls` (none when it names none)."""
    return (config.get("eval") or {}).get("subgoal_urls") or []


def subgoals_reached(config: dict, urls: dict[str, str], url: str) -> set[int]:
    """Indices of the config's `eval.subgoal_urls` that `url` is (url_match's "GOLD in PRED")."""
    return {i for i, ref in enumerate(subgoal_urls(config)) if url and url_match(fill(ref, urls), url) == 1.0}


def locate_css(source: str, locator: str) -> str:
    """WebArena's `document.querySelector(...).<prop>` locators on a static page source ("" if nothing matches)."""
    m = _QUERY_SELECTOR.match(locator.strip())
    if not m:
        raise UnsupportedConfig(f"program_html locator {locator!r}: only '' or document.querySelector('<css>')."
                                "outerText|innerText|textContent|value|outerHTML work over HTTP; pass `locate` "
                                "to evaluate others in a browser")
    root = lxml.html.fromstring(source or "<html></html>")
    found = root.cssselect(m["css"])
    if not found:
        return ""
    node, prop = found[0], m["prop"]
    if prop == "outerHTML":
        return lxml.html.tostring(node, encoding="unicode")
    if prop == "value":
        return node.get("value") or (node.text_content() if node.tag == "textarea" else "")
    return node.text_content()


class Evaluator:
    """Scores finished episodes. `urls`: placeholder -> base URL of the episode's sites; `fetch(url)` returns a
    page's HTML; `database(site)` a read-only connection (needed by `db_state` and the shopping helper)."""

    def __init__(self, urls: dict[str, str], fetch: Fetch, database: Database | None = None,
                 judge: Judge | None = None, locate: Locate | None = None):
        self.urls, self.fetch, self.database, self.judge, self.locate = urls, fetch, database, judge, locate

    async def __call__(self, config: dict, answer: str | None, final_url: str) -> EvalResult:
        ev = config.get("eval") or {}
        parts: dict[str, float] = {}
        for kind in ev.get("eval_types", []):
            if kind == "string_match":
                parts[kind] = await self.string_match(config, answer or "")
            elif kind == "url_match":
                parts[kind] = url_match(fill(ev.get("reference_url", ""), self.urls), final_url,
                                        ev.get("url_note") or "GOLD in PRED")
            elif kind == "program_html":
                parts[kind] = await self.program_html(config, final_url)
            else:
                raise UnsupportedConfig(f"task {config.get('task_id')}: eval_types has {kind!r}; use string_match, "
                                        "url_match or program_html")
        if ev.get("db_state"):
            parts["db_state"] = self.db_state(config)
        if not parts:
            raise UnsupportedConfig(f"task {config.get('task_id')}: eval.eval_types is empty")
        score = 1.0
        for value in parts.values():
            score *= value
        return EvalResult(score, parts)

    async def string_match(self, config: dict, answer: str) -> float:
        pred = clean_answer(answer)
        score = 1.0
        for approach, value in config["eval"].get("reference_answers", {}).items():
            if approach == "exact_match":
                score *= exact_match(value, pred)
            elif approach == "must_include":
                for item in value:
                    score *= must_include(item, pred, tokenize=len(value) == 1)
            elif approach == "fuzzy_match":
                if value == "N/A" and exact_match("N/A", pred):
                    continue
                if self.judge is None:
                    raise JudgeRequired(f"task {config.get('task_id')}: fuzzy_match needs an LLM judge; give the "
                                        "Evaluator judge=rlfactory.rewards.judge.fuzzy_match_judge(base_url, model)")
                for reference in ([value] if isinstance(value, str) else value):
                    score *= float(await self.judge(pred, reference, config.get("intent", "")) >= 0.5)
            else:
                raise UnsupportedConfig(f"task {config.get('task_id')}: reference_answers has {approach!r}")
        return score

    def _helper_url(self, expr: str, final_url: str) -> str:
        expr = expr.replace("__last_url__", final_url).strip()
        if expr == "shopping_get_latest_order_url()":
            if self.database is None:
                raise UnsupportedConfig("shopping_get_latest_order_url() needs the episode's database")
            conn = self.database("shopping")
            try:
                oid = conn.execute("SELECT MAX(id) FROM orders").fetchone()[0]
            finally:
                conn.close()
            return f"{self.urls['__SHOPPING__'].rstrip('/')}/sales/order/view/order_id/{oid}/"
        m = re.fullmatch(r"reddit_get_post_url\((['\"])(.*)\1\)", expr)
        if m:
            post = _POST_URL.match(urllib.parse.urlparse(m[2]).path)
            parsed = urllib.parse.urlparse(m[2])
            return f"{parsed.scheme}://{parsed.netloc}{post['post']}" if post else m[2]
        raise UnsupportedConfig(f"program_html url func:{expr!r}: supported are shopping_get_latest_order_url() and "
                                "reddit_get_post_url('__last_url__')")

    async def program_html(self, config: dict, final_url: str) -> float:
        score = 1.0
        for target in config["eval"].get("program_html", []):
            url = target.get("url", "last")
            if url.startswith("func:"):
                url = self._helper_url(url[len("func:"):], final_url)
            url = final_url if url == "last" else fill(url, self.urls)
            source = await self.fetch(url)
            locator = (target.get("locator") or "").strip()
            if not locator:
                selected = source
            elif self.locate is not None:
                selected = await self.locate(url, source, locator)
            else:
                selected = locate_css(source, locator)
            selected = html.unescape(selected or "")
            required = target.get("required_contents", {})
            if "exact_match" in required:
                score *= exact_match(required["exact_match"], selected)
            elif "must_include" in required:
                for content in required["must_include"]:
                    score *= float(any(must_include(alt, selected) for alt in content.split(" |OR| ")))
            else:
                raise UnsupportedConfig(f"task {config.get('task_id')}: program_html required_contents needs "
                                        "exact_match or must_include")
        return score

    def db_state(self, config: dict) -> float:
        if self.database is None:
            raise UnsupportedConfig(f"task {config.get('task_id')}: eval.db_state needs the episode's database")
        score = 1.0
        for check in config["eval"]["db_state"]:
            conn = self.database(check["site"])
            try:
                row = conn.execute(check["sql"], check.get("params", [])).fetchone()
            finally:
                conn.close()
            score *= float(row is not None and row[0] == check["expected"])
        return score
