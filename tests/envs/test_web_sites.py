"""The self-hosted web sites: a real uvicorn server on a port this process binds, real SQLite per episode.

Episode isolation (carts, posts), forks that start from the source's state and then diverge, deterministic seeded
content, and 4xx pages (never a 500) for bad requests.
"""
from __future__ import annotations

import sqlite3

import httpx
import pytest

from rlfactory.envs.web.sites.server import WebSites
from rlfactory.envs.web.sites.store import seed_database


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    with WebSites(cache=tmp_path_factory.mktemp("web-cache")) as running:
        yield running


@pytest.fixture
def client():
    with httpx.Client(timeout=30.0, follow_redirects=True) as c:
        yield c


def _add_to_cart(client: httpx.Client, shop: str, sku: str, colour: str, size: str = "") -> httpx.Response:
    return client.post(f"{shop}/cart/add", data={"sku": sku, "colour": colour, "size": size, "qty": "1"})


def _first_variant(sites: WebSites, episode: str, offset: int = 0) -> tuple[str, str, str]:
    conn = sites.database(episode, "shop")
    try:
        sku, pid = conn.execute("SELECT sku, id FROM products ORDER BY id LIMIT 1 OFFSET ?", (offset,)).fetchone()
        colour = conn.execute("SELECT colour FROM product_colours WHERE product_id=? ORDER BY colour",
                              (pid,)).fetchone()[0]
        size = conn.execute("SELECT size FROM product_sizes WHERE product_id=? ORDER BY position", (pid,)).fetchone()
    finally:
        conn.close()
    return sku, colour, size[0] if size else ""


def test_server_listens_on_its_own_port_and_serves_both_sites(sites, client):
    port = int(sites.origin.rsplit(":", 1)[1])
    assert port > 0 and sites.origin.startswith("http://127.0.0.1:")
    assert client.get(f"{sites.origin}/health").text == "ok"
    urls = sites.open_episode("port-check")
    try:
        home = client.get(urls["shop"])
        assert home.status_code == 200 and "Corner Shop" in home.text and "Shop by category" in home.text
        assert str(home.url).endswith("/e/port-check/shop/")
        forum = client.get(f"{urls['forum']}/forums")
        assert forum.status_code == 200 and "All forums" in forum.text and "Gardening" in forum.text
        wiki = client.get(f"{urls['wiki']}/wiki/Varnholt")  # the shipped Deep Search corpus, articles linked
        assert wiki.status_code == 200 and '/e/port-check/wiki/wiki/Odile_Marchetti">Odile Marchetti</a>' in wiki.text
        found = client.get(f"{urls['wiki']}/search", params={"q": "lighthouse"})
        assert ">Varnholt</a>" in found.text
    finally:
        sites.close_episode("port-check")


def test_two_episodes_never_see_each_others_cart_or_posts(sites, client):
    a, b = sites.open_episode("iso-a"), sites.open_episode("iso-b")
    try:
        sku, colour, size = _first_variant(sites, "iso-a")
        assert _add_to_cart(client, a["shop"], sku, colour, size).status_code == 200
        assert sku in client.get(f"{a['shop']}/checkout/cart/").text
        assert "You have no items in your shopping cart" in client.get(f"{b['shop']}/checkout/cart/").text

        r = client.post(f"{b['forum']}/submit/cooking", data={"title": "Only in episode B", "body": "b"})
        assert r.status_code == 200 and "Only in episode B" in r.text
        assert "Only in episode B" in client.get(f"{b['forum']}/f/cooking/new").text
        assert "Only in episode B" not in client.get(f"{a['forum']}/f/cooking/new").text
    finally:
        sites.close_episode("iso-a")
        sites.close_episode("iso-b")


def test_a_fork_starts_from_the_source_state_then_diverges(sites, client):
    src = sites.open_episode("fork-src")
    try:
        sku, colour, size = _first_variant(sites, "fork-src")
        _add_to_cart(client, src["shop"], sku, colour, size)
        dst = sites.fork_episode("fork-src", "fork-dst")
        assert sku in client.get(f"{dst['shop']}/checkout/cart/").text  # the source's cart came along

        sku2, colour2, size2 = _first_variant(sites, "fork-dst", offset=100)
        _add_to_cart(client, dst["shop"], sku2, colour2, size2)
        client.post(f"{src['forum']}/submit/books", data={"title": "Written after the fork", "body": ""})
        assert sku2 in client.get(f"{dst['shop']}/checkout/cart/").text
        assert sku2 not in client.get(f"{src['shop']}/checkout/cart/").text
        assert "Written after the fork" not in client.get(f"{dst['forum']}/f/books/new").text
    finally:
        for episode in ("fork-src", "fork-dst"):
            sites.close_episode(episode)
    assert client.get(f"{src['shop']}/").status_code == 404  # closed: gone


