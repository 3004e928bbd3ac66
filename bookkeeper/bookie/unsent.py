"""Answer bytes the bookie's clients have not taken, over all its connections (S4).

Each connection caps its own at `unsent_bytes_max` (connection.py): past it, it stops reading that
client. Over all connections two more caps hold, here where their state lives:
- `global_unsent_bytes_max`: while the bytes of all connections are at it, a connection that holds
  answers is not read either (its next request waits until its client took them); one that holds
  none is, so a client that reads its answers is always served;
- `unsent_connections_max`: while the total is at its cap and more connections than this hold
  answers, the holders whose answers moved least recently are closed: a client that never reads
  makes no progress, one that reads slowly does.
So what all clients leave unsent stays near `global_unsent_bytes_max + unsent_connections_max` times
the largest answer, whatever the number of connections (each may take one answer past the caps).

A connection holds answers while they are queued or in its transport (the TLS layer's buffers
included). The total is exact when answers are queued and when they are handed to the transport;
what a transport sends on its own is seen by a sweep of the holders every `SWEEP_INTERVAL_S` (no
callback tells when a TLS connection's lower layer drained), which also lets blocked ones go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol, TypeVar

from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.clock import SYSTEM_CLOCK, Clock

SWEEP_INTERVAL_S = 0.05
Key = TypeVar("Key")


class Holder(Protocol):
    """A connection as this accounting sees it."""

    unsent_counted: int  # its share of `UnsentAnswers.bytes`
    unsent_holding: bool  # whether it is in `UnsentAnswers.holders` (kept by `note`)

    @property
    def peer(self) -> str: ...

    def refresh_unsent(self) -> None:
        """Measure what it holds now (calling `note`) and go on reading if it may."""

    def abort(self) -> None: ...


def holders_to_close(holders: Iterable[tuple[Key, float, int]], holders_max: int, total_bytes: int,
                     bytes_max: int) -> list[Key]:
    """Of (holder, when its answers last moved, bytes it holds): the ones to close so that at most
    `holders_max` hold answers while the total is at `bytes_max`, least recently moved first."""
    ordered = sorted(holders, key=lambda holder: holder[1])
    remaining = len(ordered)
    closing: list[Key] = []
    for key, _, held in ordered:
        if remaining <= holders_max or total_bytes < bytes_max:
            break
        closing.append(key)
        remaining -= 1
        total_bytes -= held
    return closing


class UnsentAnswers:
    def __init__(self, bytes_max: int, holders_max: int, refusals: RateLimitedLog,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.bytes_max = bytes_max
        self.holders_max = holders_max
        self.refusals = refusals
        self.clock = clock
        self.bytes = 0
        self.holders: dict[Holder, float] = {}  # holder -> when its answers last moved
        self.closed = 0  # holders closed for making no progress past unsent_connections_max
        self._sweep: asyncio.TimerHandle | None = None

    @property
    def full(self) -> bool:
        return self.bytes >= self.bytes_max

    def note(self, holder: Holder, before: int, held: int) -> None:
        """`holder` held `before` bytes as counted and holds `held` now (one that holds none and
        was no holder need not call: only the total changes, see connection.py)."""
        self.bytes += held - before
        if not held:
            if holder.unsent_holding:
                holder.unsent_holding = False
                del self.holders[holder]
            return
        if not holder.unsent_holding:
            holder.unsent_holding = True
            self.holders[holder] = self.clock.monotonic_s()  # starting to hold counts as moving
            self._close_stalled(spare=holder)
            if self._sweep is None:
                self._sweep = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self._sweep_holders)
        elif held < before:
            self.holders[holder] = self.clock.monotonic_s()

    def _sweep_holders(self) -> None:
        self._sweep = None
        for holder in list(self.holders):
            holder.refresh_unsent()
        self._close_stalled(spare=None)
        if self.holders:
            self._sweep = asyncio.get_running_loop().call_later(SWEEP_INTERVAL_S, self._sweep_holders)

    def _close_stalled(self, spare: Holder | None) -> None:
        if len(self.holders) <= self.holders_max or not self.full:
            return
        candidates = [(holder, moved_s, holder.unsent_counted) for holder, moved_s in self.holders.items()
                      if holder is not spare]
        for holder in holders_to_close(candidates, self.holders_max - (spare is not None), self.bytes,
                                       self.bytes_max):
            self.closed += 1
            self.refusals.warning("unsent-holders", "closing connection from %s: its %d bytes of answers "
                                  "moved least recently of %d connections holding %d bytes (maximum %d "
                                  "connections while %d bytes are unsent)", holder.peer,
                                  holder.unsent_counted, len(self.holders), self.bytes, self.holders_max,
                                  self.bytes_max)
            holder.abort()

    def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
