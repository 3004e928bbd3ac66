"""`dlog cluster check` and `dlog ping`: is every bookie able to write and read, and how far away
are ZooKeeper and the bookies (tools/health.py does the work)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

from bookkeeper.errors import DlogError
from tools.cli.common import fails_cleanly, json_option, print_table, run_with_client, zk_option
from tools.units import plural


@click.group()
def cluster() -> None:
    """Check the whole cluster."""


@cluster.command("check")
@click.option("--entries", default=3, show_default=True, type=click.IntRange(1, 100),
              help="entries written to and read back from each bookie")
@zk_option
@json_option
@fails_cleanly
def cluster_check_command(entries: int, zk: str, zk_root: str, as_json: bool) -> None:
    """Write and read back through every bookie (like BookKeeper's simpletest and bookiesanity).

    Each writable bookie gets a ledger of its own (ensemble of 1), written, read back, compared
    and deleted. Read-only bookies are reported, not written to; a bookie with a cookie but no
    registration is down. Exits 1 unless every writable bookie passed and none is down."""
    from tools.health import cluster_check

    rows = run_with_client(zk, zk_root, lambda client: cluster_check(client, client.store.zk, zk_root, entries))
    failed = [row for row in rows if not row["ok"]]
    if as_json:
        click.echo(json.dumps({"ok": not failed and bool(rows), "bookies": rows}, sort_keys=True))
    elif rows:
        print_table(["bookie", "state", "write", "read", "write_ms", "read_ms", "note"], rows)
    if not rows:
        raise DlogError(f"cluster check: no bookie is registered or known under {zk_root}")
    if failed:
        raise DlogError(f"cluster check failed for {plural(len(failed), 'bookie')}: "
                        + "; ".join(f"{row['bookie']} {row['note'] or 'failed'}" for row in failed))
    if not as_json:
        checked = [row for row in rows if row["write"] == "ok"]
        click.echo(f"cluster check passed: {plural(len(checked), 'bookie')} wrote and read back "
                   f"{plural(entries, 'entry', 'entries')} each")


@click.command("ping")
@click.option("--count", default=3, show_default=True, type=click.IntRange(1, 100), help="round trips to each")
@zk_option
@json_option
@fails_cleanly
def ping_command(count: int, zk: str, zk_root: str, as_json: bool) -> None:
    """Round-trip latency to ZooKeeper and to every registered bookie (GET_BOOKIE_INFO)."""
    from tools.config import zk_timeout_s
    from tools.health import ping

    result = asyncio.run(ping(zk, zk_root, count, zk_timeout_s()))
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    else:
        _print_ping(result)
    unreachable = [row["bookie"] for row in result["bookies"] if row["error"]]
    if unreachable:
        raise DlogError(f"no answer from {plural(len(unreachable), 'bookie')}: {', '.join(unreachable)}")


def _print_ping(result: dict[str, Any]) -> None:
    zk = result["zookeeper"]
    click.echo(f"zookeeper {zk['address']}: session in {zk['session_ms']:.1f} ms, round trip "
               f"min {zk['min_ms']:.2f} ms, median {zk['median_ms']:.2f} ms ({zk['count']} pings)")
    for row in result["bookies"]:
        if row["error"]:
            click.echo(f"bookie {row['bookie']}: {row['error']}")
            continue
        click.echo(f"bookie {row['bookie']} ({row['state'].replace('_', '-')}): round trip min {row['min_ms']:.2f} ms, "
                   f"median {row['median_ms']:.2f} ms ({row['count']} pings; connected in {row['connect_ms']:.1f} ms)")
    if not result["bookies"]:
        click.echo("no bookie is registered")
