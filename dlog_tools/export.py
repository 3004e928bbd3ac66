"""Export a stream (or a range of it) to a Parquet or Arrow IPC file, batch by batch.

The file's columns are the offset (ledger, entry, slot) then the stream's own; a timestamp column
without a time zone (the default schema's `timestamp`: milliseconds since the epoch, which is UTC)
is written as `timestamp[ms, tz=UTC]`, so readers do not take it for local time. The file's
schema metadata holds the stream's name (`dlog.stream`) and its schema as stored
(`dlog.schema`: base64 of the Arrow IPC schema, `dlog.segments.codec.schema_from_text` reads it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from bookkeeper.errors import ConfigError
from dlog.offsets import Offset
from dlog.segments.codec import schema_to_text

OFFSET_FIELDS = [pa.field("ledger", pa.int64()), pa.field("entry", pa.int64()), pa.field("slot", pa.int32())]


def check_out_path(out_path: Path, force: bool) -> None:
    """An export never overwrites a file nor creates folders unless forced: a typo in --out must
    not replace yesterday's export or scatter directories."""
    if force:
        return
    if out_path.exists():
        raise ConfigError(f"{out_path} already exists; choose another --out or pass --force to overwrite it")
    if not out_path.parent.is_dir():
        raise ConfigError(f"folder {out_path.parent} does not exist; create it first or pass --force "
                          "to create it")


async def export_stream(ns: Any, name: str, out_path: Path, output_format: str, start: str,
                        end: str | None, *, progress: bool = True, force: bool = False,
                        prefer: str = "bookies", schema_version: int | None = None) -> dict[str, Any]:
    """Write every record from `start` through `end` (inclusive) with its offset columns.
    The file appears only when complete (written to a temporary name, then renamed). Offloaded
    segments are read from the tier as the stream reader reads them (`prefer`: where to read a
    segment that is on the tier and still on the bookies)."""
    stop = Offset.parse(end) if end else None
    if start not in ("earliest", "latest"):
        Offset.parse(start)
    check_out_path(out_path, force)
    info = await ns.stream_info(name)
    total = sum(s["records"] for s in info["segments"] if s["state"] != "truncated") or None
    reader = await ns.open_reader(name, start, follow=False, prefer=prefer, schema_version=schema_version)
    schema = file_schema(name, reader.codec.schema)
    temporary = out_path.with_name(out_path.name + ".partial")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = (pq.ParquetWriter(temporary, schema, compression="zstd") if output_format == "parquet"
              else pa.ipc.new_file(str(temporary), schema))
    records = 0
    bar = Progress(TextColumn(f"export {name}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   disable=not progress, transient=True)
    try:
        with bar:
            task = bar.add_task("records", total=total)
            while (entry := await reader.next_entry()) is not None:
                batch, done = _with_offsets(entry, schema, stop)
                if batch.num_rows:
                    writer.write_table(pa.Table.from_batches([batch])) if output_format == "parquet" \
                        else writer.write_batch(batch)
                    records += batch.num_rows
                    bar.update(task, advance=batch.num_rows)
                if done:
                    break
        writer.close()
        os.replace(temporary, out_path)
    except BaseException:
        writer.close()
        temporary.unlink(missing_ok=True)
        raise
    finally:
        await reader.close()
    if stop is not None and records == 0:
        raise ConfigError(f"nothing to export between {start} and {end}")
    return {"stream": name, "records": records, "path": str(out_path), "format": output_format,
            "bytes": out_path.stat().st_size}


def file_schema(name: str, stream_schema: pa.Schema) -> pa.Schema:
    """The offset columns, then the stream's (zone-less timestamps as UTC), with the stream's name
    and schema in the metadata."""
    fields = [field.with_type(pa.timestamp(field.type.unit, tz="UTC"))
              if pa.types.is_timestamp(field.type) and field.type.tz is None else field for field in stream_schema]
    return pa.schema(OFFSET_FIELDS + fields, metadata={b"dlog.stream": name.encode(),
                                                       b"dlog.schema": schema_to_text(stream_schema).encode()})


def _with_offsets(entry: Any, schema: pa.Schema, stop: Offset | None) -> tuple[pa.RecordBatch, bool]:
    batch = entry.batch
    done = False
    if stop is not None and stop.ledger_id == entry.ledger_id and stop.entry_id <= entry.entry_id:
        keep = max(0, stop.slot - entry.first_slot + 1) if stop.entry_id == entry.entry_id else 0
        batch, done = batch.slice(0, keep), True
    rows = batch.num_rows
    columns = [pa.array([entry.ledger_id] * rows, pa.int64()), pa.array([entry.entry_id] * rows, pa.int64()),
               pa.array(range(entry.first_slot, entry.first_slot + rows), pa.int32())]
    # a zone-less timestamp holds UTC milliseconds: the cast to tz=UTC keeps the values
    stream_columns = [column.cast(field.type) if column.type != field.type else column
                      for column, field in zip(batch.columns, list(schema)[len(OFFSET_FIELDS):], strict=True)]
    return pa.RecordBatch.from_arrays(columns + stream_columns, schema=schema), done
