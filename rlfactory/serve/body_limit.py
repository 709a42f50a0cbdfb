"""A cap on request bodies for the server's ASGI app: 413 before an oversize body is read.

A body whose Content-Length is over the cap is answered at once, from the headers, and never held (the server
drops its bytes as they arrive). A body sent
without a length (chunked) is counted as it arrives, and the read fails with `BodyTooLarge` (a 413 once the app's
error handler turns it into a response) as soon as the count passes the cap, so at most the cap is ever held.
Left out: per-client quotas and rate limits (put a reverse proxy in front for those).
"""
from __future__ import annotations

import json
from typing import Any

from rlfactory.serve.request import RequestError


class BodyTooLarge(RequestError):
    """A body over the cap (HTTP 413)."""
    def __init__(self, limit_bytes: int, got: str):
        super().__init__(f"the request body is {got}; this server takes at most {limit_bytes:,} bytes "
                         f"(rlfactory serve --max-body-mb)", status=413)


class BodyLimit:
    """ASGI middleware: refuse bodies over `limit_bytes` with 413 (OpenAI-style JSON error)."""

    def __init__(self, app: Any, limit_bytes: int):
        self.app, self.limit_bytes = app, limit_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit_bytes:
            await _send_error(send, BodyTooLarge(self.limit_bytes, f"{int(length):,} bytes"))
            return
        received = 0

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit_bytes:
                    raise BodyTooLarge(self.limit_bytes, f"over {received:,} bytes")
            return message

        await self.app(scope, counted, send)


async def _send_error(send: Any, exc: RequestError) -> None:
    body = json.dumps({"error": {"message": str(exc), "type": "invalid_request_error", "code": exc.status}}).encode()
    # The connection stays open: the server discards the rest of the body as it arrives (a client that sends all
    # of it before reading, as most do, then reads the 413 instead of a reset connection).
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
