"""`dlog stream create|list|info|delete`: streams and their segments."""

from __future__ import annotations

import json
from typing import Any

import click

from bookkeeper.errors import ConfigError
from tools.cli.common import (
    cluster_options,
    fails_cleanly,
    json_option,
    print_table,
    run_namespace,
)
from tools.units import DURATION, SIZE, format_duration_ms, format_size, format_time_ms, plural


@click.group()
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
@click.option("--if-not-exists", is_flag=True, help="succeed, changing nothing, if the stream exists")
@cluster_options
@json_option
@fails_cleanly
def stream_create(name: str, ensemble: int, write_quorum: int, ack_quorum: int, roll_size: int | None,
                  roll_age: int | None, roll_records: int, retention_age: int | None,
                  retention_size: int | None, if_not_exists: bool, cluster: tuple[str, str, str],
                  as_json: bool) -> None:
    """Create a stream (default schema: key, value, timestamp)."""
    from bookkeeper.protocol.metadata import check_quorum
    from dlog.names import check_stream_name

    check_stream_name(name)
    check_quorum(ensemble, write_quorum, ack_quorum)
    config = run_namespace(cluster, lambda ns: ns.create_stream(
        name, ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
        roll_bytes=roll_size, roll_age_ms=roll_age, roll_records=roll_records,
        retention_age_ms=retention_age or 0, retention_bytes=retention_size or 0, exist_ok=if_not_exists))
    click.echo(json.dumps(config.public_json(), sort_keys=True) if as_json else f"created stream {name}")


@stream.command("list")
@cluster_options
@json_option
@fails_cleanly
def stream_list(cluster: tuple[str, str, str], as_json: bool) -> None:
    """List the streams of a namespace."""
    names = run_namespace(cluster, lambda ns: ns.list_streams())
    click.echo(json.dumps({"streams": names}) if as_json else "\n".join(names))


