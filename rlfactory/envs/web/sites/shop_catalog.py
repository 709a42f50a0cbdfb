"""The shop's catalogue pages: home, category listings and search (Magento-like URLs and layered navigation),
product pages with options and reviews, and writing a review.

Filters and sorting are query parameters (`colour`, `size`, `price=LO-HI` in dollars, `rating` = minimum stars,
`sort` in SORTS, `page`), shown as links so an agent filters by clicking. Left out: wish lists, comparisons.
"""
from __future__ import annotations

import sqlite3

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from rlfactory.envs.web.sites import html as h
from rlfactory.envs.web.sites.context import bad, base, episode_db, int_param, see_other, text_param
from rlfactory.envs.web.sites.shop_data import COLOURS, money, refresh_ratings

SITE = "Corner Shop"
PER_PAGE = 20
SORTS = {"price_asc": ("Price: low to high", "p.price_cents ASC, p.id"),
         "price_desc": ("Price: high to low", "p.price_cents DESC, p.id"),
         "rating": ("Top rated", "p.rating DESC, p.review_count DESC, p.id"),
         "name": ("Name", "p.name ASC")}
PRICE_BUCKETS = [(0, 25), (25, 50), (50, 100), (100, 200), (200, 0)]


def price_label(lo: int, hi: int) -> str:
    return f"${lo} and above" if not hi else f"${lo} - ${hi}"


def shop_page(request: Request, title: str, body: str, *, query: str = "", status: int = 200) -> HTMLResponse:
    root = base(request, "shop")
    nav = [(f"{root}/", "Home"), (f"{root}/checkout/cart/", "My Cart"), (f"{root}/sales/order/history/", "My Orders"),
           (f"{root}/customer/account/", "My Account")]
    message = request.query_params.get("msg", "")[:200]
    return HTMLResponse(h.page(title, SITE, f"{root}/", nav, body, search_action=f"{root}/catalogsearch/result/",
                               query=query, message=message), status_code=status)


def home(request: Request) -> HTMLResponse:
    root = base(request, "shop")
    with episode_db(request, "shop") as db:
        cats = db.execute("SELECT c.name, c.slug, COUNT(p.id) FROM categories c JOIN products p "
                          "ON p.category_id = c.id GROUP BY c.id ORDER BY c.name").fetchall()
    items = "".join(f"<li>{h.link(f'{root}/category/{slug}', name)} ({n})</li>" for name, slug, n in cats)
    return shop_page(request, "Home", f"<h1>Welcome to {SITE}</h1><h2>Shop by category</h2><ul>{items}</ul>")


def _filters(request: Request) -> dict[str, str]:
    """The listing's filter and sort parameters, validated (400 on a value that cannot be a filter)."""
    q = request.query_params
    f = {k: q.get(k, "").strip() for k in ("colour", "size", "price", "rating", "sort")}
    if f["colour"] and f["colour"] not in COLOURS:
        raise bad(f"Unknown colour {f['colour']!r}: choose one of {', '.join(COLOURS)}.")
    if len(f["size"]) > 4:
        raise bad(f"Unknown size {f['size']!r}.")
    if f["price"]:
        lo, _, hi = f["price"].partition("-")
        int_param(lo or "0", "price from", hi=10**6)
        int_param(hi or "0", "price to", hi=10**6)
    if f["rating"]:
        int_param(f["rating"], "rating", lo=1, hi=5)
    if f["sort"] and f["sort"] not in SORTS:
        raise bad(f"Unknown sort {f['sort']!r}: use one of {', '.join(SORTS)}.")
    return f


def _where(f: dict[str, str], skip: str = "") -> tuple[list[str], list]:
    clauses, args = [], []
    if f["colour"] and skip != "colour":
        clauses.append("EXISTS (SELECT 1 FROM product_colours pc WHERE pc.product_id = p.id AND pc.colour = ?)")
        args.append(f["colour"])
    if f["size"] and skip != "size":
        clauses.append("EXISTS (SELECT 1 FROM product_sizes ps WHERE ps.product_id = p.id AND ps.size = ?)")
        args.append(f["size"])
    if f["price"] and skip != "price":
        lo, _, hi = f["price"].partition("-")
        clauses.append("p.price_cents >= ?")
        args.append(int(lo or 0) * 100)
        if hi and int(hi):
            clauses.append("p.price_cents < ?")
            args.append(int(hi) * 100)
    if f["rating"] and skip != "rating":
        clauses.append("p.rating >= ?")
        args.append(int(f["rating"]))
    return clauses, args


