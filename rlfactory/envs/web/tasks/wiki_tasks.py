"""The wiki's task templates (WebArena "wikipedia" style): the shipped Deep Search two-hop questions, answered by
reading two articles, and finding an article's page.
"""
from __future__ import annotations

import json

from rlfactory.envs.web.sites.wiki_data import slug
from rlfactory.envs.web.tasks.template import Instance, Template, click, includes, stop, type_, url_is

W = "wikipedia"


def two_hop(db, rng):
    from rlfactory.envs.tools import DATA_DIR

    with open(DATA_DIR / "deepsearch_questions.jsonl") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    return [Instance({"question": q["question"]}, includes(q["answers"][0]),
                     {"first": q["supporting_titles"][0], "second": q["supporting_titles"][1],
                      "answer": q["answers"][0]}) for q in questions]


def article_url(db, rng):
    return [Instance({"title": title}, url_is(f"__WIKIPEDIA__/wiki/{slug(title)}"))
            for (title,) in db.execute("SELECT title FROM articles ORDER BY id")]


def _find(var: str) -> list[dict]:
    return [type_("searchbox", "Search", "{" + var + "}", enter=True), click("link", "{" + var + "}")]


TEMPLATES = [
    Template(201, "wiki_two_hop", W, "{{question}}", _find("first") + _find("second") + [stop("{answer}")], two_hop),
    Template(202, "wiki_open_article", W, "Open the wiki article about {{title}}.", _find("title") + [stop()],
             article_url),
]