@stream.command("info")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def stream_info(name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Settings, records, sizes, offsets, subscriptions (with lag) and segments of a stream.

    A segment whose ledger is missing is shown as DAMAGED: its records are lost."""
    info = run_namespace(cluster, lambda ns: ns.stream_info(name))
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    _print_settings(info["name"], info["config"])
    _print_contents(info)
    if info["subscriptions"]:
        click.echo("subscriptions")
        print_table(["name", "offset", "lag_records", "lag_bytes", "note"],
                    [{**sub, "lag_records": f"{sub['lag_records']:,}", "lag_bytes": format_size(sub["lag_bytes"])}
                     for sub in info["subscriptions"]])
    click.echo("segments")
    print_table(["sequence", "ledger", "state", "entries", "records", "bytes", "first_time", "last_time"],
                [_segment_row(segment) for segment in info["segments"]])


def _print_settings(name: str, config: dict[str, Any]) -> None:
    click.echo(f"stream {name}")
    click.echo(f"  replication   ensemble {config['ensemble']}, write quorum {config['write_quorum']}, "
               f"ack quorum {config['ack_quorum']}")
    limits = [format_size(config["roll_bytes"]), format_duration_ms(config["roll_age_ms"])]
    if config["roll_records"]:
        limits.append(plural(config["roll_records"], "record"))
    click.echo(f"  roll          after {', '.join(limits[:-1])} or {limits[-1]}, whichever comes first")
    age, size = config["retention_age_ms"], config["retention_bytes"]
    click.echo(f"  retention     age {format_duration_ms(age) if age else 'off'}, "
               f"size {format_size(size) if size else 'off'}, "
               f"{'keeps' if config['retention_keeps_unconsumed'] else 'ignores'} what subscribers have not read")
    click.echo(f"  created       {format_time_ms(config['created_ms'])}")


def _print_contents(info: dict[str, Any]) -> None:
    segments = info["segments"]
    alive = [s for s in segments if s["state"] != "truncated"]
    truncated = len(segments) - len(alive)
    estimated = any(s["bytes_estimated"] for s in alive)
    click.echo(f"  records       {plural(info['records'], 'record')} in {plural(len(alive), 'live segment')}"
               + (f" ({truncated} truncated)" if truncated else ""))
    click.echo(f"  size          {format_size(info['bytes'])}"
               + (" (the in-progress segment's is estimated)" if estimated else ""))
    click.echo(f"  offsets       first {info['first_offset'] or '-'}, last {info['last_offset'] or '-'}")
    if info["next_position"] is not None:
        click.echo(f"  positions     first {info['first_position']}, next {info['next_position']}")
    for segment in segments:
        if segment["damaged"]:
            click.echo(f"  DAMAGED       segment {segment['sequence']}: {segment['damaged']}")


def _segment_row(segment: dict[str, Any]) -> dict[str, Any]:
    last, first = segment["last_entry"], segment["first_entry"]
    entries = "-" if last is None or segment["state"] == "truncated" else f"{first}..{last}"
    size = "-" if segment["bytes"] is None else format_size(segment["bytes"])
    return {"sequence": segment["sequence"], "ledger": segment["ledger"],
            "state": "DAMAGED" if segment["damaged"] else segment["state"].replace("_", " "),
            "entries": entries, "records": "-" if segment["records"] is None else f"{segment['records']:,}",
            "bytes": ("~" + size) if segment["bytes_estimated"] else size,
            "first_time": format_time_ms(segment["first_timestamp_ms"], "seconds"),
            "last_time": format_time_ms(segment["last_timestamp_ms"], "seconds")}


@stream.command("alter")
@click.argument("name")
@click.option("--roll-size", type=SIZE, help="roll to a new segment after this many bytes")
@click.option("--roll-age", type=DURATION, help="roll after this long")
@click.option("--roll-records", type=click.IntRange(0), help="roll after this many records (0: no limit)")
@click.option("--retention-age", type=DURATION, help="remove completed segments older than this (0: off)")
@click.option("--retention-size", type=SIZE, help="keep at most this many bytes (0: off)")
@click.option("--keep-unconsumed/--ignore-subscribers", default=None,
              help="whether retention keeps what a subscriber has not read yet")
@cluster_options
@json_option
@fails_cleanly
def stream_alter(name: str, roll_size: int | None, roll_age: int | None, roll_records: int | None,
                 retention_age: int | None, retention_size: int | None, keep_unconsumed: bool | None,
                 cluster: tuple[str, str, str], as_json: bool) -> None:
    """Change a stream's roll and retention settings.

    A writer takes new roll settings when it next opens the stream (`dlog write` does at each
    run); retention applies its settings at its next run."""
    changes = {key: value for key, value in (
        ("roll_bytes", roll_size), ("roll_age_ms", roll_age), ("roll_records", roll_records),
        ("retention_age_ms", retention_age), ("retention_bytes", retention_size),
        ("retention_keeps_unconsumed", keep_unconsumed)) if value is not None}
    if not changes:
        raise ConfigError("nothing to change: give --roll-size, --roll-age, --roll-records, --retention-age, "
                          "--retention-size or --keep-unconsumed/--ignore-subscribers")

    async def action(ns: Any) -> tuple[Any, Any]:
        before = await ns.config(name)
        return before, await ns.alter_stream(name, **changes)

    before, after = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps(after.public_json(), sort_keys=True))
        return
    for key in changes:
        click.echo(f"{name}: {key.removesuffix('_ms')} {_setting_text(key, getattr(before, key))} -> "
                   f"{_setting_text(key, getattr(after, key))}")


def _setting_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.startswith("retention") and value == 0:
        return "off"
    if key.endswith("_ms"):
        return format_duration_ms(value)
    if key.endswith("_bytes"):
        return format_size(value)
    return f"{value:,}" if value else "no limit"


@stream.command("delete")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def stream_delete(name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Delete a stream and its ledgers (bookies reclaim the space by garbage collection)."""
    ledgers = run_namespace(cluster, lambda ns: ns.delete_stream(name))
    click.echo(json.dumps({"deleted": name, "ledgers": ledgers}) if as_json
               else f"deleted stream {name} ({len(ledgers)} ledgers)")