def test_same_seed_same_database_other_seed_other_content(tmp_path):
    def dump(path) -> list[str]:
        conn = sqlite3.connect(path)
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    for site, table, minimum in (("shop", "products", 1000), ("forum", "posts", 500)):
        one, two = seed_database(site, 7, tmp_path / "a"), seed_database(site, 7, tmp_path / "b")
        assert dump(one) == dump(two)
        assert dump(seed_database(site, 8, tmp_path / "a")) != dump(one)
        conn = sqlite3.connect(one)
        assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] >= minimum
        conn.close()


@pytest.mark.parametrize("method,path,data,status", [
    ("GET", "/shop/no/such/page", None, 404),
    ("GET", "/shop/category/no-such-category", None, 404),
    ("GET", "/shop/category/shirts?price=cheap", None, 400),
    ("GET", "/shop/category/shirts?colour=ultraviolet", None, 400),
    ("GET", "/shop/category/shirts?page=-3", None, 400),
    ("GET", "/shop/category/shirts?sort=random", None, 400),
    ("GET", "/shop/product/NOPE", None, 404),
    ("GET", "/shop/sales/order/view/order_id/abc/", None, 400),
    ("GET", "/shop/sales/order/view/order_id/99999/", None, 404),
    ("GET", "/shop/cart/add", None, 405),
    ("GET", "/shop/checkout/success/99999", None, 404),
    ("POST", "/shop/cart/add", {"sku": "SKU-000-00001", "colour": "red", "qty": "0"}, 400),
    ("POST", "/shop/cart/add", {"sku": "NOPE"}, 404),
    ("POST", "/shop/cart/add", {"sku": "SKU-000-00001", "colour": "plaid"}, 400),
    ("POST", "/shop/cart/add", {"sku": "SKU-000-00001", "qty": "many"}, 400),
    ("POST", "/shop/checkout/", {"ship_name": "x"}, 400),
    ("POST", "/shop/review/add", {"sku": "SKU-000-00001", "rating": "9"}, 400),
    ("GET", "/forum/f/no-such-forum", None, 404),
    ("GET", "/forum/f/cooking/999999/x", None, 404),
    ("GET", "/forum/user/nobody-at-all", None, 404),
    ("POST", "/forum/comment/1", {"body": "  "}, 400),
    ("POST", "/forum/vote/1", {"value": "7"}, 400),
    ("POST", "/forum/post/2/edit", {"title": "not mine"}, 403),
    ("GET", "/forum/search?q=" + "x" * 300, None, 400),
    ("GET", "/wiki/wiki/No_such_article", None, 404),
    ("POST", "/wiki/search", {"q": "x"}, 405),
])
def test_bad_requests_get_4xx_pages(sites, client, method, path, data, status):
    urls = sites.open_episode("bad")
    try:
        base = urls["shop"].rsplit("/", 1)[0]
        r = client.request(method, base + path, data=data)
        assert r.status_code == status, r.text[:300]
        assert "<h1>" in r.text and "Traceback" not in r.text
    finally:
        sites.close_episode("bad")


def test_unknown_or_malformed_episodes_are_404(sites, client):
    for path in ("/e/never-opened/shop/", "/e/bad%20id/forum/", "/e/x/unknown-site/", "/nothing"):
        r = client.get(sites.origin + path)
        assert r.status_code == 404 and "Traceback" not in r.text


def test_forks_taken_while_the_server_writes_are_consistent_snapshots(sites):
    import threading

    sites.open_episode("busy")
    stop = threading.Event()

    def write() -> None:
        with httpx.Client(timeout=30.0) as c:
            while not stop.is_set():
                c.post(f"{sites.base_urls('busy')['forum']}/comment/1", data={"body": "busy"})

    writer = threading.Thread(target=write)
    writer.start()
    counts = []
    try:
        for i in range(8):
            sites.fork_episode("busy", f"snap{i}")
            conn = sites.database(f"snap{i}", "forum")
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            counts.append(conn.execute("SELECT COUNT(*) FROM comments WHERE post_id=1").fetchone()[0])
            conn.close()
    finally:
        stop.set()
        writer.join()
        for episode in ["busy"] + [f"snap{i}" for i in range(8)]:
            sites.close_episode(episode)
    assert counts == sorted(counts) and counts[-1] > counts[0]  # each a later snapshot of a growing thread


def test_every_link_and_form_stays_inside_its_episode(sites, client):
    """A browser confined to `episode_prefix` never meets a link or form it may not follow (crawled breadth-first)."""
    import re
    from urllib.parse import urljoin

    urls = sites.open_episode("crawl")
    prefix = sites.episode_prefix("crawl")
    try:
        queue, seen = [urls[site] + "/" for site in ("shop", "forum", "wiki")], set()
        while queue and len(seen) < 60:
            url = queue.pop(0)
            if url in seen:
                continue
            seen.add(url)
            page = client.get(url)
            assert page.status_code == 200, url
            for target in re.findall(r'(?:href|action)="([^"]*)"', page.text):
                absolute = urljoin(str(page.url), target.replace("&amp;", "&"))
                assert absolute.startswith(prefix), (url, target)
                if 'href="' + target in page.text:
                    queue.append(absolute)
    finally:
        sites.close_episode("crawl")
    assert len(seen) == 60
