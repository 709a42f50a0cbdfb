"""Single-flight: identical tool calls in flight at the same moment run once, and the cache lookup rides inside
that one run (`cached_call`), so a burst of identical calls costs one lookup and one tool call."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Awaitable, Callable, TypeVar

from rlfactory.tools.cache.base import ToolCache
from rlfactory.tools.types import ToolResult

T = TypeVar("T")


@dataclasses.dataclass
class _Flight:
    task: asyncio.Future
    waiters: int = 0


class SingleFlight:
    """Identical keys in flight at the same moment run once; every caller gets the outcome of that one run.

    Callers that join a flight do not start the work again (`joined` counts them). If a caller is cancelled the
    shared run goes on for the others; when the last caller is cancelled, the run is cancelled too.
    An exception from the run reaches every caller of that flight; the next call with the key runs afresh.
    """

    def __init__(self) -> None:
        self._flights: dict[str, _Flight] = {}
        self.joined = 0

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    async def run(self, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        flight = self._flights.get(key)
        if flight is None:
            flight = _Flight(asyncio.ensure_future(fn()))
            self._flights[key] = flight

            def _forget(_: asyncio.Future, key: str = key, flight: _Flight = flight) -> None:
                if self._flights.get(key) is flight:
                    del self._flights[key]

            flight.task.add_done_callback(_forget)
        else:
            self.joined += 1
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if not flight.task.done() and flight.waiters == 1:
                flight.task.cancel()
            raise
        finally:
            flight.waiters -= 1


async def cached_call(
    cache: ToolCache,
    flight: SingleFlight,
    key: str,
    call: Callable[[], Awaitable[ToolResult]],
    *,
    ttl_s: float | None,
) -> ToolResult:
    """Look up `key`; on a miss run `call()` once for all concurrent callers and store a successful result.

    The lookup sits inside the flight so that a burst of identical calls does one lookup and one tool call.
    Each caller gets its own copy of the result (callers set their own `id`).
    """

    async def lookup_then_call() -> ToolResult:
        hit = await cache.get(key)
        if hit is not None:
            return hit
        result = await call()
        await cache.set(key, result, ttl_s)
        return result

    result = await flight.run(key, lookup_then_call)
    return result.model_copy()
