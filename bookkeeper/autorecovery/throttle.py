"""Pacing arithmetic: token buckets for rate limits, and a copy window that yields to writers.

Theory of operation. `TokenBucket.take(amount, now_s)` reserves `amount` tokens and returns how
long the caller must wait before using them: tokens refill at `rate_per_s` up to `burst`, and a
reservation may run the bucket negative, so a request larger than the burst is paced rather than
refused. A rate of 0 means unlimited. `Pacer` is one bucket per dimension (entries and bytes):
the wait is the longest of them.

`CopyWindow` keeps re-replication from hurting the writers of the bookies it copies from and to
(R3). Copy adds go through the target's journal like any writer's adds, so their latency is the
latency a writer on that bookie sees. The window (how many copy requests may be in flight) grows by
one after each full window of answers while the smoothed latency (an average weighted to the
recent answers, as TCP smooths round-trip times, so one slow fsync is not taken for crowding) is
under the target, and halves, at most once per window of answers, when it is above: additive
increase, multiplicative decrease, as TCP does for a shared link. The target is
`LATENCY_TARGET_FACTOR` times the baseline: the smoothed latency of answers received while the
window is at its minimum (what an add costs on this bookie, under its other load, when copies do
not crowd it; relearnt whenever the window falls back), at least `LATENCY_TARGET_MS_MIN` and at
most `latency_target_ms`. So copies may at most double the latency writers see, whatever the disks.
"""

from __future__ import annotations

from dataclasses import dataclass

from bookkeeper.errors import ConfigError

LATENCY_TARGET_MS_MIN = 1.0
LATENCY_TARGET_FACTOR = 2.0
SMOOTHING = 0.125  # weight of the newest answer in the smoothed latency (TCP's SRTT uses 1/8)


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float | None = None) -> None:
        if rate_per_s < 0:
            raise ConfigError(f"a rate must be >= 0 (0: unlimited), got {rate_per_s}")
        self.rate_per_s = rate_per_s
        self.burst = burst if burst is not None else max(rate_per_s / 10, 1.0)
        if self.burst <= 0:
            raise ConfigError(f"a burst must be > 0, got {self.burst}")
        self._tokens = self.burst
        self._updated_s: float | None = None

    def take(self, amount: float, now_s: float) -> float:
        """Reserve `amount`; the seconds to wait before going ahead (0: at once)."""
        if self.rate_per_s == 0:
            return 0.0
        if self._updated_s is not None:
            elapsed = max(0.0, now_s - self._updated_s)
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate_per_s)
        self._updated_s = now_s
        self._tokens -= amount
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_per_s


@dataclass(frozen=True, slots=True)
class Limits:
    """Re-replication limits (0: unlimited)."""

    entries_per_s: float = 0.0
    bytes_per_s: float = 0.0


class Pacer:
    """Entries/s and bytes/s at once: the wait is the longest either bucket asks for."""

    def __init__(self, limits: Limits) -> None:
        # a burst of a tenth of a second keeps the pace smooth without a timer per entry
        self.entries = TokenBucket(limits.entries_per_s, max(limits.entries_per_s / 10, 1.0))
        self.bytes = TokenBucket(limits.bytes_per_s, max(limits.bytes_per_s / 10, 4 * 2**20))

    def take(self, entries: int, size_bytes: int, now_s: float) -> float:
        return max(self.entries.take(entries, now_s), self.bytes.take(size_bytes, now_s))


class CopyWindow:
    def __init__(self, latency_target_ms: float, window_max: int, window_min: int = 1) -> None:
        if not 1 <= window_min <= window_max:
            raise ConfigError(f"copy window must satisfy 1 <= min <= max, got {window_min}..{window_max}")
        if latency_target_ms <= 0:
            raise ConfigError(f"copy latency target must be > 0 ms, got {latency_target_ms}")
        self.latency_target_ms = latency_target_ms
        self.window_max = window_max
        self.window_min = window_min
        self.window = window_min
        self._answers_at_size = 0
        self.slowdowns = 0
        self.baseline_ms: float | None = None
        self.smoothed_ms: float | None = None
        self._answers_since_decrease = 0

    @property
    def target_ms(self) -> float:
        """The latency above which copies are crowding the bookie."""
        if self.baseline_ms is None:
            return self.latency_target_ms
        return min(self.latency_target_ms, max(LATENCY_TARGET_MS_MIN,
                                               LATENCY_TARGET_FACTOR * self.baseline_ms))

    def _learn(self, latency_ms: float) -> None:
        if self.window <= self.window_min:
            self.baseline_ms = latency_ms if self.baseline_ms is None else (
                (1 - SMOOTHING) * self.baseline_ms + SMOOTHING * latency_ms)

    def on_answer(self, latency_ms: float) -> float:
        """Account one copy request's latency; the seconds to pause before sending more."""
        target_ms = self.target_ms
        self._learn(latency_ms)
        smoothed = latency_ms if self.smoothed_ms is None else (
            (1 - SMOOTHING) * self.smoothed_ms + SMOOTHING * latency_ms)
        self.smoothed_ms = smoothed
        self._answers_since_decrease += 1
        if smoothed > target_ms:
            if self._answers_since_decrease < self.window:
                return 0.0  # the answers of the requests sent before the last decrease
            self.window = max(self.window_min, self.window // 2)
            self._answers_at_size = self._answers_since_decrease = 0
            self.slowdowns += 1
            return min(smoothed, 10 * target_ms) / 1000
        self._answers_at_size += 1
        if self._answers_at_size >= self.window and self.window < self.window_max:
            self.window += 1
            self._answers_at_size = 0
        return 0.0
