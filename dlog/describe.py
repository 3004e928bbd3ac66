"""What a stream holds, for operators: each segment's records and bytes, segments whose ledger is
gone (damaged), subscription lag, and which stream segment a ledger is.

Counts. A completed segment's record count and size are in its metadata. An in-progress segment's
record count comes from the header of its last confirmed entry (`first_record_index +
record_count`); its size is known only once its ledger closes, so it is estimated from that entry
(its bytes per record times the records) and flagged `bytes_estimated`. Those rules are
`dlog.core.snapshot`'s (`tail_count`), and every handle and entry header comes through the
namespace's one cache (`Namespace.reads`, `dlog.snapshot`), which the status page and the Spark
source use too. A segment truncated part way (`dlog truncate --before` an offset inside it) counts
only the records from its truncation point on: the ones below are read out of the header of the
entry the point is in (`records_truncated` says how many), and its bytes are prorated.

Damage. A live segment whose ledger metadata is gone (someone ran `dlog ledger delete --force`)
has lost its records: it is reported with `damaged` saying so, never as healthy. A segment whose
bookie copy was deleted after an offload is not damaged: `stored_on` says where each segment's
records are ("bookies", "bookies+tier", "tier") and `tier` names its file. Nor is a compacted
segment (key compaction deleted its ledger): `stored_on` is "compacted", `records` the records
compaction kept, and `compacted` says where they are and how many there were.

Lag. A subscription's committed offset is the next record it reads. Its lag is the records (and
bytes) from there to the end: the rest of its own segment plus every later live segment. The
rest of its own segment is exact when the caller read the committed entry's header
(`consumed_in_segment`, one entry read: what `Namespace.subscription_lag` does); otherwise it is
estimated from counts as if the segment's records were spread evenly over its entries (the status
page, which polls and should not read entries for it). Bytes of a partly read segment are its
bytes times the share of its records not read yet. A subscription whose segment was truncated lags
by every live record. `lag_known` is false when some segment's records could not be counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bookkeeper.errors import ConfigError, DlogError, NoSuchLedgerError
from dlog.context import StreamContext
from dlog.core.snapshot import first_readable, records_before_slot
from dlog.offsets import Offset
from dlog.segments.metadata import Segment
from dlog.segments.store import StreamNotFoundError, StreamStore

if TYPE_CHECKING:
    from bookkeeper.meta.zk import AsyncZooKeeper

NAMESPACE_ROOT_DEFAULT = "/dlog"
LEDGER_CHECKS_IN_FLIGHT_MAX = 64  # ledger metadata reads at once when looking for damage


# ------------------------------------------------------------------------------ segments


async def segment_summaries(context: StreamContext, segments: list[Segment]) -> list[dict[str, Any]]:
    """One JSON-ready dict per segment, in order (see the module doc for what is counted how)."""
    for segment in segments:
        context.reads.know(segment)  # an offloaded segment's entries read from its tier file
    # a segment whose bookie copy was deleted after its offload is read from the tier: not missing
    # and a compacted one from its compaction ledger (its own ledger was deleted after the swap)
    missing = await _missing_ledgers(context, [s.ledger_id for s in segments
                                               if not s.is_truncated and s.on_bookies and s.compacted is None])
    return [await _summary(context, segment, segment.ledger_id in missing) for segment in segments]


async def _missing_ledgers(context: StreamContext, ledger_ids: list[int]) -> set[int]:
    limit = asyncio.Semaphore(LEDGER_CHECKS_IN_FLIGHT_MAX)

    async def missing(ledger_id: int) -> bool:
        async with limit:
            try:
                await context.client.ledger_metadata(ledger_id)
            except NoSuchLedgerError:
                return True
            return False

    found = await asyncio.gather(*(missing(ledger_id) for ledger_id in ledger_ids))
    return {ledger_id for ledger_id, gone in zip(ledger_ids, found, strict=True) if gone}


async def _summary(context: StreamContext, segment: Segment, ledger_missing: bool) -> dict[str, Any]:
    item: dict[str, Any] = {
        "sequence": segment.sequence, "ledger": segment.ledger_id, "state": segment.state.value,
        "first_entry": segment.first_entry, "last_entry": segment.last_entry, "records": segment.records,
        "bytes": segment.bytes, "bytes_estimated": False, "first_timestamp_ms": segment.first_timestamp_ms,
        "last_timestamp_ms": segment.last_timestamp_ms, "min_active_entry": segment.min_active_entry,
        "min_active_slot": segment.min_active_slot,
        "min_active": f"{segment.ledger_id}:{segment.min_active_entry}:{segment.min_active_slot}",
        "first_position": segment.first_position, "damaged": None, "note": None,
        "stored_on": _stored_on(segment),
        "tier": None if segment.tier is None else {"uri": segment.tier.uri, "file_bytes": segment.tier.size_bytes,
                                                   "offloaded_ms": segment.tier.offloaded_ms,
                                                   "bookie_deleted_ms": segment.tier.bookie_deleted_ms}}
    if segment.compacted is not None:  # key compaction kept these of its records (offsets unchanged)
        copy = segment.compacted
        item["compacted"] = {"ledger": copy.ledger_id, "records": copy.records, "tombstones": copy.tombstones,
                             "records_before": segment.records, "compacted_ms": copy.compacted_ms}
        item["records"] = copy.records
        return item
    if ledger_missing:
        item["damaged"] = f"ledger {segment.ledger_id} is missing: the segment's records are lost"
        return item
    if segment.is_in_progress:
        await _count_tail(context, segment, item)
    if not segment.is_truncated:
        await _leave_out_truncated(context, segment, item)
    return item


def _stored_on(segment: Segment) -> str:
    """Where a segment's records are: "bookies", "bookies+tier", "tier" or "compacted" (its
    compaction ledger; nowhere: truncated)."""
    if segment.is_truncated:
        return "none"
    if segment.compacted is not None:
        return "compacted"
    if segment.tier is None:
        return "bookies"
    return "bookies+tier" if segment.tier.on_bookies else "tier"


async def _leave_out_truncated(context: StreamContext, segment: Segment, item: dict[str, Any]) -> None:
    """A segment truncated part way (its min active offset past its first record) counts only the
    records readers still get; its bytes are prorated by records (estimated). `records_truncated`
    is how many were left out."""
    item["records_truncated"] = 0
    entry, slot = first_readable(segment.first_entry, segment.min_active_entry, segment.min_active_slot)
    records, last_entry = item["records"], item["last_entry"]
    if (entry, slot) == (segment.first_entry, 0) or not records or last_entry is None:
        return
    if entry > last_entry:
        below = records
    else:
        try:
            info = await context.reads.entry_info(segment.ledger_id, entry, context.password, last_entry)
        except DlogError as exc:  # unreachable bookies: the truncated part is not known
            item["note"] = f"records below the truncation point not counted out: {exc}"
            return
        below = min(records, records_before_slot(info.header, slot))
    item["records_truncated"] = below
    item["records"] = records - below
    if item["bytes"] is not None:
        item["bytes"] = round(item["bytes"] * (records - below) / records)
        item["bytes_estimated"] = True


async def _count_tail(context: StreamContext, segment: Segment, item: dict[str, Any]) -> None:
    reads, password = context.reads, context.password
    try:
        lac = await reads.lac(segment, password)
        item["last_entry"] = lac
        tail = await reads.tail(segment, lac, password)
    except NoSuchLedgerError:
        item["damaged"] = f"ledger {segment.ledger_id} is missing: the segment's records are lost"
        return
    except DlogError as exc:  # unreachable bookies: the count is unknown, not zero
        item["records"] = item["bytes"] = None
        item["note"] = f"records unknown: {exc}"
        return
    item["records"], item["bytes"] = tail.records, tail.bytes_estimated
    if tail.last_timestamp_ms is not None:  # counted from the LAC entry's header
        item["bytes_estimated"] = True
        item["last_timestamp_ms"] = tail.last_timestamp_ms


def live(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in segments if s["state"] != "truncated"]


def first_offset(segments: list[dict[str, Any]]) -> str | None:
    """The earliest readable record's offset (None when no live segment holds a record)."""
    for item in segments:
        if item["state"] != "truncated" and not item["damaged"] and item["records"] != 0:
            entry, slot = first_readable(item["first_entry"], item["min_active_entry"], item["min_active_slot"])
            return f"{item['ledger']}:{entry}:{slot}"
    return None


