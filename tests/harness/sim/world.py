"""The simulated world: one seeded generator, a simulated-time event loop, a trace, and the network.

Everything random comes from the one `random.Random` the world is built with, everything runs as
callbacks and tasks of one `SimulatedTimeLoop` (FIFO ready queue, timers in (time, scheduling
order)), and every collection that is iterated is ordered, so one seed gives one run whatever
PYTHONHASHSEED is. The fingerprint hashes every trace line and every message the network carries
(its time, ends and size), so two runs of one seed agree exactly or differ visibly.

The network carries the bytes one end of a connection wrote after a random latency (so writes
reorder), may drop them or deliver them twice, and drops everything between a client and a bookie
while the two are partitioned, also what is already in flight when the partition starts. A write
always holds whole frames (both ends frame before they write), so faults lose or repeat requests
and answers, never half of one.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.harness.streamsim.loop import SimulatedTimeLoop

TRACE_EVENTS_MAX = 200  # kept for the failure report; the report prints the last 40


class World:
    def __init__(self, rng: random.Random, loop: SimulatedTimeLoop) -> None:
        self.rng = rng
        self.loop = loop
        self.faults: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()  # what the run exercised (ensemble changes, ...)
        self.trace: deque[tuple[float, tuple[Any, ...]]] = deque(maxlen=TRACE_EVENTS_MAX)
        self._fingerprint = hashlib.sha256()

    @property
    def now_ms(self) -> float:
        """Simulated milliseconds, to the microsecond (every delay is whole milliseconds: what
        is below is float noise, which must not order two events)."""
        return round(self.loop.time() * 1000, 3)

    def after(self, delay_ms: float, action: Callable[..., None], *args: Any) -> None:
        self.loop.call_later(delay_ms / 1000, action, *args)

    def log(self, *parts: Any) -> None:
        now_ms = self.now_ms
        self.trace.append((now_ms, parts))
        self._fingerprint.update(b"%.3f %s;" % (now_ms, repr(parts).encode()))

    def fingerprint_message(self, source: str, target: str, size: int) -> None:
        self._fingerprint.update(b"%.3f %s>%s %d;" % (self.now_ms, source.encode(), target.encode(), size))

    @property
    def fingerprint(self) -> str:
        return self._fingerprint.hexdigest()[:16]

    def fault(self, kind: str, *parts: Any) -> None:
        self.faults[kind] += 1
        self.log("FAULT", kind, *parts)

    def format_trace(self, last: int = 40) -> str:
        lines = [f"  t={time_ms:>9.3f} ms  " + " ".join(str(part) for part in parts)
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

    def send(self, source: str, target: str, deliver: Callable[..., None], *args: Any,
             faulty: bool = True) -> None:
        """Deliver `deliver(*args)` after a latency; `faulty`: may be dropped or duplicated (data,
        not connection set-up or resets)."""
        rng, world = self.world.rng, self.world
        if self.partitioned(source, target):
            return
        faulty = faulty and self.faulty
        if faulty and self.config.drop_probability and rng.random() < self.config.drop_probability:
            world.fault("drop", source, "->", target, _label(args))
            return
        world.after(self.latency_ms(), self._arrive, source, target, deliver, args)
        if faulty and self.config.duplicate_probability and rng.random() < self.config.duplicate_probability:
            world.fault("duplicate", source, "->", target, _label(args))
            world.after(self.latency_ms(), self._arrive, source, target, deliver, args)

    def _arrive(self, source: str, target: str, deliver: Callable[..., None], args: tuple[Any, ...]) -> None:
        if not self.partitioned(source, target):
            if args and isinstance(args[0], bytes):
                self.world.fingerprint_message(source, target, len(args[0]))
            deliver(*args)


def _label(args: tuple[Any, ...]) -> str:
    message = args[0] if args else ""
    return f"{len(message)} bytes" if isinstance(message, bytes) else str(message)
