"""`dlog read`: the console consumer. Records from an offset, a time or a subscription's committed
offset, up to an offset, a count or (with --follow) Ctrl-C; with --subscription it commits as it
goes, so the next run (or `dlog subscription describe`) continues from there."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import re
import sys
from typing import Any

import click

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import ConfigError
from dlog_tools.cli.common import cluster_options, fails_cleanly, json_option, run_namespace
from dlog_tools.positions import parse_start
from dlog_tools.units import format_time_ms

COMMIT_EVERY_RECORDS_DEFAULT = 1000
COMMIT_INTERVAL_S_DEFAULT = 5.0

def record_json(record: Any, with_headers: bool = False) -> dict[str, Any]:
    """One record as `dlog write --format jsonl` takes it back: text where the bytes are UTF-8,
    else base64 (`value_b64`, `key_b64`, `headers_b64`), so nothing is replaced."""
    # position: the record's stream position, null in a stream written before positions existed
    # until a writer opens it again
    item: dict[str, Any] = {"offset": str(record.offset), "position": record.position}
    if record.fields is not None:  # a typed stream's record: its columns
        for name, value in record.fields.items():
            _put_value(item, name, value)
        return item
    _put_bytes(item, "key", record.key)
    _put_bytes(item, "value", record.value)
    item["timestamp"] = record.timestamp_ms
    if with_headers:  # [name, value] pairs (values as text, like `value`); null for a record without any
        headers = record.headers
        if headers is not None and not all(value is None or _is_utf8(value) for _, value in headers):
            item["headers_b64"] = [[key, None if value is None else base64.b64encode(value).decode()]
                                   for key, value in headers]
        else:
            item["headers"] = None if headers is None else [
                [key, None if value is None else value.decode()] for key, value in headers]
    return item


def _put_bytes(item: dict[str, Any], field: str, data: bytes | None) -> None:
    if data is None:
        item[field] = None
    elif _is_utf8(data):
        item[field] = data.decode()
    else:
        item[f"{field}_b64"] = base64.b64encode(data).decode()


def _put_value(item: dict[str, Any], field: str, value: Any) -> None:
    """A typed column's value as JSON: bytes as `_put_bytes` puts them, decimals and times as text."""
    if isinstance(value, bytes):
        _put_bytes(item, field, value)
    elif isinstance(value, float):
        item[field] = _json_float(value)
    elif value is None or isinstance(value, (bool, int, str)):
        item[field] = value
    elif isinstance(value, list):
        item[field] = [_json_float(entry) if isinstance(entry, float) else entry
                       if isinstance(entry, (bool, int, str, type(None))) else str(entry) for entry in value]
    else:
        item[field] = value.isoformat() if hasattr(value, "isoformat") else str(value)


def _json_float(value: float) -> float | str:
    """A float as JSON takes it: NaN and the infinities as the strings Kafka consumers of a typed
    stream get too ("NaN", "Infinity", "-Infinity"), never a bare NaN token, which is not JSON."""
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


class TextOutput:
    """Plain `dlog read`: records as text lines; bytes that are not UTF-8 are shown with U+FFFD
    replacement characters, and said so on stderr once (--format raw or --json keep them)."""

    def __init__(self, print_key: bool, print_timestamp: bool) -> None:
        self.print_key, self.print_timestamp = print_key, print_timestamp
        self.warned = False

    def line(self, record: Any) -> str:
        fields = []
        if self.print_timestamp:
            fields.append(format_time_ms(record.timestamp_ms))
        if self.print_key:
            fields.append("null" if record.key is None else self._text(record.key, record, "key"))
        if record.fields is not None:  # a typed stream's record: its columns, as one JSON object
            columns: dict[str, Any] = {}
            for name, value in record.fields.items():
                _put_value(columns, name, value)
            fields.append(json.dumps(columns))
        else:
            fields.append(self._text(record.value, record, "value"))
        return "\t".join(fields)

    def _text(self, data: bytes, record: Any, what: str) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError:
            if not self.warned:
                self.warned = True
                click.echo(f"dlog: the {what} of record {record.offset} is not UTF-8 text: shown with "
                           "replacement characters (U+FFFD), as is any other such record; --format raw "
                           "prints the bytes as they are, --json as value_b64", err=True)
            return data.decode(errors="replace")