def _facets(db: sqlite3.Connection, scope: tuple[list[str], list], f: dict[str, str], here: str,
            params: dict[str, str]) -> str:
    """Layered navigation: for each filter, links to the values that have products given the other filters."""
    def where(skip: str) -> tuple[str, list]:
        clauses, args = _where(f, skip)
        return " AND ".join(scope[0] + clauses) or "1", scope[1] + args

    def section(title: str, key: str, options: list[tuple[str, str, int]]) -> str:
        if f[key]:
            return (f"<h3>{title}</h3><p>Filtered by {h.esc(f[key])}. "
                    f"{h.link(h.url(here, **{**params, key: '', 'page': ''}), f'Clear {title.lower()} filter')}</p>")
        links = "".join(f"<li>{h.link(h.url(here, **{**params, key: value, 'page': ''}), label)} ({n})</li>"
                        for value, label, n in options if n)
        return f"<h3>{title}</h3><ul>{links}</ul>"

    sql, args = where("colour")
    colours = db.execute(f"SELECT pc.colour, COUNT(*) FROM products p JOIN product_colours pc ON pc.product_id = p.id "
                         f"WHERE {sql} GROUP BY pc.colour ORDER BY pc.colour", args).fetchall()
    sql, args = where("size")
    sizes = db.execute(f"SELECT ps.size, COUNT(*) FROM products p JOIN product_sizes ps ON ps.product_id = p.id "
                       f"WHERE {sql} GROUP BY ps.size ORDER BY MIN(ps.position), ps.size", args).fetchall()
    sql, args = where("price")
    prices = []
    for lo, hi in PRICE_BUCKETS:
        cond = "p.price_cents >= ?" + (" AND p.price_cents < ?" if hi else "")
        n = db.execute(f"SELECT COUNT(*) FROM products p WHERE {sql} AND {cond}",
                       args + [lo * 100] + ([hi * 100] if hi else [])).fetchone()[0]
        prices.append((f"{lo}-{hi}" if hi else f"{lo}-", price_label(lo, hi), n))
    sql, args = where("rating")
    ratings = [(str(stars), f"{stars} stars & up", db.execute(f"SELECT COUNT(*) FROM products p WHERE {sql} AND "
                                                              f"p.rating >= ?", args + [stars]).fetchone()[0])
               for stars in (4, 3, 2, 1)]
    return ('<aside aria-label="Filters"><h2>Shopping options</h2>' + section("Colour", "colour", [
        (c, c, n) for c, n in colours]) + section("Size", "size", [(s, s, n) for s, n in sizes])
        + section("Price", "price", prices) + section("Rating", "rating", ratings) + "</aside>")


