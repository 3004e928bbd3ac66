"""`dlog retention set|apply`: retention policies by age and by size."""

from __future__ import annotations

import json
from typing import Any

import click

from bookkeeper.errors import ConfigError
from dlog_tools.cli.common import (
    cluster_options,
    fails_cleanly,
    json_option,
    print_table,
    run_namespace,
)
from dlog_tools.units import DURATION, SIZE, format_duration_ms, format_size, format_time_ms, plural


@click.group()
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
def retention_set(name: str, age: int | None, size: int | None, keep_unconsumed: bool | None,
                  cluster: tuple[str, str, str], as_json: bool) -> None:
    """Change a stream's retention policy."""
    if age is None and size is None and keep_unconsumed is None:
        raise ConfigError("nothing to set: give --age, --size or --keep-unconsumed/--ignore-subscribers")
    config = run_namespace(cluster, lambda ns: ns.set_retention(name, age_ms=age, size_bytes=size,
                                                            keep_unconsumed=keep_unconsumed))
    result = {"stream": name, "retention_age_ms": config.retention_age_ms,
              "retention_bytes": config.retention_bytes,
              "keeps_unconsumed": config.retention_keeps_unconsumed}
    age_text = format_duration_ms(config.retention_age_ms) if config.retention_age_ms else "off"
    click.echo(json.dumps(result) if as_json else
               f"{name}: retention age {age_text}"
               f", size {format_size(config.retention_bytes) if config.retention_bytes else 'off'}, "
               f"{'keeps' if config.retention_keeps_unconsumed else 'ignores'} what subscribers have not read")


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

    results = run_namespace(cluster, action)
    rows = [{"stream": stream_name, "sequence": s.sequence, "ledger": s.ledger_id, "records": s.records,
             "bytes": s.bytes, "last_timestamp_ms": s.last_timestamp_ms}
            for stream_name, segments in results.items() for s in segments]
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "segments": rows}))
    else:
        click.echo(f"{'would remove' if dry_run else 'removed'} {plural(len(rows), 'segment')}")
        if rows:
            print_table(["stream", "sequence", "ledger", "records", "bytes", "last_time"],
                        [{**row, "bytes": format_size(row["bytes"]),
                          "last_time": format_time_ms(row["last_timestamp_ms"])} for row in rows])

