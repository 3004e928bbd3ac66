"""Backlog limits: how much a subscription has not consumed, and what a stream does about it.

A subscription's backlog is what lies after its committed offset (the next record it reads): its
bytes and the age of its oldest unconsumed record. Both are computed from the segment list alone
(no entry is read, no poll): the rest of the subscription's own segment (its bytes times the share
of its entries not read yet; the oldest record's timestamp interpolated the same way between the
segment's first and last timestamps) plus every later live completed segment. The in-progress
segment counts once it completes (its size and timestamps are in the list only then), so a
backlog can pass a limit by at most one segment (the roll size or age) before it is seen. A
subscription whose segment was truncated away has every live segment as its backlog.

A stream's limits (`StreamConfig`): `backlog_bytes`, `backlog_age_ms` (0: none) and
`backlog_policy` for a subscription over one of them:
- `hold`: retention keeps what any subscription has not consumed, and writers are refused
  (`BacklogExceededError`) while one is over a limit; the refusal clears once it commits past;
- `evict`: a retention run marks the subscription evicted (stored with it) and it no longer holds
  retention back; its next read at its committed offset fails (`SubscriptionEvictedError`) unless
  the reader is told to skip to the earliest record kept; its next commit clears the mark;
- `none`: nothing.
A subscription's `fraction` is its backlog over the nearest limit (1.0 = at the limit);
WARNING_FRACTION of it is the warning level the status page and the metric show.

Expiry. `subscription_expiry_ms` (0: never): a retention run removes a subscription whose last
commit is older than that. Each commit stores its time (`committed_ms`) with the offset; a
subscription committed before this existed has none and never expires until it commits again.

The stored form of a subscription is its offset JSON (`ledger`, `entry`, `slot`) plus
`committed_ms` and, once evicted, `evicted_ms`: `offset_of` takes the offset part.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dlog.segments.metadata import SegmentList, SegmentState, StreamConfig

WARNING_FRACTION = 0.8  # the share of a limit at which a subscription is reported as near it
OFFSET_KEYS = ("ledger", "entry", "slot")


def has_limits(config: StreamConfig) -> bool:
    return bool(config.backlog_bytes or config.backlog_age_ms)


def holds_writers(config: StreamConfig) -> bool:
    """Whether writers of the stream check the backlog (hold policy with a limit)."""
    return has_limits(config) and config.backlog_policy == "hold"


def keeps_unconsumed(config: StreamConfig) -> bool:
    """Whether retention keeps what subscriptions have not consumed: the stream says so, or it
    holds writers for its backlog (which would mean nothing if retention removed the backlog)."""
    return config.retention_keeps_unconsumed or holds_writers(config)


def offset_of(document: Mapping[str, int]) -> dict[str, int]:
    """The offset JSON of a stored subscription (without its commit time and eviction mark)."""
    return {key: document[key] for key in OFFSET_KEYS if key in document}


def committed(offset_json: Mapping[str, int], now_ms: int) -> dict[str, int]:
    """What a commit stores: the offset and when (no eviction mark: a commit clears it)."""
    return {**offset_of(offset_json), "committed_ms": now_ms}


def evicted(document: Mapping[str, int], now_ms: int) -> dict[str, int]:
    return {**document, "evicted_ms": now_ms}


def is_evicted(document: Mapping[str, int]) -> bool:
    return bool(document.get("evicted_ms"))


@dataclass(frozen=True, slots=True)
class Backlog:
    """One subscription's backlog against its stream's limits."""

    subscription: str
    bytes: int
    age_ms: int
    fraction: float  # of the nearest limit: max(bytes / backlog_bytes, age / backlog_age_ms); 0 without limits
    evicted: bool = False

    @property
    def over(self) -> bool:
        return self.fraction >= 1.0

    @property
    def warning(self) -> bool:
        return self.fraction >= WARNING_FRACTION

    @property
    def level(self) -> str:
        return "evicted" if self.evicted else "over" if self.over else "warning" if self.warning else "ok"


def unconsumed(listing: SegmentList, offset_json: Mapping[str, int]) -> tuple[int, int | None]:
    """(bytes after the offset, timestamp of the oldest record after it or None when there is
    none), from the completed segments of the list (see the module doc)."""
    done = [s for s in listing.segments if s.state is SegmentState.COMPLETED]
    own = listing.by_ledger(int(offset_json["ledger"]))
    if own is None or own.is_truncated:
        return sum(s.bytes for s in done), (done[0].first_timestamp_ms if done else None)
    later = [s for s in done if s.sequence > own.sequence]
    rest_bytes, oldest = 0, None
    if own.state is SegmentState.COMPLETED:
        entries = max(1, own.last_entry - own.first_entry + 1)
        read = min(max(int(offset_json["entry"]) - own.first_entry, 0), entries)
        if read < entries:
            rest_bytes = own.bytes * (entries - read) // entries
            oldest = own.first_timestamp_ms + (own.last_timestamp_ms - own.first_timestamp_ms) * read // entries
    if oldest is None and later:
        oldest = later[0].first_timestamp_ms
    return rest_bytes + sum(s.bytes for s in later), oldest


def backlog_of(listing: SegmentList, config: StreamConfig, subscription: str, document: Mapping[str, int],
               now_ms: int) -> Backlog:
    size_bytes, oldest = unconsumed(listing, document)
    age_ms = 0 if oldest is None else max(0, now_ms - oldest)
    fractions = [0.0]
    if config.backlog_bytes:
        fractions.append(size_bytes / config.backlog_bytes)
    if config.backlog_age_ms:
        fractions.append(age_ms / config.backlog_age_ms)
    return Backlog(subscription, size_bytes, age_ms, max(fractions), is_evicted(document))


def backlogs(listing: SegmentList, config: StreamConfig, subscriptions: Mapping[str, Mapping[str, int]],
             now_ms: int) -> list[Backlog]:
    """Every subscription's backlog, by name."""
    return [backlog_of(listing, config, name, document, now_ms) for name, document in sorted(subscriptions.items())]


