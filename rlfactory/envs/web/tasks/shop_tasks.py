"""The shop's task templates (WebArena "shopping" style): information seeking, filtered listings, cart, orders,
account edits and reviews, each with its instances drawn from the seed database and its demonstrator plan.

Instances whose answer would be ambiguous (ties for the cheapest or best rated, duplicate names) are skipped.
"""
from __future__ import annotations

import functools
import random
import sqlite3
from urllib.parse import urlencode

from rlfactory.envs.web.sites.shop_catalog import PRICE_BUCKETS, price_label
from rlfactory.envs.web.sites.shop_data import money
from rlfactory.envs.web.tasks.template import (
    SEARCH,
    Instance,
    Template,
    check,
    click,
    exact,
    includes,
    page_has,
    pick,
    stop,
    type_,
    url_is,
    via,
)

S = "shopping"
OPEN = SEARCH + [click("link", "{product}")]
ORDER_LATEST = "func:shopping_get_latest_order_url()"


@functools.lru_cache(maxsize=2)  # every template reads the catalogue: build it once per seed database connection
def _products(db: sqlite3.Connection) -> list[dict]:
    rows = [dict(r) for r in db.execute("SELECT p.*, c.name AS cat, c.slug FROM products p JOIN categories c "
                                        "ON c.id = p.category_id ORDER BY p.id")]
    colours, sizes, latest = {}, {}, {}
    for pid, colour in db.execute("SELECT product_id, colour FROM product_colours ORDER BY colour"):
        colours.setdefault(pid, []).append(colour)
    for pid, size in db.execute("SELECT product_id, size FROM product_sizes ORDER BY position"):
        sizes.setdefault(pid, []).append(size)
    for pid, author, created in db.execute("SELECT product_id, author, created_at FROM reviews "
                                           "ORDER BY product_id, created_at DESC, id DESC"):
        latest.setdefault(pid, []).append((author, created))
    for p in rows:
        p["colours"], p["sizes"], p["reviews"] = (colours.get(p["id"], []), sizes.get(p["id"], []),
                                                  latest.get(p["id"], []))
        p["price"] = money(p["price_cents"])
    return rows


def _one(p: dict, **more) -> dict:
    return {"product": p["name"], "query": p["name"], **more}


def _page(p: dict) -> str:
    return f"__SHOPPING__/product/{p['sku']}"


def price_of(db, rng):
    return [Instance(_one(p), via(exact(p["price"]), _page(p)), {"answer": p["price"]})
            for p in pick(rng, _products(db))]


def rating_of(db, rng):
    rated = [p for p in _products(db) if p["review_count"]]
    return [Instance(_one(p), via(includes(f"{p['rating']:.1f}"), _page(p)),
                     {"answer": f"{p['rating']:.1f}"})
            for p in pick(rng, rated)]


def review_count_of(db, rng):
    return [Instance(_one(p), via(includes(str(p["review_count"])), _page(p)),
                     {"answer": str(p["review_count"])})
            for p in pick(rng, _products(db))]


def latest_reviewer(db, rng):
    ok = [p for p in _products(db) if len(p["reviews"]) == 1 or
          (len(p["reviews"]) > 1 and p["reviews"][0][1] != p["reviews"][1][1])]
    return [Instance(_one(p), via(includes(p["reviews"][0][0]), _page(p)), {"answer": p["reviews"][0][0]})
            for p in pick(rng, ok)]


def colours_of(db, rng):
    return [Instance(_one(p), via(includes(*p["colours"]), _page(p)), {"answer": ", ".join(p["colours"])})
            for p in pick(rng, _products(db))]


def category_of(db, rng):
    return [Instance(_one(p), via(includes(p["cat"]), _page(p)), {"answer": p["cat"]})
            for p in pick(rng, _products(db))]


def _groups(products: list[dict], colour: bool = True, size: bool = False) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for p in products:
        for c in (p["colours"] if colour else [""]):
            for s in (p["sizes"] if size else [""]):
                groups.setdefault((p["cat"], p["slug"], c, s), []).append(p)
    return groups


def _unique_best(items: list[dict], key) -> dict | None:
    ranked = sorted(items, key=key)
    if len(ranked) == 1 or (len(ranked) > 1 and key(ranked[0]) != key(ranked[1])):
        return ranked[0]
    return None


def cheapest_in_colour(db, rng):
    out = []
    for (cat, _, colour, _), items in sorted(_groups(_products(db)).items()):
        best = _unique_best(items, lambda p: p["price_cents"])
        if best and len(items) > 1:
            out.append(Instance({"category": cat, "colour": colour}, includes(best["name"]), {"answer": best["name"]}))
    return pick(rng, out)


