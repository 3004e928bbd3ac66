"""The simulated world: an integer-millisecond clock, one event queue, a trace, and the network.

Everything random comes from the one `random.Random` the world is built with, and every
collection that is iterated is ordered (lists, dicts, sorted sets), so one seed gives one run
whatever PYTHONHASHSEED is.

The network carries a message after a random latency (so messages reorder), may drop it or deliver
it twice, and drops everything between a client and a bookie while the two are partitioned, also
messages already in flight when the partition starts.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRACE_EVENTS_MAX = 200  # kept for the failure report; the report prints the last 40


class World:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now_ms = 0
        self.events_processed = 0
        self.faults: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()  # what the run exercised (ensemble changes, ...)
        self.trace: deque[tuple[int, tuple[Any, ...]]] = deque(maxlen=TRACE_EVENTS_MAX)
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._sequence = 0
        self._fingerprint = hashlib.sha256()  # of every event and log line: equal runs, equal hash

    def at(self, time_ms: int, action: Callable[..., None], *args: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._queue, (max(time_ms, self.now_ms), self._sequence, action, args))

    def after(self, delay_ms: int, action: Callable[..., None], *args: Any) -> None:
        self.at(self.now_ms + delay_ms, action, *args)

    def step(self) -> bool:
        """Run the next event; False when nothing is left."""
        if not self._queue:
            return False
        time_ms, _, action, args = heapq.heappop(self._queue)
        self.now_ms = time_ms
        self.events_processed += 1
        self._fingerprint.update(b"%d %s;" % (time_ms, action.__qualname__.encode()))
        action(*args)
        return True

    def log(self, *parts: Any) -> None:
        self.trace.append((self.now_ms, parts))
        self._fingerprint.update(repr(parts).encode())

    @property
    def fingerprint(self) -> str:
        return self._fingerprint.hexdigest()[:16]

    def fault(self, kind: str, *parts: Any) -> None:
        self.faults[kind] += 1
        self.log("FAULT", kind, *parts)

    def format_trace(self, last: int = 40) -> str:
        lines = [f"  t={time_ms:>6} ms  " + " ".join(str(part) for part in parts)
                 for time_ms, parts in list(self.trace)[-last:]]
        return "\n".join(lines)


@dataclass(slots=True)
class NetworkConfig:
    latency_ms_min: int = 1
    latency_ms_max: int = 12
    spike_probability: float = 0.02  # a slow message: reorders far behind later ones
    spike_ms_max: int = 150
    drop_probability: float = 0.0
    duplicate_probability: float = 0.0


class Network:
    def __init__(self, world: World, config: NetworkConfig) -> None:
        self.world = world
        self.config = config
        self.faulty = True  # drops and duplicates only while faults are on
        self._partitions: dict[tuple[str, str], int] = {}  # (client, bookie) -> partition id
        self._partition_count = 0

    def latency_ms(self) -> int:
        rng, config = self.world.rng, self.config
        latency = rng.randint(config.latency_ms_min, config.latency_ms_max)
        if rng.random() < config.spike_probability:
            latency += rng.randint(0, config.spike_ms_max)
        return latency

    def partitioned(self, a: str, b: str) -> bool:
        return (a, b) in self._partitions or (b, a) in self._partitions

    def partition(self, client: str, bookie: str) -> int:
        self._partition_count += 1
        self._partitions[(client, bookie)] = self._partition_count
        return self._partition_count

    def heal(self, client: str, bookie: str, partition_id: int) -> None:
        if self._partitions.get((client, bookie)) == partition_id:
            del self._partitions[(client, bookie)]

    def heal_all(self) -> None:
        self._partitions.clear()

    def send(self, source: str, target: str, deliver: Callable[..., None], *args: Any) -> None:
        rng = self.world.rng
        if self.partitioned(source, target):
            return
        if self.faulty and self.config.drop_probability and rng.random() < self.config.drop_probability:
            self.world.fault("drop", source, "->", target, _label(args))
            return
        self.world.after(self.latency_ms(), self._arrive, source, target, deliver, args)
        if (self.faulty and self.config.duplicate_probability
                and rng.random() < self.config.duplicate_probability):
            self.world.fault("duplicate", source, "->", target, _label(args))
            self.world.after(self.latency_ms(), self._arrive, source, target, deliver, args)

    def _arrive(self, source: str, target: str, deliver: Callable[..., None], args: tuple[Any, ...]) -> None:
        if not self.partitioned(source, target):
            deliver(*args)


def _label(args: tuple[Any, ...]) -> str:
    message = args[0] if args else ""
    label = getattr(message, "label", None)
    return label() if label is not None else str(message)
