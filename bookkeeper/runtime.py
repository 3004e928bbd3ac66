"""Process tuning shared by bookies and clients (the one place the cycle collector is set up), and
the one way a driver starts an effect task."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any

GC_THRESHOLDS = (50_000, 50, 100)  # Python's defaults are (700, 10, 10)


def tune_garbage_collector() -> None:
    """Requests, entries and records are freed by reference counting; the cycle collector's frequent
    passes (generation 0 every 700 container allocations, a full one every 100 of those) only add
    pauses, and a client with many writers and futures alive spent about 45% of its CPU in them
    (1,000 streams written one record at a time; a loop of `write_nowait` whose futures it gathers
    every 5,000 records ran at half the rate). Freeze what start-up allocated, so full collections
    skip it, and collect young objects less often. Cycles are still collected. Once per process:
    bookies, `dlog serve`, the benchmarks and every `Namespace` (unless `tune_gc=False`) call it."""
    global _tuned
    if _tuned:
        return
    _tuned = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


_tuned = False


def start_task(loop: asyncio.AbstractEventLoop, tasks: dict[asyncio.Task[Any], None],
               runner: Coroutine[Any, Any, None], coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[None]:
    """Run `runner` (which awaits `coroutine`) as a task kept in `tasks` until it ends. A task
    cancelled before it first ran never awaited `coroutine`: it is closed then, so Python does
    not warn that it was never awaited (a driver closing while its effects are being started)."""
    task = loop.create_task(runner)
    tasks[task] = None

    def done(finished: asyncio.Task[None]) -> None:
        tasks.pop(finished, None)
        if finished.cancelled():
            coroutine.close()  # a no-op when it ran and ended

    task.add_done_callback(done)
    return task
