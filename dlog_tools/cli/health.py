"""`dlog cluster check` and `dlog ping`: is every bookie able to write and read, and how far away
are ZooKeeper and the bookies (dlog_tools/health.py does the work)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

from bookkeeper.errors import DlogError
from dlog_tools.cli.common import fails_cleanly, json_option, print_table, run_with_client, zk_option
from dlog_tools.units import plural


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
    from dlog_tools.health import cluster_check

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
    from dlog_tools.config import zk_timeout_s
    from dlog_tools.health import ping

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


@cluster.command("secure")
@click.option("--bookie-zk-user", required=True, help="the bookies' ZooKeeper digest user (bookie start --zk-user)")
@click.option("--bookie-zk-password-file", required=True, type=click.Path(dir_okay=False),
              help="the file with that user's password (bookie start --zk-password-file)")
@zk_option
@json_option
@fails_cleanly
def cluster_secure_command(bookie_zk_user: str, bookie_zk_password_file: str, zk: str, zk_root: str,
                           as_json: bool) -> None:
    """Close ZooKeeper to everyone but the cluster's own identities (docs/security.md).

    Run once as an admin (a client.toml whose zk_user is a ZooKeeper super user), best before the
    first bookie starts; running it again changes nothing. Creates the cluster root for the bookies
    and /dlog for the admin; the root node and /zookeeper/quota then take nodes from super users
    only, and ledger directories or an id counter that anyone could write (made by an earlier
    version) are closed. `dlog standalone --secure` does this by itself."""
    from pathlib import Path

    from bookkeeper.errors import ConfigError
    from bookkeeper.meta.acl import digest_id
    from bookkeeper.security.settings import load_client_settings
    from dlog_tools.secure import lock_down

    settings = load_client_settings()
    if not (settings.zk_user and settings.zk_password):
        raise ConfigError("dlog cluster secure runs as a ZooKeeper super user: use an admin's client.toml "
                          "(--config or $DLOG_CONFIG, with zk_user and zk_password)")
    try:
        password = Path(bookie_zk_password_file).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read --bookie-zk-password-file {bookie_zk_password_file}: {exc.strerror}") from exc
    changed = lock_down(zk, settings.zk_user, settings.zk_password, [digest_id(bookie_zk_user, password)], zk_root)
    click.echo(json.dumps(changed) if as_json else
               f"ZooKeeper at {zk} secured: {plural(changed['created'], 'node')} created, "
               f"{plural(changed['closed'], 'node')} closed to anyone")
