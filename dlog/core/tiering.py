"""The tier's rules: which segments to offload, when a bookie copy goes, what the tier's retention
removes, and the segment-list changes of the three-step offload commit. Pure: no I/O, no clock.

The offload commit (Pulsar's, for one Parquet file per segment):
1. `attempt_change`: the segment records the URI its offloader is about to write
   (`offload_attempt`); a previous attempt's URI it replaces is the caller's to remove (that
   attempt can never commit now).
2. The offloader uploads the file.
3. `offloaded_change`: the segment gets its `TierCopy` only if the attempt is still the current
   one (compare-and-set on the list); None means another attempt or a truncation won, and the
   file just written is the offloader's to remove. A metadata error at this step (an unknown
   outcome) leaves the file: it may be the one the segment names.

Bookie copies (`bookie_copy_plan`): an offloaded segment's ledger is deleted `delete_lag_ms` after
the offload (never with -1), or once the stream's bookie retention (`retention_age_ms`,
`retention_bytes` of its config) passes it; the segment is marked first (`bookie_deleted_change`),
so nobody mistakes the missing ledger for lost data. On a tiered stream bookie retention never
truncates a segment that is not offloaded yet (it waits for the offload); the tier's own
retention (`tiered_retention_plan`) removes whole segments. The bookie retention rule itself is
`changes.retention_plan`, called through its module (one rule, which the simulator's plant replaces).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from dlog.core import changes
from dlog.segments.metadata import (
    TIER_DEFAULTS,
    Segment,
    SegmentChange,
    SegmentList,
    SegmentState,
    StreamConfig,
    TierCopy,
    TierPolicy,
)


def effective_policy(config: StreamConfig, namespace_default: TierPolicy | None) -> TierPolicy:
    """The stream's own tier settings over its namespace's default over the built-in defaults."""
    base = TIER_DEFAULTS if namespace_default is None else namespace_default.over(TIER_DEFAULTS)
    return config.tier.over(base)


def offload_candidates(listing: SegmentList, policy: TierPolicy) -> list[Segment]:
    """Completed segments not on the tier yet, beyond the newest `keep_bytes` (which stay on the
    bookies only), oldest first."""
    if not policy.enabled:
        return []
    completed = [s for s in listing.segments if s.state is SegmentState.COMPLETED]
    kept_bytes = 0
    kept: set[int] = set()
    for segment in reversed(completed):
        if kept_bytes + segment.bytes > (policy.keep_bytes or 0):
            break
        kept_bytes += segment.bytes
        kept.add(segment.sequence)
    # a compacted segment's ledger is gone (key compaction; tiers and compaction do not combine yet)
    return [s for s in completed if s.tier is None and s.compacted is None and s.sequence not in kept]


def offload_plan(listing: SegmentList, policy: TierPolicy, now_ms: int, *, now: bool = False) -> list[Segment]:
    """The candidates that are due: completed at least `offload_after_ms` ago, or all of them
    when asked to offload `now` (`dlog offload`). -1 means only when asked."""
    after = policy.offload_after_ms if policy.offload_after_ms is not None else -1
    if not now and after < 0:
        return []
    return [s for s in offload_candidates(listing, policy) if now or s.completed_ms + after <= now_ms]


def attempt_change(segment: Segment, uri: str) -> SegmentChange:
    return SegmentChange(update=(replace(segment, offload_attempt=uri),))


def offloaded_change(listing: SegmentList, sequence: int, uri: str, copy: TierCopy) -> SegmentChange | None:
    """Step 3: the segment gets its tier copy if `uri` is still its current attempt; None when it
    is not (superseded, truncated, or gone)."""
    segment = listing.by_sequence(sequence)
    if segment is None or segment.state is not SegmentState.COMPLETED or segment.offload_attempt != uri:
        return None
    return SegmentChange(update=(replace(segment, tier=copy, offload_attempt=""),))


def bookie_copy_plan(listing: SegmentList, config: StreamConfig, policy: TierPolicy, now_ms: int,
                     subscriptions: Mapping[str, Mapping[str, int]], held: Collection[int] = ()) -> list[Segment]:
    """Offloaded segments whose bookie copy goes now: past the delete lag, or past the bookie
    retention; never one whose ledger is `held` (a reader is reading it from the bookies)."""
    plan = []
    lag = policy.delete_lag_ms if policy.delete_lag_ms is not None else -1
    on_bookies = SegmentList(tuple(s for s in listing.segments if s.on_bookies), listing.version,
                             listing.max_sequence)  # what the bookie retention measures
    retained = {s.sequence for s in changes.retention_plan(on_bookies, config, subscriptions, now_ms)}
    for segment in listing.segments:
        tier = segment.tier
        if tier is None or not tier.on_bookies or segment.is_truncated or segment.ledger_id in held:
            continue
        if (lag >= 0 and tier.offloaded_ms + lag <= now_ms) or segment.sequence in retained:
            plan.append(segment)
    return plan


def bookie_deleted_change(segments: list[Segment], now_ms: int) -> SegmentChange:
    """Mark the segments' bookie copies deleted (before their ledgers are)."""
    return SegmentChange(update=tuple(replace(s, tier=replace(s.tier, bookie_deleted_ms=now_ms))
                                      for s in segments if s.tier is not None))