def _listing(request: Request, db: sqlite3.Connection, title: str, scope: tuple[list[str], list],
             here: str, extra: dict[str, str]) -> str:
    f = _filters(request)
    page = int_param(request.query_params.get("page"), "page", default=1, lo=1, hi=10**4)
    clauses, args = _where(f)
    where = " AND ".join(scope[0] + clauses) or "1"
    args = scope[1] + args
    total = db.execute(f"SELECT COUNT(*) FROM products p WHERE {where}", args).fetchone()[0]
    order = SORTS[f["sort"] or "name"][1]
    rows = db.execute(f"SELECT p.sku, p.name, p.price_cents, p.rating, p.review_count FROM products p WHERE {where} "
                      f"ORDER BY {order} LIMIT ? OFFSET ?", args + [PER_PAGE, (page - 1) * PER_PAGE]).fetchall()
    params = {**extra, **{k: v for k, v in f.items() if v}}
    root = base(request, "shop")
    sorts = " ".join(h.link(h.url(here, **{**params, "sort": key, "page": ""}), label) if f["sort"] != key
                     else f"<strong>{h.esc(label)}</strong>" for key, (label, _) in SORTS.items())
    items = "".join(f"<li>{h.link(f'{root}/product/{sku}', name)} - {money(cents)} - "
                    f"Rating: {rating:.1f} ({n} reviews)</li>" for sku, name, cents, rating, n in rows)
    pages = max(1, -(-total // PER_PAGE))
    nav = []
    if page > 1:
        nav.append(h.link(h.url(here, **{**params, "page": page - 1}), "Previous page"))
    if page < pages:
        nav.append(h.link(h.url(here, **{**params, "page": page + 1}), "Next page"))
    results = (f'<section aria-label="Products"><p>{total} items</p><p>Sort by: {sorts}</p>'
               f'<ol start="{(page - 1) * PER_PAGE + 1}">{items}</ol>'
               f'<p>Page {page} of {pages} {" ".join(nav)}</p></section>') if total else \
        "<p>Your search returned no results.</p>"
    return f"<h1>{h.esc(title)}</h1>{_facets(db, scope, f, here, params)}{results}"


def category(request: Request) -> HTMLResponse:
    slug = request.path_params["slug"]
    with episode_db(request, "shop") as db:
        row = db.execute("SELECT id, name FROM categories WHERE slug = ?", (slug,)).fetchone()
        if row is None:
            raise HTTPException(404, f"No category {slug!r}.")
        body = _listing(request, db, row["name"], (["p.category_id = ?"], [row["id"]]),
                        f"{base(request, 'shop')}/category/{slug}", {})
    return shop_page(request, row["name"], body)


def search(request: Request) -> HTMLResponse:
    q = request.query_params.get("q", "").strip()
    if len(q) > 200:
        raise bad("The search text is too long (at most 200 characters).")
    words = q.split()
    scope = (["(p.name LIKE ? ESCAPE '\\')" for _ in words],
             ["%" + w.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%" for w in words])
    with episode_db(request, "shop") as db:
        body = _listing(request, db, f"Search results for: '{q}'", scope,
                        f"{base(request, 'shop')}/catalogsearch/result/", {"q": q})
    return shop_page(request, f"Search: {q}", body, query=q)


def product(request: Request) -> HTMLResponse:
    root = base(request, "shop")
    with episode_db(request, "shop") as db:
        p = db.execute("SELECT p.*, c.name AS cat, c.slug FROM products p JOIN categories c ON c.id = p.category_id "
                       "WHERE p.sku = ?", (request.path_params["sku"],)).fetchone()
        if p is None:
            raise HTTPException(404, f"No product {request.path_params['sku']!r}.")
        colours = [r[0] for r in db.execute("SELECT colour FROM product_colours WHERE product_id=? ORDER BY colour",
                                            (p["id"],))]
        sizes = [r[0] for r in db.execute("SELECT size FROM product_sizes WHERE product_id=? ORDER BY position",
                                          (p["id"],))]
        reviews = db.execute("SELECT * FROM reviews WHERE product_id=? ORDER BY created_at DESC, id DESC",
                             (p["id"],)).fetchall()
    options = h.radios("colour", "Colour", [(c, c) for c in colours])
    if sizes:
        options += h.radios("size", "Size", [(s, s) for s in sizes])
    buy = h.form(f"{root}/cart/add", options + h.textbox("qty", "Qty", 1, kind="number"), "Add to Cart",
                 hidden={"sku": p["sku"]}, label="Add to cart")
    listed = "".join(f"<article><h3>{h.esc(r['title'])}</h3><p>Rating: {r['rating']}/5</p><p>Review by "
                     f"{h.esc(r['author'])} on {r['created_at']}</p><p>{h.esc(r['body'])}</p></article>"
                     for r in reviews) or "<p>No reviews yet.</p>"
    write = h.form(f"{root}/review/add", h.textbox("author", "Nickname")
                   + h.radios("rating", "Your rating", [(str(i), f"{i} stars") for i in range(1, 6)])
                   + h.textbox("title", "Summary") + h.textarea("body", "Review"), "Submit Review",
                   hidden={"sku": p["sku"]}, label="Write a review")
    cat_link = h.link(f"{root}/category/{p['slug']}", p["cat"])
    body = (f"<h1>{h.esc(p['name'])}</h1><p>Category: {cat_link}</p>"
            f"<p>Price: {money(p['price_cents'])}</p><p>SKU: {p['sku']}</p>"
            f"<p>Rating: {p['rating']:.1f} out of 5 ({p['review_count']} reviews)</p>"
            f"<p>{h.esc(p['description'])}</p>{buy}<section aria-label=\"Reviews\"><h2>Customer reviews</h2>"
            f"{listed}</section><section aria-label=\"Write a review\"><h2>Write your own review</h2>{write}</section>")
    return shop_page(request, p["name"], body)


async def add_review(request: Request):
    form = await request.form()
    rating = int_param(form.get("rating"), "your rating (choose 1 to 5 stars)", lo=1, hi=5)
    author = text_param(form, "author", "Nickname", max_len=60)
    title = text_param(form, "title", "Summary", max_len=120)
    body = text_param(form, "body", "Review", max_len=4000)
    sku = str(form.get("sku", ""))
    with episode_db(request, "shop") as db:
        row = db.execute("SELECT id FROM products WHERE sku=?", (sku,)).fetchone()
        if row is None:
            raise HTTPException(404, f"No product {sku!r}.")
        last = db.execute("SELECT MAX(created_at) FROM reviews").fetchone()[0] or "2026-01-01"
        # Reviews written in an episode are the newest: dated one day after the newest seeded one.
        db.execute("INSERT INTO reviews (product_id, author, rating, title, body, created_at) VALUES "
                   "(?,?,?,?,?,date(?, '+1 day'))", (row["id"], author, rating, title, body, last))
        refresh_ratings(db, row["id"])
    return see_other(h.url(f"{base(request, 'shop')}/product/{sku}", msg="You submitted your review."))


ROUTES = [
    Route("/", home), Route("/category/{slug}", category), Route("/catalogsearch/result/", search),
    Route("/product/{sku}", product), Route("/review/add", add_review, methods=["POST"]),
]
