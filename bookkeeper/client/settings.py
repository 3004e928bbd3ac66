"""The ledger client's settings, and the context its drivers run in.

Drivers (ledger handles, range reads, recovery) get a `DriverContext`: the bookie pool, the
metadata store, these settings, the writable-bookie watch, and the clock and random numbers their
retries wait by (the ledger simulator's, on simulated time). They never reach back into the
`BookKeeper` object that made them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import ConfigError

if TYPE_CHECKING:
    from bookkeeper.client.pool import BookiePool
    from bookkeeper.meta.store import MetadataStore


@dataclass(frozen=True, slots=True)
class ClientSettings:
    add_timeout_s: float = 5.0
    read_timeout_s: float = 5.0
    speculative_read_ms: int = 500
    explicit_lac_interval_ms: int = 50
    eager_lac: bool = True  # send the LAC as soon as the pipeline drains (tail latency)
    tick_interval_s: float = 0.05
    pending_adds_max: int = 10_000  # appends of one ledger handle awaiting their acknowledgement
    zk_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("add_timeout_s", "read_timeout_s", "tick_interval_s", "zk_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("speculative_read_ms", "explicit_lac_interval_ms", "pending_adds_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")

    @property
    def add_timeout_ms(self) -> int:
        return int(self.add_timeout_s * 1000)

    @property
    def read_timeout_ms(self) -> int:
        return int(self.read_timeout_s * 1000)


@dataclass(frozen=True, slots=True)
class DriverContext:
    pool: BookiePool
    store: MetadataStore
    settings: ClientSettings
    watch_writable: Callable[[Callable[[list[str]], None]], Callable[[], None]]
    clock: Clock = SYSTEM_CLOCK
    jitter: Callable[[], float] = random.random  # draws of the retries' back-off spread
