"""Bytes the bookie holds in unfinished frames, over all its connections (S4).

A frame is parsed once it is whole; until then its bytes wait in the connection's decoder, memory a
peer that drips frames holds for free. Two caps, here where the totals live:
- `partial_bytes_max` over all authenticated connections (all of them on a bookie that does not
  require AUTH): the connection whose frame would pass it is closed;
- before AUTH, on a bookie that requires it, one connection may hold only
  `unauthenticated_partial_bytes_max` (the longest AUTH frame fits) and is closed past it. Those
  bytes are counted apart, so peers that have not shown who they are cannot take the budget of
  those that have (a 1 MiB write of an authenticated client finds room whatever they send); they
  are bounded by the connections (`connections_max`) times that allowance.
"""

from __future__ import annotations

from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.protocol.wire import Status


class PartialFrames:
    def __init__(self, bytes_max: int, before_auth_bytes_max: int, refusals: RateLimitedLog) -> None:
        self.bytes_max = bytes_max
        self.before_auth_bytes_max = before_auth_bytes_max
        self.refusals = refusals
        self.bytes = 0  # of authenticated (or, when AUTH is not required, all) connections
        self.before_auth_bytes = 0
        self.closed = 0  # connections closed at bytes_max
        self.before_auth_closed = 0  # connections closed past before_auth_bytes_max

    def hold(self, peer: str, counted: int, counted_before_auth: bool, pending: int,
             before_auth: bool) -> tuple[Status, str] | None:
        """A connection that was counted with `counted` bytes (before AUTH or not) holds `pending`
        now: count them, or say why it must close instead (its bytes are no longer counted then)."""
        if counted_before_auth:
            self.before_auth_bytes -= counted
        else:
            self.bytes -= counted
        if before_auth:
            if pending > self.before_auth_bytes_max:
                self.before_auth_closed += 1
                self.refusals.warning("partial-before-auth", "closing connection from %s: %d bytes of "
                                      "frames before AUTH (maximum %d)", peer, pending,
                                      self.before_auth_bytes_max)
                return Status.UNAUTHENTICATED, (f"send AUTH first: at most {self.before_auth_bytes_max} "
                                                "bytes of frames before it (protocol.md)")
            self.before_auth_bytes += pending
            return None
        grew = pending - (counted if counted_before_auth == before_auth else 0)
        if grew > 0 and self.bytes + pending > self.bytes_max:
            self.closed += 1
            self.refusals.warning("partial", "closing connection from %s: partial frames hold %d bytes "
                                  "over all connections (maximum %d)", peer, self.bytes + pending,
                                  self.bytes_max)
            return Status.TOO_MANY_REQUESTS, ("the bookie holds too many partial frames; send whole "
                                              "frames promptly")
        self.bytes += pending
        return None