def top_rated_in_size(db, rng):
    out = []
    for (cat, _, _, size), items in sorted(_groups(_products(db), colour=False, size=True).items()):
        best = _unique_best(items, lambda p: (-p["rating"], -p["review_count"]))
        if best and len(items) > 1 and best["review_count"]:
            out.append(Instance({"category": cat, "size": size}, includes(best["name"]), {"answer": best["name"]}))
    return pick(rng, out)


def count_in_price(db, rng):
    out = []
    cats = {p["cat"]: [] for p in _products(db)}
    for p in _products(db):
        cats[p["cat"]].append(p)
    for cat, items in sorted(cats.items()):
        for lo, hi in PRICE_BUCKETS[:-1]:
            n = sum(lo * 100 <= p["price_cents"] < hi * 100 for p in items)
            if n:
                out.append(Instance({"category": cat, "lo": lo, "hi": hi}, includes(str(n)),
                                    {"answer": str(n), "bucket": price_label(lo, hi)}))
    return pick(rng, out)


def count_colour_size(db, rng):
    groups = _groups(_products(db), colour=True, size=True)
    out = [Instance({"category": cat, "colour": c, "size": s}, includes(str(len(items))), {"answer": str(len(items))})
           for (cat, _, c, s), items in sorted(groups.items())]
    return pick(rng, out)


def url_colour_desc(db, rng):
    groups = _groups(_products(db))
    return pick(rng, [Instance({"category": cat, "colour": c},
                               url_is(f"__SHOPPING__/category/{slug}?"
                                      + urlencode({"colour": c, "sort": "price_desc"})))
                      for (cat, slug, c, _), items in sorted(groups.items())])


def url_search_rating(db, rng):
    out, seen = [], set()
    for p in pick(rng, _products(db), 60):
        query = f"{p['name'].split()[0]} {p['name'].split()[-1]}"
        stars = rng.choice([3, 4])
        if (query, stars) in seen:
            continue
        seen.add((query, stars))
        n = sum(q["rating"] >= stars and all(w.lower() in q["name"].lower() for w in query.split())
                for q in _products(db))
        if n:
            out.append(Instance({"query": query, "stars": stars},
                                url_is("__SHOPPING__/catalogsearch/result/?"
                                       + urlencode({"q": query, "rating": stars})),
                                {"filter": f"{stars} stars & up"}))
    return out[:30]


def _variant(rng: random.Random, p: dict) -> dict:
    return {"colour": rng.choice(p["colours"]), "size": rng.choice(p["sizes"]) if p["sizes"] else ""}


def _size_text(size: str) -> str:
    return f", size {size}," if size else ""


def add_to_cart(db, rng):
    out = []
    for p in pick(rng, _products(db)):
        v = _variant(rng, p)
        out.append(Instance(_one(p, colour=v["colour"], size_text=_size_text(v["size"])), via(page_has(
            "__SHOPPING__/checkout/cart/", [p["name"]], [check(S, "SELECT EXISTS(SELECT 1 FROM cart_items WHERE "
                                                             "product_id=? AND colour=? AND size=?)",
                                                         [p["id"], v["colour"], v["size"]], 1)]), _page(p)),
            {"size_step": v["size"]}))
    return out


def buy_cheapest(db, rng):
    out = []
    max_order = db.execute("SELECT MAX(id) FROM orders").fetchone()[0]
    for (cat, _, colour, size), items in sorted(_groups(_products(db), size=True).items()):
        best = _unique_best(items, lambda p: p["price_cents"])
        if best and len(items) > 1:
            out.append(Instance({"category": cat, "colour": colour, "size": size}, page_has(
                ORDER_LATEST, [best["name"]], [check(S, "SELECT EXISTS(SELECT 1 FROM order_items WHERE order_id > ? "
                                                     "AND product_id=? AND colour=? AND size=?)",
                                                     [max_order, best["id"], colour, size], 1)]),
                {"product": best["name"]}))
    return pick(rng, out)


def buy_ship_to(db, rng):
    from rlfactory.envs.web.sites.shop_data import CITIES, FIRST, LAST, STREETS
    out = []
    max_order = db.execute("SELECT MAX(id) FROM orders").fetchone()[0]
    for p in pick(rng, _products(db)):
        v, qty = _variant(rng, p), rng.randint(2, 4)
        city, zip_code = rng.choice(CITIES)
        to = {"name": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
              "street": f"{rng.randint(1, 99)} {rng.choice(STREETS)}",
              "city": city, "zip": zip_code}
        out.append(Instance(_one(p, qty=qty, colour=v["colour"], size_text=_size_text(v["size"]), **to), page_has(
            ORDER_LATEST, [p["name"], to["street"]], [check(
                S, "SELECT EXISTS(SELECT 1 FROM orders o JOIN order_items i ON i.order_id = o.id WHERE o.id > ? AND "
                "i.product_id=? AND i.colour=? AND i.size=? AND i.qty=? AND o.ship_name=? AND o.street=? AND "
                "o.city=? AND o.zip=?)", [max_order, p["id"], v["colour"], v["size"], qty, to["name"], to["street"],
                                         city, zip_code], 1)]), {"size_step": v["size"]}))
    return out