def hold_refusal(stream: str, config: StreamConfig, found: list[Backlog]) -> str | None:
    """Why writers of the stream are refused now (hold policy, a subscription over a limit), or None."""
    if not holds_writers(config):
        return None
    over = [b for b in found if b.over and not b.evicted]
    if not over:
        return None
    worst = max(over, key=lambda b: b.fraction)
    return (f"stream {stream!r} is over its backlog limit: subscription {worst.subscription!r} has "
            f"{describe(worst, config)}; writes are refused until it commits past (backlog policy hold: "
            "consume and commit, delete the subscription, or change the limits with dlog stream alter)")


def describe(backlog: Backlog, config: StreamConfig) -> str:
    """`12345 bytes unconsumed (limit 10000)`, `its oldest unconsumed record 3600000 ms old (limit ...)`."""
    parts = []
    if config.backlog_bytes:
        parts.append(f"{backlog.bytes} bytes unconsumed (limit {config.backlog_bytes})")
    if config.backlog_age_ms:
        parts.append(f"its oldest unconsumed record {backlog.age_ms} ms old (limit {config.backlog_age_ms} ms)")
    return " and ".join(parts)


def to_evict(config: StreamConfig, found: list[Backlog]) -> list[str]:
    """Subscriptions a retention run marks evicted now (evict policy, over a limit, not yet marked)."""
    if not has_limits(config) or config.backlog_policy != "evict":
        return []
    return [b.subscription for b in found if b.over and not b.evicted]


def leaving(listing: SegmentList, config: StreamConfig, subscriptions: Mapping[str, Mapping[str, int]],
            now_ms: int) -> list[str]:
    """Subscriptions a retention run evicts or expires now: its plan keeps nothing for them."""
    gone = expired(config, subscriptions, now_ms)
    if has_limits(config):
        gone += to_evict(config, backlogs(listing, config, subscriptions, now_ms))
    return gone


def retention_holders(config: StreamConfig, subscriptions: Mapping[str, Mapping[str, int]],
                      evicting: Collection[str] = ()) -> dict[str, dict[str, int]]:
    """The subscriptions whose unconsumed records retention keeps: none when it keeps nothing for
    them; never an evicted one (nor one being evicted now)."""
    if not keeps_unconsumed(config):
        return {}
    return {name: offset_of(document) for name, document in subscriptions.items()
            if not is_evicted(document) and name not in evicting}


def expired(config: StreamConfig, subscriptions: Mapping[str, Mapping[str, int]], now_ms: int) -> list[str]:
    """Subscriptions whose last commit is older than the stream's expiry (none without one)."""
    if not config.subscription_expiry_ms:
        return []
    return sorted(name for name, document in subscriptions.items()
                  if document.get("committed_ms") and now_ms - document["committed_ms"] > config.subscription_expiry_ms)
