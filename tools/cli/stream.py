"""`dlog stream create|list|info|delete`: streams and their segments."""

from __future__ import annotations

import json

import click

from tools.cli.common import (
    DURATION,
    SIZE,
    cluster_options,
    fails_cleanly,
    json_option,
    print_table,
    run_namespace,
)
from tools.units import format_size


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
    config = run_namespace(cluster, lambda ns: ns.create_stream(
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
    names = run_namespace(cluster, lambda ns: ns.list_streams())
    click.echo(json.dumps({"streams": names}) if as_json else "\n".join(names))


@stream.command("info")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def stream_info(name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Segments, ledgers, record counts, sizes and offsets of a stream."""
    info = run_namespace(cluster, lambda ns: ns.stream_info(name))
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    config = info["config"]
    click.echo(f"stream {name}: E{config['ensemble']}/Qw{config['write_quorum']}/Qa{config['ack_quorum']}, "
               f"{len(info['segments'])} segments, "
               f"{sum(s['records'] for s in info['segments']):,} records (completed segments)")
    print_table(["sequence", "ledger", "state", "first_entry", "last_entry", "records", "bytes", "min_active"],
                 [{**s, "bytes": format_size(s["bytes"])} for s in info["segments"]])


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