async def last_offset(context: StreamContext, segments: list[Segment], summaries: list[dict[str, Any]]) -> str | None:
    """The last record's offset: one read of the last entry's header (None if none or unreadable)."""
    for segment, item in reversed(list(zip(segments, summaries, strict=True))):
        if item["state"] == "truncated" or item["damaged"] or not item["records"] or item["last_entry"] is None:
            continue
        entry_id = item["last_entry"]  # confirmed: the LAC just read, or a completed segment's last entry
        try:
            info = await context.reads.entry_info(segment.ledger_id, entry_id, context.password, entry_id)
        except DlogError:
            return None
        return str(Offset(segment.ledger_id, entry_id, max(0, info.header.record_count - 1)))
    return None


# ------------------------------------------------------------------------------ lag (pure)


def entry_count(segment: Mapping[str, Any]) -> int | None:
    """The entries of a segment summary (None when its last entry is unknown)."""
    if segment["last_entry"] is None:
        return None
    return max(0, segment["last_entry"] - segment["first_entry"] + 1)


def subscription_lag(segments: Sequence[Mapping[str, Any]], offset: Mapping[str, int],
                     consumed_in_segment: int | None = None) -> dict[str, Any]:
    """Records and bytes after `offset` and where it sits (`position`: the share of its segment
    read). `consumed_in_segment` is the index of the offset's record within its segment, when the
    caller read it; else it is estimated (see the module doc)."""
    index = next((i for i, s in enumerate(segments) if s["ledger"] == offset["ledger"]), None)
    alive = [s for s in segments if s["state"] != "truncated"]
    if index is None or segments[index]["state"] == "truncated":
        return {"segment": None if index is None else segments[index]["sequence"], "position": None,
                "lag_records": sum(s["records"] or 0 for s in alive),
                "lag_bytes": sum(s.get("bytes") or 0 for s in alive),
                "lag_known": all(s["records"] is not None for s in alive),
                "note": "behind the truncation point"}
    segment, later = segments[index], [s for s in segments[index + 1:] if s["state"] != "truncated"]
    records, entries = segment["records"], entry_count(segment)
    position, remaining = 0.0, records or 0
    if records is not None and consumed_in_segment is not None:
        remaining = max(0, min(records, records - consumed_in_segment))
        position = (records - remaining) / records if records else 1.0
    elif records is not None and entries:
        entries_before = min(max(offset["entry"] - segment["first_entry"], 0), entries)
        slot = offset.get("slot", 0) if entries_before < entries else 0
        remaining = max(0, min(records, records - round(records * entries_before / entries) - slot))
        position = (records - remaining) / records if records else entries_before / entries
    segment_bytes = segment.get("bytes") or 0
    rest_bytes = round(segment_bytes * remaining / records) if records else 0
    return {"segment": segment["sequence"], "position": position,
            "lag_records": remaining + sum(s["records"] or 0 for s in later),
            "lag_bytes": rest_bytes + sum(s.get("bytes") or 0 for s in later),
            "lag_known": all(s["records"] is not None for s in [segment, *later]), "note": None}


