"""The one clock port: every layer that needs the time takes a `Clock` instead of reading `time`.

Two readings, never mixed: `wall_ms()` is epoch milliseconds, for what is stored or shown (record
timestamps, segment creation times, metadata ctimes); `monotonic_s()` only ever goes forward, for
intervals and deadlines. `SYSTEM_CLOCK` reads the machine; `ManualClock` is moved by hand (tests,
simulators). Sans-IO state machines take neither: they are handed `now_ms` with each event.
"""

from __future__ import annotations

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
