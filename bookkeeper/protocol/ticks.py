"""Request timeouts that a stalled client does not turn into failed bookies.

The machines time requests out on their ticks (every `tick_interval_s`, 50 ms). A tick that comes
`STALL_MS` or more later than it was due means this process did not run in between: a long
garbage collection, application code that held the event loop (a loop that buffers a few hundred
thousand records without awaiting), a suspended machine. Answers that arrived meanwhile wait
unread in the sockets, and a request queued just before the stall may not even have left. So the
stall does not count: the driver's ticker (`bookkeeper.client.driver`), which knows when it was
armed (the loop last ran then), passes a late tick's `stalled_since_ms` to `on_tick`, which
restarts each outstanding request's clock at what it had used up until then. A bookie that really
does not answer is still found one timeout later. The client's connections keep the same rule for
their own request deadlines (`bookkeeper.client.connection`, whose sweep moves every deadline by
the stall).
"""

from __future__ import annotations

from typing import TypeVar

STALL_MS = 1_000  # a tick this late means a stall: twenty missed ticks, below every request timeout

K = TypeVar("K")


def discount_stall(sent: dict[K, int], stalled_since_ms: int, now_ms: int) -> None:
    """Restart each request's clock (key -> when sent, ms) at what it used up until `stalled_since_ms`."""
    for key, sent_ms in sent.items():
        sent[key] = now_ms - max(0, stalled_since_ms - sent_ms)