def raw_line(record: Any, print_key: bool, print_timestamp: bool) -> bytes:
    """--format raw: the bytes as they are, tab-separated fields, one record per line."""
    fields = []
    if print_timestamp:
        fields.append(format_time_ms(record.timestamp_ms).encode())
    if print_key:
        fields.append(b"null" if record.key is None else record.key)
    fields.append(record.value)
    return b"\t".join(fields) + b"\n"


class StopAt:
    """`--to`: an offset, checked against the stream's segment list (it must be a live record of
    the stream, not before --from), then compared in stream order: segment, entry, slot; or a
    stream position, compared with each record's."""

    def __init__(self, text: str | None) -> None:
        from dlog import Offset
        from dlog.offsets import check_position

        self.position: int | None = None
        self.offset = None
        if text is not None and re.fullmatch(r"[0-9]{1,19}", text, re.ASCII):
            self.position = check_position(int(text), "--to position")
        elif text:
            self.offset = Offset.parse(text)
        self._sequences: dict[int, int] = {}

    async def check(self, ns: Any, name: str, start: Any) -> None:
        if self.position is not None:
            if isinstance(start, int) and start > self.position:
                raise ConfigError(f"--to {self.position} is before --from {start}: nothing would be read")
            if any(s.first_position is None for s in (await ns.store.segments(name)).segments):
                raise ConfigError(f"--to {self.position}: stream {name!r} has no record positions yet (a writer "
                                  "assigns them when it next opens the stream); use an offset L:E[:S]")
        if self.offset is None:
            return
        listing = await ns.store.segments(name)
        self._sequences = {s.ledger_id: s.sequence for s in listing.segments}
        segment = listing.by_ledger(self.offset.ledger_id)
        if segment is None or segment.is_truncated:
            live = ", ".join(str(s.ledger_id) for s in listing.live) or "none"
            raise ConfigError(f"--to {self.offset} is not in stream {name!r}: no live segment has ledger "
                              f"{self.offset.ledger_id} (its ledgers: {live})")
        if not segment.is_in_progress and self.offset.entry_id > segment.last_entry:
            raise ConfigError(f"--to {self.offset} is past the end of its segment (ledger {segment.ledger_id} "
                              f"ends at entry {segment.last_entry})")
        if isinstance(start, str) and ":" in start:
            from dlog import Offset

            first = Offset.parse(start)
            if self._key(first) > self._key(self.offset):
                raise ConfigError(f"--to {self.offset} is before --from {first}: nothing would be read")

    def _key(self, offset: Any) -> tuple[float, int, int]:
        # a ledger the list did not have yet is a later segment (the reader follows rolls)
        return (self._sequences.get(offset.ledger_id, float("inf")), offset.entry_id, offset.slot)

    def passed(self, offset: Any) -> bool:
        if self.position is not None:
            return offset.position is not None and offset.position > self.position
        return self.offset is not None and self._key(offset) > self._key(self.offset)

    def reached(self, offset: Any) -> bool:
        if self.position is not None:
            return offset.position is not None and offset.position >= self.position
        return self.offset is not None and self._key(offset) >= self._key(self.offset)


class Committer:
    """--subscription: commit the reader's position every N records or T seconds, and at the end."""

    def __init__(self, ns: Any, name: str, subscription: str | None, every_records: int, interval_s: float) -> None:
        self.ns, self.name, self.subscription = ns, name, subscription
        self.every_records, self.interval_s = every_records, interval_s
        self._uncommitted = 0
        self._last_s = monotonic_s()
        self._committed: Any = None

    async def after_record(self, position: Any) -> None:
        self._uncommitted += 1
        if self._uncommitted >= self.every_records or monotonic_s() - self._last_s >= self.interval_s:
            await self.commit(position)

    async def commit(self, position: Any) -> None:
        if self.subscription is None or position is None or position == self._committed:
            return
        await self.ns.commit_subscription(self.name, self.subscription, position)
        self._committed, self._uncommitted, self._last_s = position, 0, monotonic_s()


@click.command("read")
@click.argument("name")
@click.option("--from", "start", default=None,
              help="earliest (default), latest, an offset L:E[:S], a stream position N, a time (2026-11-20T10:00, "
                   "local unless zoned) or a time before now (-15m); with --subscription, default: its committed "
                   "offset")
@click.option("--to", "end", default=None,
              help="stop after this offset L:E[:S] (a record of the stream) or this stream position N")
