"""A task template: WebArena's `intent_template` with its instances drawn from the seeded content, its evaluation,
and its demonstrator plan; plus the builders of WebArena `eval` blocks the templates share.

A plan is data: a list of steps saying *what* to act on by role and accessible name (link text, field label, button
name), with `{var}` placeholders filled from the instance's `instantiation_dict` and its `demo` values (things the
demonstrator knows from the database, such as which product is the cheapest). Left out: plans that branch on what a
page shows (every plan here is a fixed sequence that solves its task from the start URL of a fresh episode).
"""
from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_INSTANCES = 30


@dataclass
class Instance:
    vars: dict
    eval: dict
    demo: dict = field(default_factory=dict)


@dataclass
class Template:
    id: int
    name: str
    site: str  # WebArena's site name: "shopping" or "reddit"
    intent: str  # WebArena's intent_template, with {{var}} slots
    plan: list[dict]
    make: Callable[[sqlite3.Connection, random.Random], list[Instance]]
    start: str = ""  # path under the site's placeholder

    def intent_for(self, values: dict) -> str:
        text = self.intent
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", str(value))
        return text


def _eval(types: list[str], **extra) -> dict:
    ev = {"eval_types": types, "reference_answers": None, "reference_url": "", "program_html": [],
          "string_note": "", "reference_answer_raw_annotation": ""}
    ev.update(extra)
    return ev


def exact(answer: str) -> dict:
    return _eval(["string_match"], reference_answers={"exact_match": answer}, reference_answer_raw_annotation=answer)


def includes(*answers: str) -> dict:
    return _eval(["string_match"], reference_answers={"must_include": list(answers)},
                 reference_answer_raw_annotation=", ".join(answers))


def url_is(reference: str) -> dict:
    return _eval(["url_match"], reference_url=reference, url_note="GOLD in PRED")


def page_has(url: str, contents: list[str], checks: list[dict], locator: str = "") -> dict:
    """program_html (the page at `url` must include `contents`) plus database checks."""
    return _eval(["program_html"], program_html=[{"url": url, "locator": locator,
                                                  "required_contents": {"must_include": contents}}],
                 db_state=checks)


def via(ev: dict, *urls: str) -> dict:
    """`ev` with `subgoal_urls`: pages the task passes through on its way (the page of the product or post it names),
    whose first visits the environment reports as progress (`WebEnv`'s `progress`; the score ignores them)."""
    return {**ev, "subgoal_urls": list(urls)}


def check(site: str, sql: str, params: list, expected) -> dict:
    return {"site": site, "sql": sql, "params": params, "expected": expected}


def pick(rng: random.Random, items: list, n: int = MAX_INSTANCES) -> list:
    return rng.sample(items, min(n, len(items)))


# Plan steps, as data.
def click(role: str, name: str) -> dict:
    return {"action": "click", "role": role, "name": name}


def type_(role: str, name: str, text: str, enter: bool = False) -> dict:
    return {"action": "type", "role": role, "name": name, "text": text, "press_enter": enter}


def stop(answer: str = "") -> dict:
    return {"action": "stop", "answer": answer}


SEARCH = [type_("searchbox", "Search", "{query}", enter=True)]