# ------------------------------------------------------------------------------ lag (read)


async def lag_of(context: StreamContext, segments: list[Segment], summaries: list[dict[str, Any]],
                 offset: Offset) -> dict[str, Any]:
    """`subscription_lag` made exact by reading the header of the committed offset's entry."""
    consumed = None
    segment = next((s for s in segments if s.ledger_id == offset.ledger_id), None)
    summary = next((s for s in summaries if s["ledger"] == offset.ledger_id), None)
    if segment is not None and summary is not None and not segment.is_truncated and not summary["damaged"]:
        consumed = await _consumed_in_segment(context, segment, summary, offset)
    result = subscription_lag(summaries, offset.to_json(), consumed)
    return {"offset": str(offset), **result}


async def _consumed_in_segment(context: StreamContext, segment: Segment, summary: dict[str, Any],
                               offset: Offset) -> int | None:
    last_entry = summary["last_entry"]
    if last_entry is None or summary["records"] is None:
        return None
    if offset.entry_id > last_entry:
        return summary["records"]  # read everything
    try:
        info = await context.reads.entry_info(segment.ledger_id, offset.entry_id, context.password, last_entry)
    except DlogError:
        return None  # estimated instead
    # counted from the segment's first record; its records below a truncation point are not in `records`
    return max(0, records_before_slot(info.header, offset.slot) - summary.get("records_truncated", 0))


# ------------------------------------------------------------------------------ ledger owners


class LedgerInUseError(DlogError):
    """An operation below the stream layer would break a stream: its ledger is a live segment."""

    code = 402


@dataclass(frozen=True, slots=True)
class SegmentOfLedger:
    namespace: str
    stream: str
    segment: Segment

    def __str__(self) -> str:
        return (f"segment {self.segment.sequence} ({self.segment.state.value}) of stream {self.stream!r} "
                f"in namespace {self.namespace!r}")


async def segment_of_ledger(zk: AsyncZooKeeper, ledger_id: int, custom: Mapping[str, str],
                            namespace_root: str = NAMESPACE_ROOT_DEFAULT) -> SegmentOfLedger | None:
    """The live segment this ledger is, if its metadata names a stream (`custom` stream and
    namespace, which stream writers and the Spark sink set) and that stream's segment list agrees."""
    stream, namespace = custom.get("stream"), custom.get("namespace")
    if not stream or not namespace:
        return None
    try:
        listing = await StreamStore(zk, f"{namespace_root}/{namespace}").segments(stream)
    except (StreamNotFoundError, ConfigError):
        return None
    segment = listing.by_ledger(ledger_id)
    if segment is None or segment.is_truncated:
        return None
    return SegmentOfLedger(namespace, stream, segment)
