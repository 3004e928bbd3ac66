"""The bookie's refusal log: what it refused or closed, at most one line per reason per interval.

A bad peer can open thousands of connections a second; one line each would fill the disk and bury
what matters (docs/security.md, S4). The connection, its server and the guard log refusals here.
"""

from __future__ import annotations

import logging

from bookkeeper.clock import SYSTEM_CLOCK, Clock

REFUSAL_LOG_INTERVAL_S = 10.0


class RateLimitedLog:
    """At most one line per reason per interval; the next one says how many were not logged."""

    def __init__(self, logger: logging.Logger, interval_s: float = REFUSAL_LOG_INTERVAL_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # reason -> (when logged, not logged since)

    def warning(self, reason: str, message: str, *args: object) -> None:
        now = self.clock.monotonic_s()
        last, suppressed = self._last.get(reason, (-1e18, 0))
        if now - last < self.interval_s:
            self._last[reason] = (last, suppressed + 1)
            return
        self._last[reason] = (now, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {self.interval_s:.0f} s not logged)"
        self.logger.warning(message, *args)
