"""An in-memory metadata store for one ledger: versioned compare-and-set, stalls and lost replies.

The metadata is kept serialized (`to_bytes`) and parsed on every read, so the format round trip is
part of every run. A stall delays every request that arrives while it lasts (ZooKeeper paused during
an ensemble change); a lost reply applies the write but the client only sees a connection loss, so
its driver retries the same compare-and-set and meets its own write as a conflict. Every accepted
write is checked against the allowed state transitions and reported to the history.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState

if TYPE_CHECKING:
    from .world import World

STORE_LATENCY_MS_MIN = 1
STORE_LATENCY_MS_MAX = 6
STORE_SPIKE_PROBABILITY = 0.05
STORE_SPIKE_MS_MAX = 300

_ALLOWED = {
    (LedgerState.OPEN, LedgerState.OPEN),  # ensemble change
    (LedgerState.OPEN, LedgerState.IN_RECOVERY),
    (LedgerState.OPEN, LedgerState.CLOSED),
    (LedgerState.IN_RECOVERY, LedgerState.CLOSED),
}


class SimMetadataStore:
    def __init__(self, world: World, metadata: LedgerMetadata,
                 on_write: Callable[[str, LedgerMetadata, LedgerMetadata], None]) -> None:
        self.world = world
        self._data = metadata.to_bytes()
        self.version = 0
        self.stalled_until_ms = 0
        self.replies_to_lose = 0
        self.on_write = on_write  # (client, old, new): the history checks transitions and A9

    @property
    def current(self) -> LedgerMetadata:
        return LedgerMetadata.from_bytes(self._data)

    def _delay_ms(self) -> int:
        rng = self.world.rng
        delay = rng.randint(STORE_LATENCY_MS_MIN, STORE_LATENCY_MS_MAX)
        if rng.random() < STORE_SPIKE_PROBABILITY:  # one slow request or reply, not a stall
            delay += rng.randint(0, STORE_SPIKE_MS_MAX)
        return delay + max(0, self.stalled_until_ms - self.world.now_ms)

    def stall(self, duration_ms: int) -> None:
        self.stalled_until_ms = max(self.stalled_until_ms, self.world.now_ms + duration_ms)

    def heal(self) -> None:
        self.stalled_until_ms = 0
        self.replies_to_lose = 0

    def read(self, on_read: Callable[[LedgerMetadata, int], None]) -> None:
        def answer() -> None:
            metadata, version = self.current, self.version  # read when the request arrives
            self.world.after(self._delay_ms(), on_read, metadata, version)

        self.world.after(self._delay_ms(), answer)

    def write(self, client: str, metadata: LedgerMetadata, expected_version: int,
              on_written: Callable[[int], None], on_conflict: Callable[[], None],
              on_lost: Callable[[], None]) -> None:
        self.world.after(self._delay_ms(), self._apply, client, metadata, expected_version,
                         on_written, on_conflict, on_lost)

    def _apply(self, client: str, metadata: LedgerMetadata, expected_version: int,
               on_written: Callable[[int], None], on_conflict: Callable[[], None],
               on_lost: Callable[[], None]) -> None:
        if expected_version != self.version:
            self.world.log("store", "conflict", client, f"expected v{expected_version}, at v{self.version}")
            self.world.stats["metadata conflicts"] += 1
            self.world.after(self._delay_ms(), on_conflict)
            return
        old = self.current
        self._data = metadata.to_bytes()
        self.version += 1
        self.world.log("store", f"v{self.version}", client, metadata.state.value,
                       f"last={metadata.last_entry_id}", [first for first, _ in metadata.ensembles])
        self.on_write(client, old, LedgerMetadata.from_bytes(self._data))
        change = "ensemble changes" if old.state is metadata.state else f"to {metadata.state.value}"
        self.world.stats[f"metadata {change}"] += 1
        if self.replies_to_lose > 0:
            self.replies_to_lose -= 1
            self.world.fault("zk_reply_lost", client, f"v{self.version}")
            self.world.after(self._delay_ms(), on_lost)
            return
        self.world.after(self._delay_ms(), on_written, self.version)


def transition_problem(old: LedgerMetadata, new: LedgerMetadata) -> str | None:
    """Why this write should never have been accepted, or None."""
    if (old.state, new.state) not in _ALLOWED:
        return f"metadata went from {old.state.value} to {new.state.value}"
    if (old.ensemble_size, old.write_quorum, old.ack_quorum) != (
            new.ensemble_size, new.write_quorum, new.ack_quorum):
        return "quorum sizes changed"
    if old.password_hash != new.password_hash or old.digest_type != new.digest_type:
        return "password or digest type changed"
    if new.state is LedgerState.CLOSED:
        return None  # the close may add fragments made during recovery write-back
    if new.state is LedgerState.IN_RECOVERY and new.ensembles != old.ensembles:
        return "marking IN_RECOVERY changed the fragments"
    # an ensemble change keeps every fragment before the new one (it may replace the last one
    # if that starts at the same entry)
    if new.ensembles[:-1] != old.ensembles[:len(new.ensembles) - 1]:
        return f"fragments rewritten: {old.ensembles} -> {new.ensembles}"
    return None
