"""The one sync-over-async bridge: an event loop in a daemon thread that blocking code hands
coroutines to. `dlog.connect()` (scripts) and the Spark source and sink (worker processes) both
run their Namespace on one of these.

Every call waits with a timeout, so a hung cluster cannot block a caller forever, and a call from
the loop's own thread (which would wait for itself) is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable
from typing import TypeVar

from bookkeeper.errors import invariant

T = TypeVar("T")
CALL_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0


class LoopThread:
    def __init__(self, name: str = "dlog-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, awaitable: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Start a coroutine on the loop; the caller waits on the returned future."""
        if threading.current_thread() is self._thread:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never to run: no "never awaited" warning
            invariant(False, "a blocking call from the bridge's own loop would wait for itself forever")

        async def run() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def call(self, awaitable: Awaitable[T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run a coroutine on the loop and wait for its result (at most `timeout_s`)."""
        return self.submit(awaitable).result(timeout_s)

    def stop(self) -> None:
        """Stop the loop and, once its thread has ended, close it (its selector's sockets)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()
