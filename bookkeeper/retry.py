"""The one retry helper: bounded attempts, exponential back-off with jitter, an optional deadline.

    POLICY = Backoff(attempts_max=8, delay_s_first=0.05, delay_s_max=2.0, deadline_s=10.0)
    result = await retry(lambda: store.write(...), POLICY, what="ledger 7 metadata write")

Whether an error is worth another try is the error's own `retryable` flag (bookkeeper.errors),
unless the caller passes `retry_on`. Sleep, randomness and the clock are injectable, so tests and
simulators run it on simulated time. `Backoff.delays_s` gives the same schedule to code that does
its own waiting (a sans-IO machine, a thread).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import ConfigError, DlogError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """At most `attempts_max` attempts; before attempt n+1 wait delay_s_first * multiplier**(n-1),
    capped at `delay_s_max`, spread by +-`jitter_fraction`; never past `deadline_s` after the
    first attempt began (None: no deadline)."""

    attempts_max: int
    delay_s_first: float = 0.05
    delay_s_max: float = 2.0
    multiplier: float = 2.0
    jitter_fraction: float = 0.2
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.attempts_max < 1:
            raise ConfigError(f"attempts_max must be >= 1, got {self.attempts_max}")
        if self.delay_s_first < 0 or self.delay_s_max < self.delay_s_first or self.multiplier < 1:
            raise ConfigError(f"bad back-off delays: first {self.delay_s_first} s, max "
                              f"{self.delay_s_max} s, multiplier {self.multiplier}")
        if not 0 <= self.jitter_fraction <= 1:
            raise ConfigError(f"jitter_fraction must be within 0..1, got {self.jitter_fraction}")

    def delays_s(self, rng: Callable[[], float] = random.random) -> Iterator[float]:
        """The waits between attempts: attempts_max - 1 of them."""
        delay_s = self.delay_s_first
        for _ in range(self.attempts_max - 1):
            spread = 1 + self.jitter_fraction * (2 * rng() - 1)
            yield min(self.delay_s_max, delay_s) * spread
            delay_s *= self.multiplier


def is_retryable(error: BaseException) -> bool:
    """The error's own verdict; anything that is not a DlogError (a bug) is never retried."""
    return isinstance(error, DlogError) and error.retryable


async def retry(operation: Callable[[], Awaitable[T]], policy: Backoff, *, what: str,
                retry_on: Callable[[BaseException], bool] = is_retryable,
                sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                rng: Callable[[], float] = random.random, clock: Clock = SYSTEM_CLOCK,
                quiet: bool = False) -> T:
    """Run `operation` until it succeeds, raises what `retry_on` refuses, or the attempts or the
    deadline run out (then the last error is raised). Each retry is logged at INFO (DEBUG when
    `quiet`: for expected contention such as a lost compare-and-set)."""
    started_s = clock.monotonic_s()
    delays = policy.delays_s(rng)
    attempt = 0
    while True:
        attempt += 1
        try:
            return await operation()
        except Exception as exc:
            if not retry_on(exc):
                raise
            delay_s = next(delays, None)
            if delay_s is None:
                raise
            if policy.deadline_s is not None:
                remaining_s = policy.deadline_s - (clock.monotonic_s() - started_s)
                if remaining_s <= 0:
                    raise
                delay_s = min(delay_s, remaining_s)
            log.log(logging.DEBUG if quiet else logging.INFO,
                    "%s failed (attempt %d of %d, next in %.2f s): %s", what, attempt,
                    policy.attempts_max, delay_s, exc)
            await sleep(delay_s)
