"""`dlog stream ...`, `dlog write`, `dlog read`, `dlog truncate`, `dlog retention ...`, `dlog export`.

Every command takes `--zk` and `--namespace`; those that print data take `--json`. Bad input
(names, offsets, sizes, durations) is refused before anything changes, with one line saying what
was wrong and what would be right.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from bookkeeper.errors import ConfigError
from bookkeeper.meta.layout import DEFAULT_ROOT
from tools.cli import DURATION, SIZE, _print_table, fails_cleanly, json_option, main
from tools.config import client_options, zk_timeout_s
from tools.units import format_size


def cluster_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--zk, --zk-root (the BookKeeper cluster's root) and --namespace, collected into `cluster`."""

    @functools.wraps(function)
    def wrapper(*args: Any, zk: str, zk_root: str, namespace: str, **kwargs: Any) -> Any:
        return function(*args, cluster=(zk, zk_root, namespace), **kwargs)

    wrapper = click.option("--zk", default=lambda: os.environ.get("DLOG_ZK", "127.0.0.1:2181"),
                           show_default="$DLOG_ZK or 127.0.0.1:2181", help="ZooKeeper address")(wrapper)
    wrapper = click.option("--zk-root", default=DEFAULT_ROOT, show_default=True,
                           help="ZooKeeper node of the BookKeeper cluster")(wrapper)
    return click.option("--namespace", default="default", show_default=True,
                        help="namespace (a ZooKeeper subtree /dlog/<namespace>)")(wrapper)


def run(cluster: tuple[str, str, str], action: Callable[[Any], Any]) -> Any:
    from dlog import Namespace

    zk, zk_root, namespace = cluster

    async def go() -> Any:
        async with Namespace(zk, namespace, bookkeeper_root=zk_root, zk_timeout_s=zk_timeout_s(),
                             **client_options()) as ns:
            return await action(ns)

    return asyncio.run(go())


# ---------------------------------------------------------------------------- stream


@main.group()
def stream() -> None:
    """Create, list, inspect and delete streams."""


