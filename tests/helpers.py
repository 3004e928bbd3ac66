"""Small helpers shared by tests: wait for conditions by polling with a deadline, never by sleeping."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

POLL_INTERVAL_S = 0.02


async def eventually(predicate: Callable[[], T | Awaitable[T]], timeout_s: float = 10.0,
                     interval_s: float = POLL_INTERVAL_S, message: str = "") -> T:
    """Poll ``predicate`` (plain or async) until it returns something truthy; return that.

    Fails the test with AssertionError if ``timeout_s`` passes first. Exceptions from the
    predicate propagate: a condition that errors is a failure, not "not yet".
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout_s}s: {what} (last value {result!r})")
        await asyncio.sleep(interval_s)