def _orders(db) -> list[dict]:
    orders = [dict(r) for r in db.execute("SELECT * FROM orders ORDER BY id")]
    for o in orders:
        o["items"] = [r[0] for r in db.execute("SELECT name FROM order_items WHERE order_id=? ORDER BY id", (o["id"],))]
    return orders


def order_total(db, rng):
    return [Instance({"order": o["id"]}, includes(money(o["total_cents"])), {"answer": money(o["total_cents"])})
            for o in _orders(db)]


def order_date(db, rng):
    return [Instance({"order": o["id"]}, includes(o["created_at"]), {"answer": o["created_at"]}) for o in _orders(db)]


def order_items(db, rng):
    return [Instance({"order": o["id"]}, includes(*o["items"]), {"answer": "; ".join(o["items"])})
            for o in _orders(db)]


def order_url(db, rng):
    return [Instance({"order": o["id"]}, url_is(f"__SHOPPING__/sales/order/view/order_id/{o['id']}/"))
            for o in _orders(db)]


def status_count(db, rng):
    rows = db.execute("SELECT status, COUNT(*) FROM orders GROUP BY status ORDER BY status").fetchall()
    return [Instance({"status": s}, includes(str(n)), {"answer": str(n)}) for s, n in rows]


def update_phone(db, rng):
    phones = [f"555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}" for _ in range(30)]
    return [Instance({"phone": ph}, page_has("__SHOPPING__/customer/account/", [ph],
                                             [check(S, "SELECT phone FROM customer WHERE id=1", [], ph)]))
            for ph in phones]


def update_address(db, rng):
    from rlfactory.envs.web.sites.shop_data import CITIES, STREETS
    out = []
    for _ in range(30):
        city, zip_code = rng.choice(CITIES)
        street = f"{rng.randint(100, 9999)} {rng.choice(STREETS)}"
        out.append(Instance({"street": street, "city": city, "zip": zip_code}, page_has(
            "__SHOPPING__/customer/account/", [street], [check(
                S, "SELECT street || '|' || city || '|' || zip FROM customer WHERE id=1", [],
                f"{street}|{city}|{zip_code}")])))
    return out


def write_review(db, rng):
    from rlfactory.envs.web.sites.shop_data import FIRST, REVIEW_TITLES
    out = []
    for p in pick(rng, _products(db)):
        stars = rng.randint(1, 5)
        title, nick = rng.choice(REVIEW_TITLES[stars]), f"{rng.choice(FIRST)}{rng.randint(10, 99)}"
        text = f"My honest take on the {p['name']}: {title.lower()}."
        out.append(Instance(_one(p, stars=stars, title=title, text=text, nick=nick), page_has(
            "last", [text], [check(S, "SELECT EXISTS(SELECT 1 FROM reviews WHERE product_id=? AND author=? AND "
                                   "rating=? AND title=? AND body=?)", [p["id"], nick, stars, title, text], 1)])))
    return out


