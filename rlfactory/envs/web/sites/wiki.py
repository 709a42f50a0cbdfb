"""The wiki: the Deep Search corpus we already ship (envs/tools/data/deepsearch_corpus.jsonl) as a small
Wikipedia-like site: a main page listing every article, article pages whose text links the other articles it
names, and a search over titles and text (Wikipedia's `/wiki/<Title>` and `/search?q=` paths; WebArena's
`__WIKIPEDIA__`). Read-only: an episode changes nothing here. Left out: edit pages, history, images, categories.
"""
from __future__ import annotations

import re

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from rlfactory.envs.web.sites import html as h
from rlfactory.envs.web.sites.context import bad, base, episode_db

SITE = "Wiki"

def wiki_page(request: Request, title: str, body: str, query: str = "") -> HTMLResponse:
    root = base(request, "wiki")
    return HTMLResponse(h.page(title, SITE, f"{root}/", [(f"{root}/", "Main page")], body,
                               search_action=f"{root}/search", query=query))


def home(request: Request) -> HTMLResponse:
    root = base(request, "wiki")
    with episode_db(request, "wiki") as db:
        rows = db.execute("SELECT slug, title FROM articles ORDER BY title").fetchall()
    items = "".join(f"<li>{h.link(f'{root}/wiki/{s}', t)}</li>" for s, t in rows)
    return wiki_page(request, "Main page", f"<h1>Welcome to the {SITE}</h1><p>{len(rows)} articles</p>"
                                           f"<ul>{items}</ul>")


def _linked(root: str, text: str, titles: list[tuple[str, str]], own: str) -> str:
    """The article text, escaped, with the first mention of every other article's title made a link to it."""
    out = h.esc(text)
    for s, t in sorted(titles, key=lambda x: -len(x[1])):  # longest first: "Merrow Observatory" before "Merrow"
        if t == own:
            continue
        pattern = re.compile(r"(?<![\w>])" + re.escape(h.esc(t)) + r"(?![\w<])")
        out = pattern.sub(lambda m, s=s: f'<a href="{h.esc(f"{root}/wiki/{s}")}">{m.group(0)}</a>', out, count=1)
    return out


def article(request: Request) -> HTMLResponse:
    root = base(request, "wiki")
    with episode_db(request, "wiki") as db:
        row = db.execute("SELECT * FROM articles WHERE slug=?", (request.path_params["slug"],)).fetchone()
        if row is None:
            raise HTTPException(404, f"The wiki has no article {request.path_params['slug']!r}.")
        titles = db.execute("SELECT slug, title FROM articles").fetchall()
    body = f"<article><h1>{h.esc(row['title'])}</h1><p>{_linked(root, row['text'], titles, row['title'])}</p></article>"
    return wiki_page(request, row["title"], body)


def search(request: Request) -> HTMLResponse:
    root, q = base(request, "wiki"), request.query_params.get("q", "").strip()
    if len(q) > 200:
        raise bad("The search text is too long (at most 200 characters).")
    words = q.split() or [""]
    like = ["%" + w.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for w in words]
    where = " AND ".join("(title LIKE ? ESCAPE '\\' OR text LIKE ? ESCAPE '\\')" for _ in words)
    with episode_db(request, "wiki") as db:
        rows = db.execute(f"SELECT slug, title, text FROM articles WHERE {where} ORDER BY title = ? DESC, title",
                          [x for w in like for x in (w, w)] + [q]).fetchall()
    items = "".join(f"<li>{h.link(f'{root}/wiki/{s}', t)}: {h.esc(x[:120])}...</li>" for s, t, x in rows)
    body = (f"<h1>Search results for: '{h.esc(q)}'</h1><p>{len(rows)} results</p><ol>{items}</ol>" if rows else
            f"<h1>Search results for: '{h.esc(q)}'</h1><p>There were no results matching the query.</p>")
    return wiki_page(request, f"Search: {q}", body, query=q)


ROUTES = [Route("/", home), Route("/search", search), Route("/wiki/{slug}", article)]
