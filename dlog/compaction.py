"""The compactor: key compaction of a stream (`dlog compact`, the policy runner's `--compaction
on`). The rules are `dlog.core.compaction`'s; this drives them.

A run: plan (the covered segments, from one list read), pass 1 reads every covered record's key
into the latest-per-key map, pass 2 reads them again and writes the kept records into ONE new
ledger (the stream's replication and password), entries of at most
`dlog.segments.compacted.ENTRY_RECORDS_MAX` records of one segment each, then closes it; the
swap is one compare-and-set of the segment list (`swap_change`, re-planned from a fresh list
while other changes win: a writer rolling, a retention run) that gives each covered segment its
compacted copy. A swap that finds a covered segment changed (truncated, offloaded, compacted by
another run) voids the run: its ledger is deleted and nothing else changes. After the swap the
replaced ledgers are deleted (the originals of the newly compacted segments, the previous
compaction ledger).

Live writers and readers. The writer's in-progress segment is never covered, and the swap only
updates completed segments, so a writer merely loses a compare-and-set now and then and rebases.
A reader that opened a replaced ledger before the swap reads it on while it exists; when its
ledger is deleted under it, its read fails with a missing ledger and it reads on from the
segment's compacted copy at the same place (`dlog.reader`), so it never fails and never hands an
offset out twice: it goes from original records to the kept ones of the same segment. The
producer dedup snapshot is another node of the stream and is not touched.

Bounds: the latest-per-key map (one item per distinct key of the covered records), kept records
buffered up to one entry (`ENTRY_RECORDS_MAX`), `APPENDS_IN_FLIGHT_MAX` appends in flight, reads
`READ_CHUNK_ENTRIES` entries at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from bookkeeper.clock import perf_s
from bookkeeper.errors import DlogError, MetadataContentionError, MetadataVersionError
from dlog.core import compaction
from dlog.offsets import Offset
from dlog.segments import compacted as compaction_format
from dlog.segments.codec import RecordSetCodec
from dlog.segments.metadata import CompactedCopy, Segment, StreamConfig

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dlog.namespace import Namespace

log = logging.getLogger(__name__)
READ_CHUNK_ENTRIES = 64  # entries read per request while compacting
APPENDS_IN_FLIGHT_MAX = 16  # compaction-ledger entries written and not yet acknowledged


@dataclass(slots=True)
class CompactionReport:
    """What one run did to one stream."""

    stream: str
    segments: list[int] = field(default_factory=list)  # sequences covered
    records_read: int = 0
    records_kept: int = 0
    tombstones_kept: int = 0
    keys: int = 0
    ledger_id: int | None = None  # the new compaction ledger
    replaced_ledgers: list[int] = field(default_factory=list)
    skipped: str = ""  # why nothing was compacted
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"stream": self.stream, "segments": self.segments, "records_read": self.records_read,
                "records_kept": self.records_kept, "tombstones_kept": self.tombstones_kept, "keys": self.keys,
                "ledger": self.ledger_id, "replaced_ledgers": self.replaced_ledgers, "skipped": self.skipped,
                "seconds": round(self.seconds, 3)}


class Compactor:
    """Compacts the streams of one namespace (see the module doc)."""

    def __init__(self, namespace: Namespace) -> None:
        self.namespace = namespace

    async def run(self, name: str, *, until: Offset | None = None, now_ms: int | None = None) -> CompactionReport:
        ns = self.namespace
        ns.security.require_role(ns.name, "admin", f"compacting stream {name!r}")
        started = perf_s()
        config = await ns.store.config(name)
        schema = ns.schema_of(config)
        policy = await ns.tier_policy(name, config)
        compaction.check_compactable(config, policy.enabled, "key" in schema.names)
        now_ms = ns.clock.wall_ms() if now_ms is None else now_ms
        report = CompactionReport(name)
        listing = await ns.store.segments(name)
        plan = compaction.compaction_plan(listing, config, now_ms, name, until)
        if plan is None:
            report.skipped = "nothing to compact: no completed segment is due and no deletion marker expired"
            return report
        report.segments = [s.sequence for s in plan.segments]
        codec = RecordSetCodec(schema, headers=not config.schema)
        untyped = not config.schema
        latest = compaction.LatestPerKey()
        async for segment, entry_id, slots, batch in self._records(config, plan, codec):
            latest.add(batch.column("key").to_pylist(), segment.sequence, entry_id, slots)
            report.records_read += batch.num_rows
        report.keys = len(latest)
        handle = await ns.client.create_ledger(config.ensemble, config.write_quorum, config.ack_quorum,
                                               password=ns.password_of(config),
                                               custom={"stream": name, "namespace": ns.name, "compaction": "1"})
        report.ledger_id = handle.ledger_id
        try:
            copies = await self._write(handle, config, plan, codec, latest, untyped, now_ms, report)
            await handle.close()
        except BaseException:
            await _quietly(ns.delete_ledger_quietly(handle.ledger_id))
            raise

        async def swap() -> bool:
            current = await ns.store.segments(name)
            change = compaction.swap_change(current, plan, copies)
            if change is None:
                return False
            try:
                await ns.store.commit(name, current, change)
            except MetadataVersionError as exc:
                raise MetadataContentionError(f"the segment list of stream {name!r} changed meanwhile") from exc
            return True

        try:
            swapped = await ns.replanned(name, "compaction swap", swap)
        except BaseException:
            await _quietly(ns.delete_ledger_quietly(handle.ledger_id))
            raise
        if not swapped:
            await ns.delete_ledger_quietly(handle.ledger_id)
            report.skipped = ("a covered segment changed meanwhile (truncated, offloaded or compacted by another "
                              "run); nothing was swapped")
            report.ledger_id = None
            return report
        report.replaced_ledgers = compaction.replaced_ledgers(plan)
        for ledger_id in report.replaced_ledgers:
            await ns.delete_ledger_quietly(ledger_id)
        report.seconds = perf_s() - started
        return report

    async def _records(self, config: StreamConfig, plan: compaction.CompactionPlan,
                       codec: RecordSetCodec) -> AsyncIterator[tuple[Segment, int, list[int], pa.RecordBatch]]:
        """Every covered record, entry by entry: (segment, entry id, slots, batch); a segment
        compacted before is read from its compacted copy (its kept records, their slots)."""
        ns = self.namespace
        password = ns.password_of(config)
        for segment in plan.segments:
            handle = await ns.reads.segment_handle(segment, password, compacted=True)
            first = segment.first_entry
            while first <= segment.last_entry:
                last = min(segment.last_entry, first + READ_CHUNK_ENTRIES - 1)
                for entry in await handle.read(first, last):
                    payload = entry.payload
                    _, batch = codec.decode(payload)
                    if isinstance(payload, compaction_format.CompactedEntry):
                        slots = list(payload.record_slots)
                        indexes = list(payload.record_indexes)
                    else:
                        header = codec.peek_header(payload)
                        slots = list(range(batch.num_rows))
                        indexes = [header.first_record_index + slot for slot in slots]
                    if batch.num_rows:
                        yield segment, entry.entry_id, slots, batch.append_column(
                            compaction_format.INDEX_COLUMN, pa.array(indexes, pa.int64()))
                first = last + 1

    async def _write(self, handle: Any, config: StreamConfig, plan: compaction.CompactionPlan,
                     codec: RecordSetCodec, latest: compaction.LatestPerKey, untyped: bool, now_ms: int,
                     report: CompactionReport) -> dict[int, CompactedCopy]:
        """Pass 2: each covered segment's kept records into the compaction ledger; its copy."""
        copies: dict[int, CompactedCopy] = {}
        next_entry = 0
        pieces: list[pa.RecordBatch] = []
        pending: list[Any] = []

        async def flush() -> None:
            nonlocal next_entry
            if not pieces:
                return
            batch = pa.concat_batches(pieces) if len(pieces) > 1 else pieces[0]
            pieces.clear()
            places = [batch.column(name) for name in compaction_format.PLACE_COLUMNS]
            records = batch.drop_columns(list(compaction_format.PLACE_COLUMNS))
            pending.append(handle.append_async(compaction_format.encode(records, *places)))
            next_entry += 1
            if len(pending) >= APPENDS_IN_FLIGHT_MAX:
                await pending.pop(0)

        current: Segment | None = None
        first_entry = kept = tombstones = buffered = 0

        async def finish(segment: Segment) -> None:
            await flush()
            copies[segment.sequence] = compaction.compacted_copy(segment, handle.ledger_id, first_entry,
                                                                 next_entry - 1, kept, tombstones, now_ms)

        async for segment, entry_id, slots, batch in self._records(config, plan, codec):
            if current is None or segment.sequence != current.sequence:
                if current is not None:
                    await finish(current)
                current, first_entry, kept, tombstones, buffered = segment, next_entry, 0, 0, 0
            keys = batch.column("key").to_pylist()
            values = batch.column("value") if "value" in batch.schema.names else None
            dead = _tombstones(values, batch.num_rows, untyped)
            rows = latest.kept(keys, dead, segment.sequence, entry_id, slots,
                               segment.sequence in plan.drops_tombstones)
            if not rows:
                continue
            taken = batch.take(pa.array(rows, pa.int64()))
            taken = taken.add_column(taken.num_columns - 1, compaction_format.ENTRY_COLUMN,
                                     pa.array([entry_id] * len(rows), pa.int64()))
            taken = taken.add_column(taken.num_columns - 1, compaction_format.SLOT_COLUMN,
                                     pa.array([slots[row] for row in rows], pa.int32()))
            pieces.append(taken)
            kept += len(rows)
            tombstones += sum(1 for row in rows if dead[row])
            buffered += len(rows)
            if buffered >= compaction_format.ENTRY_RECORDS_MAX:
                await flush()
                buffered = 0
        if current is not None:
            await finish(current)
        for sequence in (s.sequence for s in plan.segments if s.sequence not in copies):
            # a covered segment with no record left at all: an empty copy (no entries)
            planned = next(s for s in plan.segments if s.sequence == sequence)
            copies[sequence] = compaction.compacted_copy(planned, handle.ledger_id, next_entry, next_entry - 1,
                                                         0, 0, now_ms)
        for future in pending:
            await future
        report.records_kept = sum(copy.records for copy in copies.values())
        report.tombstones_kept = sum(copy.tombstones for copy in copies.values())
        return copies


def _tombstones(values: pa.Array | None, rows: int, untyped: bool) -> list[bool]:
    """Which records are deletion markers: a null value, or in an untyped stream (whose value
    column holds no nulls) an empty one."""
    if values is None:
        return [False] * rows
    dead = pc.is_null(values)
    if untyped:
        dead = pc.or_(dead, pc.equal(pc.binary_length(values), 0))
    return [bool(flag) for flag in dead.to_pylist()]


async def _quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except DlogError as exc:
        log.warning("could not delete an unfinished compaction ledger: %s", exc)