def tiered_retention_plan(listing: SegmentList, config: StreamConfig, policy: TierPolicy,
                          subscriptions: Mapping[str, Mapping[str, int]], now_ms: int) -> list[Segment]:
    """What retention truncates on a stream: without a tier, the bookie retention's plan (as
    ever); with one, the tier retention's plan (its age and size limits over every completed
    segment, offloaded or not: a segment the tier no longer keeps is gone from the stream)."""
    if not policy.enabled:
        return changes.retention_plan(listing, config, subscriptions, now_ms)
    limits = replace(config, retention_age_ms=policy.retention_age_ms or 0,
                     retention_bytes=policy.retention_bytes or 0)
    return changes.retention_plan(listing, limits, subscriptions, now_ms)


def tier_files(segment: Segment) -> list[str]:
    """The tier files a segment's removal removes: its copy and a leftover attempt's."""
    files = [segment.tier.uri] if segment.tier is not None else []
    if segment.offload_attempt and segment.offload_attempt not in files:
        files.append(segment.offload_attempt)
    return files


def placement(listing: SegmentList) -> dict[str, dict[str, int]]:
    """Where a stream's live segments are: on the bookies only (`bookies`: not offloaded, the
    in-progress one included), on `both` (offloaded, bookie copy kept), on the `tier` only (bookie
    copy deleted). Each: segments, records, bytes on the bookies, bytes on the tier."""
    found = {where: {"segments": 0, "records": 0, "bytes": 0, "tier_bytes": 0} for where in ("bookies", "both", "tier")}
    for segment in listing.segments:
        if segment.is_truncated:
            continue
        where = "bookies" if segment.tier is None else "both" if segment.tier.on_bookies else "tier"
        counts = found[where]
        counts["segments"] += 1
        counts["records"] += segment.records
        counts["bytes"] += segment.bytes if where != "tier" else 0
        counts["tier_bytes"] += segment.tier.size_bytes if segment.tier is not None else 0
    return found


def pending_attempts(listing: SegmentList) -> list[Segment]:
    """Segments with an offload attempt recorded and not committed (an offloader at work, or one
    that died mid-way: the next run replaces the attempt)."""
    return [s for s in listing.segments if s.offload_attempt and s.tier is None and not s.is_truncated]


def policy_sources(own: TierPolicy, namespace_default: TierPolicy | None) -> dict[str, str]:
    """Where each setting of the effective policy comes from: "stream", "namespace" or "default"."""
    base = namespace_default or TierPolicy()
    return {name: "stream" if getattr(own, name) is not None else "namespace" if getattr(base, name) is not None
            else "default" for name in TierPolicy.__dataclass_fields__}
