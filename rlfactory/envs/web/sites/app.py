"""The ASGI application serving every episode of every site: `/e/<episode>/shop/...`, `.../forum/...`, `.../wiki/...`.

Errors are pages, never tracebacks: an unknown path, episode, product or post is a 404 page, a parameter or form
that does not parse a 400 page, a wrong method a 405 page; an unexpected exception is logged and answered with a
plain 500 page. `/health` answers "ok" for supervisors. Left out: authentication (the episode id in the path is the
capability; the server listens on 127.0.0.1 only).
"""
from __future__ import annotations

import logging
import re

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse
from starlette.routing import Mount, Route

from rlfactory.envs.web.sites import forum_routes, shop_catalog, shop_orders, wiki
from rlfactory.envs.web.sites.html import error_page
from rlfactory.envs.web.sites.store import EpisodeStore

logger = logging.getLogger(__name__)

_HOME = re.compile(r"^(/e/[A-Za-z0-9_-]{1,64}/(?:shop|forum|wiki))(?:/|$)")


def _home(request: Request) -> str | None:
    m = _HOME.match(request.url.path)
    return f"{m.group(1)}/" if m else None


async def http_error(request: Request, exc: Exception) -> HTMLResponse:
    status = getattr(exc, "status_code", 400)
    detail = getattr(exc, "detail", "") or "The request could not be served."
    return HTMLResponse(error_page(status, str(detail), _home(request)), status_code=status,
                        headers=getattr(exc, "headers", None))


async def server_error(request: Request, exc: Exception) -> HTMLResponse:
    logger.exception("the web sites failed on %s %s", request.method, request.url.path, exc_info=exc)
    return HTMLResponse(error_page(500, "Something went wrong on our side.", _home(request)), status_code=500)


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def build_app(store: EpisodeStore) -> Starlette:
    routes = [
        Route("/health", health),
        Mount("/e/{episode}/shop", routes=shop_catalog.ROUTES + shop_orders.ROUTES),
        Mount("/e/{episode}/forum", routes=forum_routes.ROUTES),
        Mount("/e/{episode}/wiki", routes=wiki.ROUTES),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.store = store
    return app
