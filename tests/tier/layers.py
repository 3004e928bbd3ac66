"""A stream in every tiered state at once, for the reading tests (the stream reader, `dlog read`
and `dlog export`, the Spark source, the table view): segments 1-2 offloaded with their bookie
copies deleted, 3-4 offloaded and still on the bookies, 5-6 only on the bookies, and 7 in
progress (its writer left open). Untyped (keys, headers on some records) or typed (a
microsecond timestamp column). What was written is kept, with each record's offset, as the
records the log must give back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from dlog.offload import Offloader
from dlog.segments.codec import records_to_batch
from dlog.segments.metadata import TierPolicy

TYPED = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                   pa.field("timestamp", pa.timestamp("us"), nullable=False)])
BASE_MS = 1_700_000_000_000
SEGMENTS_DELETED = (1, 2)  # offloaded, bookie copy deleted
SEGMENTS_BOTH = (3, 4)  # offloaded, still on bookies
SEGMENTS_BOOKIES = (5, 6)  # never offloaded
# the in-progress segment is 7


@dataclass(frozen=True, slots=True)
class Row:
    """One record as every reader must give it: where it is, and what it holds."""

    ledger: int
    entry: int
    slot: int
    position: int | None
    fields: tuple[tuple[str, Any], ...]  # key/value/headers/timestamp_ms, or the typed columns


@dataclass
class Layered:
    name: str
    typed: bool
    tier_uri: str
    rows: list[Row] = field(default_factory=list)
    writer: Any = None  # the in-progress segment's writer, open
    written: int = 0  # records written so far (numbers the next ones)


def stamp_ms(number: int) -> int:
    return BASE_MS + number * 10


def batch_of(layered: Layered, count: int) -> tuple[pa.RecordBatch, list[tuple[tuple[str, Any], ...]]]:
    """The next `count` records (numbered on from what was written) and their expected fields."""
    numbers = range(layered.written, layered.written + count)
    layered.written += count
    if layered.typed:
        names = [None if n % 4 == 0 else f"name-{n}" for n in numbers]
        stamps = [stamp_ms(n) * 1000 + 7 for n in numbers]  # microseconds, not whole milliseconds
        batch = pa.RecordBatch.from_arrays([pa.array(list(numbers), pa.int64()), pa.array(names, pa.string()),
                                            pa.array(stamps, pa.timestamp("us"))], schema=TYPED)
        return batch, [(("id", n), ("name", name), ("timestamp_us", stamp))
                       for n, name, stamp in zip(numbers, names, stamps, strict=True)]
    values = [f"value-{n}".encode() for n in numbers]
    keys = [None if n % 5 == 0 else f"k{n % 3}".encode() for n in numbers]
    headers = [[("n", str(n).encode()), ("empty", None)] if n % 2 else None for n in numbers]
    stamps = [stamp_ms(n) for n in numbers]
    batch = records_to_batch(values, keys=keys, timestamps_ms=stamps, headers=headers)
    return batch, [(("key", k), ("value", v), ("headers", h), ("timestamp_ms", t))
                   for k, v, h, t in zip(keys, values, headers, stamps, strict=True)]


async def append(layered: Layered, writer: Any, records: int, entry_records: int) -> None:
    """Write `records` in entries of `entry_records` and note where each went."""
    for start in range(0, records, entry_records):
        batch, expected = batch_of(layered, min(entry_records, records - start))
        written = await writer.write_batch(batch)
        layered.rows += [Row(o.ledger_id, o.entry_id, o.slot, o.position, fields)
                         for o, fields in zip(written, expected, strict=True)]


async def write_segment(ns: Any, layered: Layered, records: int, entry_records: int) -> None:
    async with ns.open_writer(layered.name) as writer:  # the close seals the segment
        await append(layered, writer, records, entry_records)


async def build(ns: Any, name: str, tier_uri: str, *, typed: bool = False, per_segment: int = 30,
                entry_records: int = 10) -> Layered:
    """The stream of the module doc, its in-progress writer left open (close it: `layered.writer`)."""
    layered = Layered(name, typed, tier_uri)
    await ns.create_stream(name, schema=TYPED if typed else None,
                           tier=TierPolicy(uri=tier_uri, delete_lag_ms=0))
    for _ in SEGMENTS_DELETED:
        await write_segment(ns, layered, per_segment, entry_records)
    report = await Offloader(ns).run(name, now=True)
    assert [o.sequence for o in report.offloaded] == list(SEGMENTS_DELETED), report.to_json()
    await ns.set_tier(name, TierPolicy(delete_lag_ms=-1))  # from now on the bookie copies stay
    for _ in SEGMENTS_BOTH:
        await write_segment(ns, layered, per_segment, entry_records)
    report = await Offloader(ns).run(name, now=True)
    assert [o.sequence for o in report.offloaded] == list(SEGMENTS_BOTH), report.to_json()
    for _ in SEGMENTS_BOOKIES:
        await write_segment(ns, layered, per_segment, entry_records)
    layered.writer = await ns.open_writer(name)
    await append(layered, layered.writer, entry_records * 2, entry_records)
    listing = await ns.store.segments(name)
    states = [(s.sequence, s.tier is not None, s.on_bookies, s.is_in_progress) for s in listing.segments]
    assert states == [(1, True, False, False), (2, True, False, False), (3, True, True, False),
                      (4, True, True, False), (5, False, True, False), (6, False, True, False),
                      (7, False, True, True)], states
    return layered


def rows_of_table(table: pa.Table | pa.RecordBatch, typed: bool, *, position: bool = True) -> list[Row]:
    """Rows from a table with the position columns `ledger`, `entry`, `slot` (and `position`) and
    the record columns as a reader, Spark or a tier file gives them. Timestamps are compared as
    whole numbers of the stream's unit (ms untyped, us typed): no time zone can shift them."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    stamps = table.column("timestamp")
    if pa.types.is_timestamp(stamps.type):
        unit = "us" if typed else "ms"
        stamps = stamps.cast(pa.timestamp(unit, tz=stamps.type.tz)).cast(pa.int64())
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", stamps)
    rows = []
    for record in table.to_pylist():
        if typed:
            fields = (("id", record["id"]), ("name", record["name"]), ("timestamp_us", record["timestamp"]))
        else:
            headers = record.get("headers")
            if headers is not None:
                headers = [(h["key"], h["value"]) for h in headers]
            fields = (("key", record["key"]), ("value", record["value"]), ("headers", headers),
                      ("timestamp_ms", record["timestamp"]))
        rows.append(Row(record["ledger"], record["entry"], record["slot"],
                        record.get("position") if position else None, fields))
    return rows


def without_positions(rows: list[Row]) -> list[Row]:
    return [Row(r.ledger, r.entry, r.slot, None, r.fields) for r in rows]