@stream.command("create")
@click.argument("name")
@click.option("--ensemble", default=3, show_default=True, type=click.IntRange(1, 64))
@click.option("--write-quorum", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--ack-quorum", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--roll-size", type=SIZE, help="roll to a new segment after this many bytes (default 256MiB)")
@click.option("--roll-age", type=DURATION, help="roll after this long (default 2h)")
@click.option("--roll-records", default=0, type=click.IntRange(0), help="roll after this many records (0: never)")
@click.option("--retention-age", type=DURATION, default=None, help="remove segments older than this")
@click.option("--retention-size", type=SIZE, default=None, help="keep at most this many bytes")
@cluster_options
@json_option
@fails_cleanly
def stream_create(name: str, ensemble: int, write_quorum: int, ack_quorum: int, roll_size: int | None,
                  roll_age: int | None, roll_records: int, retention_age: int | None,
                  retention_size: int | None, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Create a stream (default schema: key, value, timestamp)."""
    from dlog.names import check_stream_name
    from dlog.segments.metadata import check_quorum

    check_stream_name(name)
    check_quorum(ensemble, write_quorum, ack_quorum)
    config = run(cluster, lambda ns: ns.create_stream(
        name, ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
        roll_bytes=roll_size, roll_age_ms=roll_age, roll_records=roll_records,
        retention_age_ms=retention_age or 0, retention_bytes=retention_size or 0))
    click.echo(json.dumps(config.public_json(), sort_keys=True) if as_json else f"created stream {name}")


@stream.command("list")
@cluster_options
@json_option
@fails_cleanly
def stream_list(cluster: tuple[str, str, str], as_json: bool) -> None:
    """List the streams of a namespace."""
    names = run(cluster, lambda ns: ns.list_streams())
    click.echo(json.dumps({"streams": names}) if as_json else "\n".join(names))


@stream.command("info")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def stream_info(name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Segments, ledgers, record counts, sizes and offsets of a stream."""
    info = run(cluster, lambda ns: ns.stream_info(name))
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    config = info["config"]
    click.echo(f"stream {name}: E{config['ensemble']}/Qw{config['write_quorum']}/Qa{config['ack_quorum']}, "
               f"{len(info['segments'])} segments, "
               f"{sum(s['records'] for s in info['segments']):,} records (completed segments)")
    _print_table(["sequence", "ledger", "state", "first_entry", "last_entry", "records", "bytes", "min_active"],
                 [{**s, "bytes": format_size(s["bytes"])} for s in info["segments"]])


@stream.command("delete")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def stream_delete(name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Delete a stream and its ledgers (bookies reclaim the space by garbage collection)."""
    ledgers = run(cluster, lambda ns: ns.delete_stream(name))
    click.echo(json.dumps({"deleted": name, "ledgers": ledgers}) if as_json
               else f"deleted stream {name} ({len(ledgers)} ledgers)")


# ---------------------------------------------------------------------------- write and read


def _parse_jsonl(line: str, number: int) -> tuple[bytes, bytes | None, int | None]:
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"line {number} is not JSON ({exc}); with --format jsonl write objects like "
                          '{"key": "k", "value": "v", "timestamp": 1700000000000}') from exc
    if not isinstance(item, dict) or "value" not in item:
        raise ConfigError(f'line {number} needs a "value" field, e.g. {{"value": "hello"}}')
    key = item.get("key")
    timestamp = item.get("timestamp")
    if timestamp is not None and not isinstance(timestamp, int):
        raise ConfigError(f"line {number}: timestamp must be integer milliseconds, got {timestamp!r}")
    return (str(item["value"]).encode(), None if key is None else str(key).encode(), timestamp)


@main.command("write")
@click.argument("name")
@click.option("--format", "input_format", type=click.Choice(["lines", "jsonl"]), default="lines",
              show_default=True, help="lines: one value per line; jsonl: key/value/timestamp objects")
@cluster_options
@json_option
@fails_cleanly
def write_command(name: str, input_format: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Write records from standard input, one per line."""
    lines = [line.rstrip("\n") for line in sys.stdin]
    records = [(_parse_jsonl(line, number + 1) if input_format == "jsonl" else (line.encode(), None, None))
               for number, line in enumerate(lines) if line]

    async def action(ns: Any) -> list[Any]:
        async with ns.open_writer(name) as writer:
            futures = []
            for value, key, timestamp in records:
                await writer.wait_writable()
                futures.append(writer.write_nowait(value, key, timestamp))
            return list(await asyncio.gather(*futures))

    offsets = run(cluster, action) if records else []
    result = {"count": len(offsets), "first": str(offsets[0]) if offsets else None,
              "last": str(offsets[-1]) if offsets else None}
    click.echo(json.dumps(result) if as_json else f"wrote {len(offsets)} records to {name}")


def _record_json(record: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"offset": str(record.offset)}
    item["key"] = None if record.key is None else record.key.decode(errors="replace")
    try:
        item["value"] = record.value.decode()
    except UnicodeDecodeError:
        item["value_b64"] = base64.b64encode(record.value).decode()
    item["timestamp"] = record.timestamp_ms
    return item


@main.command("read")
@click.argument("name")
@click.option("--from", "start", default="earliest", show_default=True,
              help="earliest, latest or an offset L:E[:S]")
@click.option("--to", "end", default=None, help="stop after this offset L:E[:S]")
@click.option("--max", "max_records", default=None, type=click.IntRange(1), help="stop after N records")
@click.option("--follow", is_flag=True, help="keep reading new records until Ctrl-C")
@click.option("--skip-truncated", is_flag=True, help="start at the earliest record if --from was truncated")
@cluster_options
@json_option
@fails_cleanly
def read_command(name: str, start: str, end: str | None, max_records: int | None, follow: bool,
                 skip_truncated: bool, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Print records: one value per line, or with --json one object per line."""
    from dlog import Offset

    if start not in ("earliest", "latest"):
        Offset.parse(start)
    stop = Offset.parse(end) if end else None

    async def action(ns: Any) -> None:
        async with ns.open_reader(name, start, follow=follow, skip_truncated=skip_truncated) as reader:
            count = 0
            async for record in reader:
                click.echo(json.dumps(_record_json(record)) if as_json
                           else record.value.decode(errors="replace"))
                count += 1
                if (max_records and count >= max_records) or (stop is not None and record.offset == stop):
                    return

    run(cluster, action)


@main.command("truncate")
@click.argument("name")
@click.option("--before", required=True, help="remove every record strictly below this offset L:E[:S]")
@cluster_options
@json_option
@fails_cleanly
def truncate_command(name: str, before: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Remove records below an offset (whole segments are deleted)."""
    from dlog import Offset

    offset = Offset.parse(before)
    removed = run(cluster, lambda ns: ns.truncate(name, offset))
    result = {"stream": name, "before": str(offset), "segments_removed": [s.sequence for s in removed]}
    click.echo(json.dumps(result) if as_json else
               f"truncated {name} before {offset}: removed {len(removed)} segments")


# ---------------------------------------------------------------------------- retention


@main.group()
def retention() -> None:
    """Set and apply retention policies (by age and by size)."""


@retention.command("set")
@click.argument("name")
@click.option("--age", type=DURATION, default=None, help="remove completed segments older than this (0 = off)")
@click.option("--size", type=SIZE, default=None, help="keep at most this many bytes (0 = off)")
@click.option("--keep-unconsumed/--ignore-subscribers", default=None,
              help="keep data a subscriber has not consumed yet")
@cluster_options
@json_option
@fails_cleanly
def retention_set(name: str, age: int | None, size: int | None, keep_unconsumed: bool | None, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Change a stream's retention policy."""
    if age is None and size is None and keep_unconsumed is None:
        raise ConfigError("nothing to set: give --age, --size or --keep-unconsumed/--ignore-subscribers")
    config = run(cluster, lambda ns: ns.set_retention(name, age_ms=age, size_bytes=size,
                                                            keep_unconsumed=keep_unconsumed))
    result = {"stream": name, "retention_age_ms": config.retention_age_ms,
              "retention_bytes": config.retention_bytes,
              "keeps_unconsumed": config.retention_keeps_unconsumed}
    click.echo(json.dumps(result) if as_json else
               f"{name}: retention age {config.retention_age_ms} ms, size {config.retention_bytes} bytes")


@retention.command("apply")
@click.argument("name", required=False)
@click.option("--dry-run", is_flag=True, help="list what would be removed, remove nothing")
@cluster_options
@json_option
@fails_cleanly
def retention_apply(name: str | None, dry_run: bool, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Apply retention to one stream or to every stream of the namespace."""

    async def action(ns: Any) -> dict[str, list[Any]]:
        names = [name] if name else await ns.list_streams()
        return {stream_name: await ns.apply_retention(stream_name, dry_run=dry_run) for stream_name in names}

    results = run(cluster, action)
    rows = [{"stream": stream_name, "sequence": s.sequence, "ledger": s.ledger_id, "records": s.records,
             "bytes": s.bytes, "last_timestamp_ms": s.last_timestamp_ms}
            for stream_name, segments in results.items() for s in segments]
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "segments": rows}))
    else:
        click.echo(f"{'would remove' if dry_run else 'removed'} {len(rows)} segments")
        if rows:
            _print_table(list(rows[0]), rows)


# ---------------------------------------------------------------------------- export


@main.command("export")
@click.argument("name")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["parquet", "arrow"]), default="parquet",
              show_default=True)
@click.option("--from", "start", default="earliest", show_default=True, help="earliest or L:E[:S]")
@click.option("--to", "end", default=None, help="last offset to export L:E[:S]")
@cluster_options
@json_option
@fails_cleanly
def export_command(name: str, out_path: Path, output_format: str, start: str, end: str | None, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Export a stream's records to a Parquet or Arrow IPC file, with a progress bar."""
    from tools.export import export_stream

    result = run(cluster, lambda ns: export_stream(ns, name, out_path, output_format, start, end,
                                                         progress=not as_json))
    click.echo(json.dumps(result) if as_json else
               f"exported {result['records']:,} records to {out_path} ({format_size(result['bytes'])})")