@click.option("--max", "max_records", default=None, type=click.IntRange(1), help="stop after N records")
@click.option("--follow", is_flag=True, help="keep reading new records until Ctrl-C")
@click.option("--skip-truncated", is_flag=True, help="start at the earliest record if --from was truncated")
@click.option("--print-key", is_flag=True, help="print the key before the value (null for none), tab-separated")
@click.option("--print-timestamp", is_flag=True, help="print the record's time first, tab-separated")
@click.option("--headers", "with_headers", is_flag=True, help="with --json: each record's headers too")
@click.option("--format", "output_format", type=click.Choice(["text", "raw"]), default="text", show_default=True,
              help="text: UTF-8 lines (other bytes shown as U+FFFD, said on stderr once); raw: the bytes as they "
                   "are")
@click.option("--prefer", type=click.Choice(["bookies", "tier"]), default="bookies", show_default=True,
              help="where to read segments offloaded to the tier whose bookie copy still exists")
@click.option("--subscription", default=None,
              help="start at this subscription's committed offset (earliest if it has none) and commit "
                   "as records are printed")
@click.option("--commit-every", default=COMMIT_EVERY_RECORDS_DEFAULT, show_default=True, type=click.IntRange(1),
              help="with --subscription: commit after this many records")
@click.option("--commit-interval", default=COMMIT_INTERVAL_S_DEFAULT, show_default=True,
              type=click.FloatRange(0.1, 3600), help="with --subscription: commit at least this often (seconds)")
@click.option("--skip-evicted", is_flag=True,
              help="with --subscription: if it was evicted (backlog policy evict), start at the earliest record "
                   "kept instead of failing")
@click.option("--schema-version", type=click.IntRange(1), default=None,
              help="a typed stream: read every record in this schema version (default: the latest)")
@click.option("--compacted", is_flag=True,
              help="read the compacted view (the latest record per key) of compacted segments, then the rest")
@cluster_options
@json_option
@fails_cleanly
def read_command(name: str, start: str | None, end: str | None, max_records: int | None, follow: bool,
                 skip_truncated: bool, print_key: bool, print_timestamp: bool, with_headers: bool,
                 output_format: str, prefer: str, subscription: str | None, commit_every: int,
                 commit_interval: float, schema_version: int | None, compacted: bool,
                 cluster: tuple[str, str, str], as_json: bool, skip_evicted: bool = False) -> None:
    """Print records: one value per line, or with --json one object per line (what
    `dlog write --format jsonl` takes back). A typed stream's record is its columns as one JSON
    object, every record in one schema version (the latest, or --schema-version).

    Ctrl-C ends a --follow read quietly (exit status 0); with --subscription the position reached
    is committed first."""
    from dlog.names import check_stream_name, check_subscription_name

    check_stream_name(name)
    if as_json and output_format == "raw":
        raise ConfigError("--format raw and --json do not go together: --json prints bytes that are not UTF-8 "
                          "as value_b64")
    if subscription is not None:
        check_subscription_name(subscription)
    begin = parse_start(start) if start is not None else None
    stop = StopAt(end)

    async def action(ns: Any) -> None:
        first = begin
        if first is None and subscription is not None:
            committed = await ns.subscription_start(name, subscription, skip_evicted=skip_evicted)
            first = str(committed) if committed is not None else None
        first = "earliest" if first is None else first
        await stop.check(ns, name, first)
        committer = Committer(ns, name, subscription, commit_every, commit_interval)
        async with ns.open_reader(name, first, follow=follow, skip_truncated=skip_truncated,
                                  headers=with_headers, prefer=prefer, schema_version=schema_version,
                                  compacted=compacted) as reader:
            try:
                await _print_records(reader, stop, max_records, committer, as_json, print_key, print_timestamp,
                                     with_headers, output_format == "raw")
            finally:
                await asyncio.shield(committer.commit(reader.position))

    try:
        run_namespace(cluster, action)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a --follow read ends
    except BrokenPipeError:  # `dlog read s | head`: the reader of our output has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


async def _print_records(reader: Any, stop: StopAt, max_records: int | None, committer: Committer,
                         as_json: bool, print_key: bool, print_timestamp: bool, with_headers: bool = False,
                         raw: bool = False) -> None:
    count = 0
    text = TextOutput(print_key, print_timestamp)
    async for record in reader:
        if stop.passed(record.offset):
            return
        if raw:
            sys.stdout.buffer.write(raw_line(record, print_key, print_timestamp))
            sys.stdout.buffer.flush()
        else:
            click.echo(json.dumps(record_json(record, with_headers)) if as_json else text.line(record))
        count += 1
        await committer.after_record(reader.position)
        if (max_records and count >= max_records) or stop.reached(record.offset):
            return
