"""When each stream's policies run: the schedule of a policy runner (pure).

Retention, offload and key compaction are a stream's policies; applying it is a routine
operation that must happen without anybody typing `dlog retention apply`. A process that already
runs (`dlog standalone`, a serving-tier server for the streams it owns) keeps one `PolicySchedule`
per namespace and asks it, each round, which streams are due. The schedule decides by the stream's
settings and the time it is handed (no clock is read here):

- a stream with an age limit is looked at every quarter of that age, but not more often than
  `interval_min_ms` nor less often than `interval_max_ms` (so `--age 1s` is enforced within about
  a second, and a 7-day policy once a minute); a stream with a tier counts its offload age,
  bookie-copy delete lag and tier retention age as age limits too (0: every `interval_min_ms`), and
  a stream with compaction on its min compaction lag;
- subscription expiry and a backlog age limit count as age limits too (a retention run evicts
  and expires subscriptions: `dlog.core.backlog`);
- a stream with only a size limit, or none (its settings may change), every `interval_max_ms`;
- a stream whose run failed waits twice as long after each failure, up to `backoff_max_ms`;
- the stream list is read again every `list_interval_ms`, so a new stream is seen within it;
- at most `streams_per_round_max` streams per round, the most overdue first, and at most
  `streams_tracked_max` streams per namespace (the rest are counted, not tracked).

Which process runs a stream's policies is decided outside (one claim per stream in the segment
store: `dlog.policies`); the schedule only says when.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dlog.core import backlog
from dlog.segments.metadata import StreamConfig, TierPolicy


@dataclass(frozen=True)
class PolicyLimits:
    """The named limits of a policy runner (docs/operations.md, "Policies run by themselves")."""

    interval_min_ms: int = 1_000
    interval_max_ms: int = 60_000
    list_interval_ms: int = 5_000  # how often the stream list is read again (new streams are seen)
    backoff_max_ms: int = 300_000
    streams_per_round_max: int = 100
    streams_tracked_max: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.interval_min_ms <= self.interval_max_ms <= self.backoff_max_ms:
            raise ValueError("policy intervals must satisfy 0 < interval_min <= interval_max <= backoff_max "
                             f"(got {self.interval_min_ms}, {self.interval_max_ms}, {self.backoff_max_ms} ms)")
        if self.list_interval_ms <= 0:
            raise ValueError(f"the stream list interval must be positive (got {self.list_interval_ms} ms)")
        if self.streams_per_round_max < 1 or self.streams_tracked_max < 1:
            raise ValueError("a policy runner must look at one stream or more per round")

    @classmethod
    def at_most_every(cls, interval_max_ms: int) -> PolicyLimits:
        """Limits that look at each stream at least every `interval_max_ms` (a command's
        `--policy-check-interval`, `dlog tier daemon --interval`), at most every second."""
        return cls(interval_min_ms=min(1_000, interval_max_ms), interval_max_ms=interval_max_ms,
                   backoff_max_ms=max(300_000, interval_max_ms))


def runs_offloader(config: StreamConfig, tier: TierPolicy | None) -> bool:
    """Whether a runner offloads the stream's segments and deletes their bookie copies: it has a
    tier (its effective policy's URI) and something for the offloader to do by itself: an offload
    age (not -1), a delete lag (not -1), or a bookie retention (which drops offloaded copies)."""
    if tier is None or not tier.enabled:
        return False
    return ((tier.offload_after_ms if tier.offload_after_ms is not None else -1) >= 0
            or (tier.delete_lag_ms if tier.delete_lag_ms is not None else -1) >= 0
            or bool(config.retention_age_ms or config.retention_bytes))


def has_policy(config: StreamConfig, tier: TierPolicy | None = None) -> bool:
    """Whether the stream has a policy a runner applies: retention by age or size (the bookies',
    or the tier's on a tiered stream), or offloading (`runs_offloader`). `tier`: the stream's
    effective tier policy."""
    tiered = tier is not None and tier.enabled and bool(tier.retention_age_ms or tier.retention_bytes)
    subscriptions = bool(config.subscription_expiry_ms) or backlog.has_limits(config)  # evict, expire, measure
    return (bool(config.retention_age_ms or config.retention_bytes) or tiered or runs_offloader(config, tier)
            or subscriptions or config.compaction)


def interval_ms(config: StreamConfig | None, limits: PolicyLimits, tier: TierPolicy | None = None) -> int:
    """How long after a run the stream is looked at again: a quarter of its shortest age limit
    (retention ages of 0 are off; an offload age or delete lag of 0 means at once)."""
    ages = []
    if config is not None and config.retention_age_ms:
        ages.append(config.retention_age_ms)
    if config is not None:  # expiry and eviction by age are checked as often as retention's age
        ages += [age for age in (config.subscription_expiry_ms, config.backlog_age_ms) if age]
    if tier is not None and tier.enabled and tier.retention_age_ms:
        ages.append(tier.retention_age_ms)
    if config is not None and tier is not None and runs_offloader(config, tier):
        ages += [age for age in (tier.offload_after_ms, tier.delete_lag_ms) if age is not None and age >= 0]
    if config is not None and config.compaction:  # compacted as soon as a segment is past the lag
        ages.append(config.min_compaction_lag_ms)
    if not ages:
        return limits.interval_max_ms
    return min(max(min(ages) // 4, limits.interval_min_ms), limits.interval_max_ms)


class PolicySchedule:
    """The due times of one namespace's streams. Feed it the stream list (`known`), ask `due`,
    and tell it how each run went (`ran`, `failed`)."""

    def __init__(self, limits: PolicyLimits | None = None) -> None:
        self.limits = limits or PolicyLimits()
        self._due_ms: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self.untracked = 0  # streams beyond streams_tracked_max at the last `known`

    @property
    def tracked(self) -> int:
        return len(self._due_ms)

    def known(self, streams: Iterable[str], now_ms: int) -> None:
        """The streams that exist now: new ones are due at once, gone ones are forgotten."""
        names = sorted(set(streams))
        kept = names[:self.limits.streams_tracked_max]
        self.untracked = len(names) - len(kept)
        for gone in set(self._due_ms) - set(kept):
            self.forget(gone)
        for name in kept:
            self._due_ms.setdefault(name, now_ms)

    def forget(self, stream: str) -> None:
        self._due_ms.pop(stream, None)
        self._failures.pop(stream, None)

    def due(self, now_ms: int) -> list[str]:
        """The streams to look at now, most overdue first, at most `streams_per_round_max`."""
        ready = sorted((due_ms, name) for name, due_ms in self._due_ms.items() if due_ms <= now_ms)
        return [name for _, name in ready[:self.limits.streams_per_round_max]]

    def ran(self, stream: str, config: StreamConfig | None, now_ms: int, tier: TierPolicy | None = None) -> None:
        """The stream was looked at (its policy applied, or it has none, or another runner has it)."""
        if stream in self._due_ms:
            self._failures.pop(stream, None)
            self._due_ms[stream] = now_ms + interval_ms(config, self.limits, tier)

    def failed(self, stream: str, now_ms: int) -> int:
        """The run failed: back off, doubling per failure in a row. Returns the wait in ms."""
        if stream not in self._due_ms:
            return 0
        failures = self._failures.get(stream, 0) + 1
        self._failures[stream] = failures
        wait_ms = min(self.limits.interval_min_ms << min(failures, 30), self.limits.backoff_max_ms)
        self._due_ms[stream] = now_ms + wait_ms
        return wait_ms

    def next_due_ms(self) -> int | None:
        """When the earliest tracked stream is due (None when nothing is tracked)."""
        return min(self._due_ms.values(), default=None)
