"""`OriginProxy`: the HTTP proxy one episode's browser context talks through, which lets through only the episode's
origins (`OriginPolicy`) — the containment that sees every request the browser makes, each hop of a redirect
chain included (a Playwright route sees only a chain's first URL).

It listens on 127.0.0.1 on a port of its own; the context is made with `proxy={"server": proxy.url}` (Playwright
then proxies loopback too: `<-loopback>`). Plain HTTP requests arrive in absolute form (`GET http://host:port/p`)
and are sent on to their origin with `Connection: close`, one request per connection (the browser opens a new one
to the proxy for the next: loopback connections cost well under a millisecond, and no request can ride an
upstream connection opened for another origin); a response that is a download is answered `204 No Content`
instead (the page stays; the file never reaches the browser).
`CONNECT host:port` (https, wss) is tunnelled when an allowed
origin has that host and port. Anything else is answered 403 with the reason, which also becomes a note for the
episode's next observation.

It also contains a browser that is not ours: `python -m rlfactory.envs.web.browser.proxy --allow
http://127.0.0.1:8001 [--allow URL ...] --port 8899`, then the official Playwright MCP server with
`--proxy-server http://127.0.0.1:8899` reaches only those sites (its own `--allowed-origins` does not see redirects).

Left out: HTTP/2 and pipelining toward the proxy (Chromium speaks HTTP/1.1 to an http proxy), and proxy
authentication (the port is the episode's identity; it is reachable from this host only).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
from typing import Callable
from urllib.parse import urlsplit

from rlfactory.envs.web.browser.policy import OriginPolicy

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
QUIET_HOSTS = ("googleapis.com", "google.com", "gstatic.com", "gvt1.com", "googleusercontent.com")
"""Chromium's own services (autofill, safe browsing) reach for these through the context's proxy: refused like
anything else, but not noted for the model (it did not ask for them)."""
_HOP_HEADERS = {b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"}


class OriginProxy:
    def __init__(self, policy: OriginPolicy, note: Callable[[str], None]):
        self.policy = policy
        self.note = note
        self.refused = 0
        self.forwarded = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.url = ""
        self.on_forward: Callable[[str, str, bytes], None] | None = None
        """Called with (method, absolute URL, request header bytes) of each request let through (the web
        environment's gate learns a foreign browser's last page from it)."""

    async def start(self, port: int = 0) -> OriginProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, limit=MAX_HEAD_BYTES)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        """Stop listening and end the connections still open (their handlers see the end of their stream; they
        are not cancelled, which asyncio's stream callbacks would log as errors)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            logger.debug("proxy connection ended: %r", e)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, _, rest = head.partition(b"\r\n")
        method, target, version = line.decode("latin-1").split(" ", 2)
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            host = host.strip("[]")
            allowed = any(urlsplit(o).hostname == host.lower() and str(urlsplit(o).port) == port
                          for o in self.policy.origins)
            if not allowed:
                await self._refuse(writer, host, f"a connection to {target} was refused: it is not one of this "
                                           f"episode's sites ({', '.join(sorted(self.policy.origins))})")
                return
            upstream = await self._connect(writer, host, int(port))
            if upstream is None:
                return
            upstream_r, upstream_w = upstream
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            await _pipe_both(reader, writer, upstream_r, upstream_w)
            return
        why = self.policy.refusal(target)
        parts = urlsplit(target)
        if why is not None or not parts.hostname:
            await self._refuse(writer, parts.hostname or "",
                               f"a request was refused: {why or target + ' is not an absolute URL'}")
            return
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = [h for h in rest.split(b"\r\n") if h and h.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
        upstream = await self._connect(writer, parts.hostname, parts.port or 80)
        if upstream is None:
            return
        upstream_r, upstream_w = upstream
        upstream_w.write(f"{method} {path} {version}\r\n".encode("latin-1") + b"\r\n".join(headers)
                         + b"\r\nConnection: close\r\n\r\n")
        self.forwarded += 1
        if self.on_forward is not None:
            self.on_forward(method, target, rest)
        await _pipe_both(reader, writer, upstream_r, upstream_w, screen=lambda head: self._screen(target, head))

    def _screen(self, url: str, head: bytes) -> bytes | None:
        """What to send the browser instead of a response whose head is `head`, or None to pass it on: a download
        (`Content-Disposition: attachment`) becomes `204 No Content`, which leaves the page where it was, and a
        note — here, before the browser has the response, so the step that asked for it sees the note."""
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-disposition" and value.strip().lower().startswith(b"attachment"):
                filename = re.search(rb'filename="?([^";]+)', value)
                shown = filename.group(1).decode("latin-1") if filename else url
                self.note(f"a download of {shown!r} was refused")
                return b"HTTP/1.1 204 No Content\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        return None

    async def _connect(self, writer: asyncio.StreamWriter, host: str,
                       port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to an allowed site, or None after answering 502 (the site is down: the page says so)."""
        try:
            return await asyncio.open_connection(host, port)
        except OSError as e:
            body = f"The site at {host}:{port} did not answer ({e.strerror or e}).".encode()
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
                         + f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            return None

    async def _refuse(self, writer: asyncio.StreamWriter, host: str, why: str) -> None:
        self.refused += 1
        if host.endswith(QUIET_HOSTS):
            logger.debug("proxy: %s", why)
        else:
            self.note(why)
        body = f"Refused by the episode's browser: {why}.".encode()
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()


async def _pipe_both(a_r: asyncio.StreamReader, a_w: asyncio.StreamWriter, b_r: asyncio.StreamReader,
                     b_w: asyncio.StreamWriter, screen: Callable[[bytes], bytes | None] | None = None) -> None:
    """Copy bytes both ways until the upstream side (b) closes; then close both. `screen(head)` sees the upstream
    response's head first and may answer in its place."""

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        except ConnectionError:
            pass

    upload = asyncio.ensure_future(copy(a_r, b_w))
    try:
        if screen is not None:
            head = await b_r.readuntil(b"\r\n\r\n")
            instead = screen(head)
            a_w.write(head if instead is None else instead)
            await a_w.drain()
            if instead is not None:
                return
        await copy(b_r, a_w)
    finally:
        upload.cancel()
        b_w.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="An HTTP proxy on 127.0.0.1 that forwards only the given origins (to "
                                            "contain a browser: --proxy-server http://127.0.0.1:PORT).")
    p.add_argument("--allow", action="append", required=True, metavar="URL", help="an allowed site's base URL")
    p.add_argument("--port", type=int, default=0, help="the port to listen on (0: any free port)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    policy = OriginPolicy.of(args.allow)

    async def serve() -> None:
        proxy = await OriginProxy(policy, lambda why: logger.info("refused: %s", why)).start(args.port)
        logger.info("proxy listening on %s, forwarding only %s", proxy.url, ", ".join(sorted(policy.origins)))
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
