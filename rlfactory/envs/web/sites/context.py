"""What every site handler needs from a request: its episode's database, its base path, validated parameters.

The episode is the first path segment after `/e/` (`/e/<episode>/<site>/...`): the URL itself confines a browser
context to its episode, and one server process serves every episode. A request for an episode that is not open, or
a parameter that does not parse, raises `HTTPException` (404 / 400), which the app renders as an HTML error page.
"""
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse

from rlfactory.envs.web.sites.store import EpisodeStore, UnknownEpisode, connect


def base(request: Request, site: str) -> str:
    """The site's root path in this episode, e.g. `/e/ep1/shop` (links are absolute paths under it)."""
    return f"/e/{request.path_params['episode']}/{site}"


@contextlib.contextmanager
def episode_db(request: Request, site: str) -> Iterator[sqlite3.Connection]:
    store: EpisodeStore = request.app.state.store
    try:
        path = store.path(request.path_params["episode"], site)
    except (UnknownEpisode, ValueError):
        raise HTTPException(404, f"No open episode {request.path_params['episode']!r} on this server.") from None
    conn = connect(path)
    try:
        with conn:  # commit on success, roll back if the handler raised
            yield conn
    finally:
        conn.close()


def bad(detail: str) -> HTTPException:
    return HTTPException(400, detail)


def int_param(value: str | None, name: str, *, default: int | None = None, lo: int = 0, hi: int = 10**9) -> int:
    if value in (None, ""):
        if default is None:
            raise bad(f"Missing {name}.")
        return default
    try:
        number = int(value)
    except ValueError:
        raise bad(f"{name} must be a whole number, got {value!r}.") from None
    if not lo <= number <= hi:
        raise bad(f"{name} must be between {lo} and {hi}, got {number}.")
    return number


def text_param(form: dict, name: str, label: str, *, max_len: int = 2000, required: bool = True) -> str:
    value = str(form.get(name) or "").strip()
    if required and not value:
        raise bad(f"Please fill in {label}.")
    if len(value) > max_len:
        raise bad(f"{label} is too long (at most {max_len} characters).")
    return value


def see_other(path: str) -> RedirectResponse:
    """Post/redirect/get: a form's POST answers with a redirect to the page showing its result."""
    return RedirectResponse(path, status_code=303)
