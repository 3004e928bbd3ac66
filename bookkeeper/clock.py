"""The one clock port: every layer that needs the time takes a `Clock` instead of reading `time`.

Two readings, never mixed: `wall_ms()` is epoch milliseconds, for what is stored or shown (record
timestamps, segment creation times, metadata ctimes); `monotonic_s()` only ever goes forward, for
intervals and deadlines. `SYSTEM_CLOCK` reads the machine; `ManualClock` is moved by hand (tests,
simulators). Sans-IO state machines take neither: they are handed `now_ms` with each event.

A component that decides by the time (timeouts, deadlines, pacing, expiry) takes a `Clock`, so a
simulator can drive it. Code that only measures, or that no simulator runs (benchmarks, tools,
start-up waits), reads the system clock through the functions at the end of this module:
`wall_ms()`, `monotonic_s()`, `perf_s()` (the finest interval clock, for latencies and benchmark
timings) and `process_s()` (CPU seconds of this process). Nothing else in shipped code reads the
time (tests/unit/test_one_of_each.py checks it); sleeping is not reading.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the epoch."""

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""


class SystemClock:
    __slots__ = ()

    def wall_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic_s(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to."""

    __slots__ = ("_wall_ms", "_monotonic_s")

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic_s: float = 0.0) -> None:
        self._wall_ms = wall_ms
        self._monotonic_s = monotonic_s

    def wall_ms(self) -> int:
        return self._wall_ms

    def monotonic_s(self) -> float:
        return self._monotonic_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._monotonic_s += seconds
        self._wall_ms += int(seconds * 1000)


SYSTEM_CLOCK: Clock = SystemClock()


def wall_ms() -> int:
    """The system clock's epoch milliseconds (for code that has no injected clock to ask)."""
    return SYSTEM_CLOCK.wall_ms()


def monotonic_s() -> float:
    """The system clock's monotonic seconds (for code that has no injected clock to ask)."""
    return SYSTEM_CLOCK.monotonic_s()


def loop_s(loop: asyncio.AbstractEventLoop) -> float:
    """The event loop's own clock, which its timers keep (monotonic seconds; a simulator's loop
    keeps simulated time): for code that compares when a timer fired with when it was armed."""
    return loop.time()


def perf_s() -> float:
    """Seconds on the finest clock that never goes back, for measuring short intervals (a
    latency, an fsync, a benchmark step); only differences mean anything."""
    return time.perf_counter()


def process_s() -> float:
    """CPU seconds (user and system) this process has used; only differences mean anything."""
    return time.process_time()
