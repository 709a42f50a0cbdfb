"""A tiny real web site (starlette on uvicorn, 127.0.0.1, a port of its own) that has one of everything the browser
must handle: links, a search form with a select, a sign-in that sets a cookie, a disabled and a hidden button, a
download, a pop-up, an alert, links to `file://`, to `data:` and to another site, and redirects to that other site
(one hop and two).
The browser tests, `bench/web_env.py` and the Playwright-MCP check run against it; the real shop and forum are in
`rlfactory/envs/web/sites/`.

    with ProbeSites() as sites:      # the probe site and an "outside" site that counts every request it gets
        sites.url, sites.outside_url, sites.outside_hits
"""
from __future__ import annotations

import html
import socket
import threading
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

PRODUCTS = ["Red shirt", "Blue shirt", "Green hat", "Black shoes", "White socks"]


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><html><head><title>{html.escape(title)}</title></head>"
                        f"<body>{body}</body></html>")


def probe_app(outside_url: str) -> Starlette:
    """The probe site; `outside_url` is the site it links and redirects out to."""

    async def home(request: Request) -> Response:
        user = request.cookies.get("user")
        return _page("Probe home", f"""
<h1>Probe shop</h1>
<p>{'Signed in as ' + html.escape(user) if user else 'Not signed in'}</p>
<nav><a href="/products">Products</a> <a href="/account">Account</a> <a href="{outside_url}/">Outside site</a>
<a href="file:///etc/passwd">Local file</a> <a href="data:text/html,<h1>data</h1>">Data page</a>
<a href="/away">Redirect away</a> <a href="/hop">Redirect twice</a> <a href="/download">Download report</a>
<a href="/products" target="_blank">Products in a new window</a></nav>
<form action="/search" method="get"><label>Search <input type="text" name="q"></label>
<label>Sort <select name="sort"><option>Price</option><option>Name</option></select></label>
<button type="submit">Go</button></form>
<form action="/login" method="post"><label>Name <input type="text" name="name"></label>
<button type="submit">Sign in</button></form>
<button onclick="window.open('/products')">Open pop-up</button>
<button onclick="alert('Hello from the probe')">Say hello</button>
<button onclick="document.getElementById('answer').textContent = confirm('Sure?') ? 'confirmed' : 'cancelled'">
Ask</button> <span id="answer"></span>
<button disabled>Unavailable</button> <button style="display:none">Secret</button>
<button id="target" onclick="this.textContent = 'Target clicked'">Target</button>
<style>.sub {{ display: none; }} .menu:hover .sub {{ display: block; }}</style>
<div class="menu">Menu<div class="sub"><a href="/account">Account from the menu</a></div></div>
<div style="height:3000px">Tall section</div><p>Footer text</p>""")

    async def products(request: Request) -> Response:
        items = "".join(f'<li><a href="/product/{i}">{html.escape(p)}</a></li>' for i, p in enumerate(PRODUCTS))
        return _page("Products", f"<h1>Products</h1><ul>{items}</ul><a href='/'>Home</a>")

    async def product(request: Request) -> Response:
        i = int(request.path_params["i"])
        if not 0 <= i < len(PRODUCTS):
            return PlainTextResponse("no such product", status_code=404)
        return _page(PRODUCTS[i], f"<h1>{html.escape(PRODUCTS[i])}</h1><p>Price: ${10 + i}.00</p>"
                                  f"<a href='/products'>All products</a>")

    async def search(request: Request) -> Response:
        q, sort = request.query_params.get("q", ""), request.query_params.get("sort", "Price")
        found = [p for p in PRODUCTS if q.lower() in p.lower()]
        found.sort() if sort == "Name" else None
        items = "".join(f"<li>{html.escape(p)}</li>" for p in found)
        return _page("Search", f"<h1>Results for {html.escape(q)} by {html.escape(sort)}</h1><ul>{items}</ul>")

    async def login(request: Request) -> Response:
        form = await request.form()
        response = RedirectResponse("/account", status_code=303)
        response.set_cookie("user", str(form.get("name", "")), path="/")
        return response

    async def account(request: Request) -> Response:
        user = request.cookies.get("user")
        return _page("Account", f"<h1>Account</h1><p>{'Signed in as ' + html.escape(user) if user else 'Nobody'}</p>")

    async def download(request: Request) -> Response:
        return Response(b"secret report\n", media_type="application/octet-stream",
                        headers={"Content-Disposition": 'attachment; filename="report.bin"'})

    async def away(request: Request) -> Response:
        return RedirectResponse(f"{outside_url}/from-redirect", status_code=302)

    async def hop(request: Request) -> Response:
        return RedirectResponse("/away", status_code=302)

    return Starlette(routes=[Route("/hop", hop), Route("/", home), Route("/products", products),
                             Route("/product/{i:int}", product),
                             Route("/search", search), Route("/login", login, methods=["POST"]),
                             Route("/account", account), Route("/download", download), Route("/away", away)])


def outside_app(hits: list[str]) -> Starlette:
    """A site the episode must never reach; it records every path asked of it."""

    async def anything(request: Request) -> Response:
        hits.append(request.url.path)
        return _page("Outside", "<h1>You escaped</h1>")

    async def hop(request: Request) -> Response:
        return RedirectResponse("/away", status_code=302)

    return Starlette(routes=[Route("/hop", hop), Route("/{path:path}", anything, methods=["GET", "POST"])])


class Served:
    """A starlette app served by uvicorn on 127.0.0.1 on a free port, on a thread."""

    def __init__(self, app: Any):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name=f"site-{self.url}")

    def start(self) -> Served:
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            self.thread.join(0.05)
        raise RuntimeError(f"the site at {self.url} did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


class ProbeSites:
    """The probe site and the outside site, started together."""

    def __init__(self) -> None:
        self.outside_hits: list[str] = []
        self.outside = Served(outside_app(self.outside_hits))
        self.outside_url = self.outside.url
        self.site = Served(probe_app(self.outside_url))
        self.url = self.site.url

    def __enter__(self) -> ProbeSites:
        self.outside.start()
        self.site.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.site.stop()
        self.outside.stop()