CAT = [click("link", "{category}")]
OPTIONS = [click("radio", "{colour}"), click("radio", "{size_step}")]
TEMPLATES = [
    Template(1, "shop_price", S, "What is the price of the {{product}}?", OPEN + [stop("{answer}")], price_of),
    Template(2, "shop_rating", S, "What is the average customer rating of the {{product}}?", OPEN + [stop("{answer}")],
             rating_of),
    Template(3, "shop_review_count", S, "How many reviews does the {{product}} have?", OPEN + [stop("{answer}")],
             review_count_of),
    Template(4, "shop_latest_reviewer", S, "Who wrote the most recent review of the {{product}}?",
             OPEN + [stop("{answer}")], latest_reviewer),
    Template(5, "shop_colours", S, "In which colours is the {{product}} available?", OPEN + [stop("{answer}")],
             colours_of),
    Template(6, "shop_category_of", S, "In which category is the {{product}} listed?", OPEN + [stop("{answer}")],
             category_of),
    Template(7, "shop_cheapest_colour", S, "What is the cheapest {{colour}} product in the {{category}} category?",
             CAT + [click("link", "{colour}"), click("link", "Price: low to high"), stop("{answer}")],
             cheapest_in_colour),
    Template(8, "shop_top_rated_size", S, "Which product in the {{category}} category that comes in size {{size}} "
             "has the best customer rating?", CAT + [click("link", "{size}"), click("link", "Top rated"),
                                                     stop("{answer}")], top_rated_in_size),
    Template(9, "shop_count_price", S, "How many products in the {{category}} category cost from ${{lo}} to under "
             "${{hi}}?", CAT + [click("link", "{bucket}"), stop("{answer}")], count_in_price),
    Template(10, "shop_count_colour_size", S, "How many products in the {{category}} category come in {{colour}} "
             "and in size {{size}}?", CAT + [click("link", "{colour}"), click("link", "{size}"), stop("{answer}")],
             count_colour_size),
    Template(11, "shop_url_colour_desc", S, "Show me the {{colour}} products of the {{category}} category, most "
             "expensive first.", CAT + [click("link", "{colour}"), click("link", "Price: high to low"), stop()],
             url_colour_desc),
    Template(12, "shop_url_search_rating", S, "Search the shop for \"{{query}}\" and show only products rated "
             "{{stars}} stars and up.", SEARCH + [click("link", "{filter}"), stop()], url_search_rating),
    Template(13, "shop_add_to_cart", S, "Add the {{product}} in {{colour}}{{size_text}} to my cart.",
             OPEN + OPTIONS + [click("button", "Add to Cart"), stop()], add_to_cart),
    Template(14, "shop_buy_cheapest", S, "Buy the cheapest {{colour}} product of the {{category}} category in size "
             "{{size}}, shipped to my default address.",
             CAT + [click("link", "{colour}"), click("link", "{size}"), click("link", "Price: low to high"),
                    click("link", "{product}"), click("radio", "{colour}"), click("radio", "{size}"),
                    click("button", "Add to Cart"), click("link", "Proceed to Checkout"),
                    click("button", "Place Order"), stop()], buy_cheapest),
    Template(15, "shop_buy_ship_to", S, "Order {{qty}} of the {{product}} in {{colour}}{{size_text}} and ship "
             "them to {{name}}, {{street}}, {{city}} {{zip}}.",
             OPEN + OPTIONS + [type_("spinbutton", "Qty", "{qty}"), click("button", "Add to Cart"),
                               click("link", "Proceed to Checkout"), type_("textbox", "Full name", "{name}"),
                               type_("textbox", "Street address", "{street}"), type_("textbox", "City", "{city}"),
                               type_("textbox", "ZIP code", "{zip}"), click("button", "Place Order"), stop()],
             buy_ship_to),
    Template(16, "shop_order_total", S, "What was the total of my order #{{order}}?",
             [click("link", "My Orders"), click("link", "View Order #{order}"), stop("{answer}")], order_total),
    Template(17, "shop_order_date", S, "On what date did I place order #{{order}}?",
             [click("link", "My Orders"), stop("{answer}")], order_date),
    Template(18, "shop_order_items", S, "Which products did I buy in order #{{order}}?",
             [click("link", "My Orders"), click("link", "View Order #{order}"), stop("{answer}")], order_items),
    Template(19, "shop_url_order", S, "Open the page of my order #{{order}}.",
             [click("link", "My Orders"), click("link", "View Order #{order}"), stop()], order_url),
    Template(20, "shop_status_count", S, "How many of my orders have the status {{status}}?",
             [click("link", "My Orders"), stop("{answer}")], status_count),
    Template(21, "shop_update_phone", S, "Update the phone number on my account to {{phone}}.",
             [click("link", "My Account"), click("link", "Edit Account Information"),
              type_("textbox", "Phone", "{phone}"), click("button", "Save"), stop()], update_phone),
    Template(22, "shop_update_address", S, "Change my default address to {{street}}, {{city}} {{zip}}.",
             [click("link", "My Account"), click("link", "Edit Account Information"),
              type_("textbox", "Street address", "{street}"), type_("textbox", "City", "{city}"),
              type_("textbox", "ZIP code", "{zip}"), click("button", "Save"), stop()], update_address),
    Template(23, "shop_write_review", S, "Write a {{stars}}-star review of the {{product}} under the nickname "
             "{{nick}}, with the summary \"{{title}}\" and the text \"{{text}}\".",
             OPEN + [type_("textbox", "Nickname", "{nick}"), click("radio", "{stars} stars"),
                     type_("textbox", "Summary", "{title}"), type_("textbox", "Review", "{text}"),
                     click("button", "Submit Review"), stop()], write_review),
]
