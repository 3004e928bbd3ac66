"""The `dlog` command: one entry point for running and inspecting a cluster.

Every command that talks to a cluster takes `--zk` (default `$DLOG_ZK`, else 127.0.0.1:2181);
every command that prints data takes `--json`. Errors print one line saying what was wrong and
exit non-zero.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import click

from bookkeeper.errors import ConfigError, DlogError
from bookkeeper.meta.layout import DEFAULT_ROOT
from tools.units import parse_duration_ms, parse_size

DEFAULT_ZK = "127.0.0.1:2181"


def zk_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--zk", default=lambda: os.environ.get("DLOG_ZK", DEFAULT_ZK),
                        show_default="$DLOG_ZK or 127.0.0.1:2181",
                        help="ZooKeeper address, host:port[,host:port...]")(
        click.option("--zk-root", default=DEFAULT_ROOT, show_default=True,
                     help="ZooKeeper node under which the cluster lives")(function))


def json_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")(function)


def fails_cleanly(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a DlogError into one line on stderr and exit status 1."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DlogError as exc:
            click.echo(f"dlog: {exc}", err=True)
            sys.exit(1)

    return wrapper


class ParsedType(click.ParamType):
    """A click type from one of tools.units' parsers, so a bad value gets its one-line message."""

    def __init__(self, name: str, parse: Callable[[str], int]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            return self.parse(value)
        except DlogError as exc:
            self.fail(str(exc), param, ctx)


SIZE = ParsedType("size", parse_size)
DURATION = ParsedType("duration", parse_duration_ms)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dlog")
def main() -> None:
    """dlog: a replicated log service on the design of Apache BookKeeper and DistributedLog."""
    # commands report failures in one line of their own; kazoo's connection chatter is noise there
    # (a bookie process turns its logging back on in bookkeeper.bookie.main)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


# ---------------------------------------------------------------------------- bookie


@main.group()
def bookie() -> None:
    """Run and inspect bookies (storage servers)."""


@bookie.command("start")
@click.option("--dir", "data_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="data directory: journal, entry logs, index, cookie (required; data_dir in a "
                   "config file)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=3181, show_default=True, type=click.IntRange(0, 65535),
              help="bookie protocol port (0: any free port, only without --zk)")
@click.option("--http-port", default=0, show_default=True, type=click.IntRange(-1, 65535),
              help="admin HTTP port (0: any free port, -1: no admin server)")
@click.option("--zk", default=lambda: os.environ.get("DLOG_ZK"), show_default="$DLOG_ZK",
              help="ZooKeeper address; without it the bookie runs unregistered (tests, benchmarks)")
@click.option("--zk-root", default=DEFAULT_ROOT, show_default=True)
@click.option("--bookie-id", default=None, help="identity in ZooKeeper (default host:port)")
@click.option("--rack", default=None, help="rack or zone name used by placement")
@click.option("--no-fsync", is_flag=True, help="skip fdatasync: NOT durable, for experiments only")
@click.option("--group-wait-us", default=0, show_default=True, type=click.IntRange(0, 1_000_000),
              help="longest time a journal record waits for its group commit")
@click.option("--group-bytes", default="512KiB", show_default=True, type=SIZE,
              help="journal group commit flushes once this much is buffered")
@click.option("--entry-log-size", default="256MiB", show_default=True, type=SIZE,
              help="entry log file size before rolling")
@click.option("--entry-log-flush-size", default="2MiB", show_default=True, type=SIZE,
              help="fdatasync entry logs every this many bytes written, so a checkpoint never "
                   "holds the journal's fsync behind one big sync (0: only at checkpoints)")
@click.option("--write-cache-size", default="64MiB", show_default=True, type=SIZE,
              help="write cache size that triggers a checkpoint")
@click.option("--max-entry-size", default="4MiB", show_default=True, type=SIZE)
@click.option("--max-in-flight", default=10_000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="unanswered requests per connection before the bookie stops reading it")
@click.option("--idle-timeout", default=30.0, show_default=True, type=click.FloatRange(0.01),
              help="seconds a partial frame may stall before the connection is closed")
@click.option("--disk-threshold", default=0.95, show_default=True, type=click.FloatRange(0, 1),
              help="disk usage fraction that turns the bookie read-only")
@click.option("--disk-lwm", default=None, type=click.FloatRange(0, 1),
              help="disk usage fraction below which it turns writable again (default threshold-0.05)")
@click.option("--disk-check-interval", default=10.0, show_default=True, type=click.FloatRange(0.01))
@click.option("--gc-interval", default=600.0, show_default=True, type=click.FloatRange(0),
              help="seconds between garbage collections (0: only on POST /api/v1/gc)")
@click.option("--checkpoint-interval", default=10.0, show_default=True, type=click.FloatRange(0.01))
@click.option("--config", type=click.Path(dir_okay=False, exists=True), default=None,
              help="TOML file whose [bookie] table sets any of these (flags and DLOG_BOOKIE_* "
                   "environment variables override it); default $DLOG_CONFIG")
@click.pass_context
@fails_cleanly
def bookie_start(ctx: click.Context, **_: Any) -> None:
    """Run one bookie in the foreground until SIGINT or SIGTERM."""
    from bookkeeper.bookie.main import run
    from tools.config import layered_params

    sys.exit(run(bookie_config(**layered_params(ctx, "bookie", "DLOG_BOOKIE_"))))


def bookie_config(data_dir: Path, host: str, port: int, http_port: int, zk: str | None, zk_root: str,
                  bookie_id: str | None, rack: str | None, no_fsync: bool, group_wait_us: int,
                  group_bytes: int, entry_log_size: int, entry_log_flush_size: int,
                  write_cache_size: int, max_entry_size: int,
                  max_in_flight: int, idle_timeout: float, disk_threshold: float,
                  disk_lwm: float | None, disk_check_interval: float, gc_interval: float,
                  checkpoint_interval: float, config: str | None = None) -> Any:
    """The BookieConfig that `dlog bookie start` settings describe."""
    from bookkeeper.bookie.config import BookieConfig

    if data_dir is None:
        raise ConfigError("a bookie needs a data directory: pass --dir DIR (or data_dir in the "
                          "[bookie] table of --config)")
    from bookkeeper.bookie.server import ServerLimits
    from bookkeeper.protocol.wire import HEADER_BYTES

    limits = ServerLimits(frame_bytes_max=max_entry_size + 1024 + HEADER_BYTES,
                          entry_bytes_max=max_entry_size, in_flight_max=max_in_flight,
                          idle_timeout_s=idle_timeout)
    return BookieConfig(
        data_dir=data_dir, host=host, port=port, http_port=None if http_port < 0 else http_port,
        zk=zk or None, zk_root=zk_root, bookie_id=bookie_id, rack=rack, journal_sync=not no_fsync,
        journal_group_wait_us=group_wait_us, journal_group_bytes_max=group_bytes,
        entry_log_bytes_max=entry_log_size, entry_log_flush_bytes=entry_log_flush_size,
        write_cache_bytes_max=write_cache_size,
        disk_usage_threshold=disk_threshold,
        disk_usage_lwm=disk_lwm if disk_lwm is not None else max(0.001, disk_threshold - 0.05),
        disk_check_interval_s=disk_check_interval, gc_interval_s=gc_interval,
        checkpoint_interval_s=checkpoint_interval, limits=limits)


async def _with_zk(zk: str, action: Callable[[Any], Any]) -> Any:
    from bookkeeper.meta.zk import AsyncZooKeeper

    from tools.config import zk_timeout_s

    client = AsyncZooKeeper(zk, timeout_s=zk_timeout_s())
    await client.start()
    try:
        return await action(client)
    finally:
        await client.close()


@bookie.command("list")
@zk_option
@json_option
@fails_cleanly
def bookie_list(zk: str, zk_root: str, as_json: bool) -> None:
    """List registered bookies with their address, admin URL and state."""
    from bookkeeper.bookie.registration import list_bookies

    bookies = asyncio.run(_with_zk(zk, lambda client: list_bookies(client, zk_root)))
    if as_json:
        for item in bookies:
            click.echo(json.dumps(item, sort_keys=True))
        return
    _print_table(["id", "address", "state", "http", "rack"], bookies)


@bookie.command("info")
@click.argument("bookie_id")
@zk_option
@json_option
@fails_cleanly
def bookie_info(bookie_id: str, zk: str, zk_root: str, as_json: bool) -> None:
    """Show one bookie's details from its admin endpoint."""
    from bookkeeper.bookie.registration import list_bookies

    bookies = asyncio.run(_with_zk(zk, lambda client: list_bookies(client, zk_root)))
    found = [item for item in bookies if item.get("id") == bookie_id]
    if not found:
        known = ", ".join(item.get("id", "?") for item in bookies) or "none registered"
        raise DlogError(f"no bookie {bookie_id!r} is registered (known: {known})")
    details = dict(found[0])
    if details.get("http"):
        details.update(asyncio.run(_http_get_json(details["http"] + "/api/v1/bookie/info")))
    if as_json:
        click.echo(json.dumps(details, sort_keys=True))
    else:
        for key, value in sorted(details.items()):
            click.echo(f"{key:22} {value}")


async def _http_get_json(url: str) -> Any:
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            async with session.get(url) as response:
                return await response.json()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise DlogError(f"cannot reach {url}: {exc!r}") from exc


def _print_table(columns: list[str], rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns)
    for row in rows:
        table.add_row(*("" if row.get(column) is None else str(row.get(column)) for column in columns))
    Console().print(table)


# ---------------------------------------------------------------------------- ledger


def _run_with_client(zk: str, zk_root: str, action: Callable[[Any], Any]) -> Any:
    from bookkeeper.client import BookKeeper
    from tools.config import client_options, zk_timeout_s

    async def go() -> Any:
        async with BookKeeper(zk=zk, root=zk_root, zk_timeout_s=zk_timeout_s(),
                              **client_options()) as client:
            return await action(client)

    return asyncio.run(go())


def _metadata_json(ledger_id: int, metadata: Any, version: int) -> dict[str, Any]:
    return {"ledger_id": ledger_id, "version": version, "state": metadata.state.value,
            "ensemble_size": metadata.ensemble_size, "write_quorum": metadata.write_quorum,
            "ack_quorum": metadata.ack_quorum, "last_entry_id": metadata.last_entry_id,
            "length": metadata.length, "digest": metadata.digest_type.name,
            "ensembles": [{"first_entry": first, "bookies": list(bookies)}
                          for first, bookies in metadata.ensembles],
            "ctime_ms": metadata.ctime_ms, "custom": dict(metadata.custom)}


password_option = click.option("--password", default="", help="ledger password (default empty)")


@main.group()
def ledger() -> None:
    """Create, inspect, read, recover and delete ledgers."""


@ledger.command("create")
@click.option("--ensemble", default=3, show_default=True, type=click.IntRange(1, 64))
@click.option("--write-quorum", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--ack-quorum", default=2, show_default=True, type=click.IntRange(1, 64))
@password_option
@zk_option
@json_option
@fails_cleanly
def ledger_create(ensemble: int, write_quorum: int, ack_quorum: int, password: str, zk: str,
                  zk_root: str, as_json: bool) -> None:
    """Create an empty ledger and close it at once (prints its id); for tests and tooling."""

    async def action(client: Any) -> dict[str, Any]:
        handle = await client.create_ledger(ensemble, write_quorum, ack_quorum,
                                            password=password.encode())
        await handle.close()
        return {"ledger_id": handle.ledger_id, "ensemble": list(handle.metadata.last_ensemble[1])}

    result = _run_with_client(zk, zk_root, action)
    click.echo(json.dumps(result) if as_json else str(result["ledger_id"]))


@ledger.command("list")
@zk_option
@json_option
@fails_cleanly
def ledger_list(zk: str, zk_root: str, as_json: bool) -> None:
    """List ledger ids."""
    ids = _run_with_client(zk, zk_root, lambda client: client.list_ledgers())
    if as_json:
        click.echo(json.dumps({"ledgers": ids}))
    else:
        for ledger_id in ids:
            click.echo(ledger_id)


@ledger.command("show")
@click.argument("ledger_id", type=click.IntRange(0))
@zk_option
@json_option
@fails_cleanly
def ledger_show(ledger_id: int, zk: str, zk_root: str, as_json: bool) -> None:
    """Show a ledger's metadata: state, quorums, fragments, last entry."""

    async def action(client: Any) -> dict[str, Any]:
        metadata, version = await client.ledger_metadata(ledger_id)
        return _metadata_json(ledger_id, metadata, version)

    result = _run_with_client(zk, zk_root, action)
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    for key, value in result.items():
        click.echo(f"{key:15} {value}")


@ledger.command("read")
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--from", "first", default=0, show_default=True, type=click.IntRange(0))
@click.option("--to", "last", default=None, type=click.IntRange(0),
              help="last entry id (default: the last add confirmed)")
@password_option
@zk_option
@json_option
@fails_cleanly
def ledger_read(ledger_id: int, first: int, last: int | None, password: str, zk: str,
                zk_root: str, as_json: bool) -> None:
    """Print entries of a ledger (without recovering it), up to its last add confirmed."""
    import base64

    async def action(client: Any) -> list[Any]:
        handle = await client.open_ledger(ledger_id, password=password.encode(), recovery=False)
        end = handle.last_add_confirmed if last is None else last
        if end < first:
            return []
        return await handle.read(first, end)

    for entry in _run_with_client(zk, zk_root, action):
        if as_json:
            try:
                item = {"entry_id": entry.entry_id, "data": entry.data.decode()}
            except UnicodeDecodeError:
                item = {"entry_id": entry.entry_id, "data_b64": base64.b64encode(entry.data).decode()}
            click.echo(json.dumps(item))
        else:
            click.echo(f"{entry.entry_id}\t{entry.data.decode(errors='replace')}")


@ledger.command("recover")
@click.argument("ledger_id", type=click.IntRange(0))
@password_option
@zk_option
@json_option
@fails_cleanly
def ledger_recover(ledger_id: int, password: str, zk: str, zk_root: str, as_json: bool) -> None:
    """Fence and close a ledger whose writer is gone; prints where it ends."""

    async def action(client: Any) -> dict[str, Any]:
        handle = await client.open_ledger(ledger_id, password=password.encode(), recovery=True)
        return {"ledger_id": ledger_id, "state": handle.metadata.state.value,
                "last_entry_id": handle.last_add_confirmed, "length": handle.metadata.length}

    result = _run_with_client(zk, zk_root, action)
    click.echo(json.dumps(result) if as_json else
               f"ledger {ledger_id} {result['state']} at entry {result['last_entry_id']}")


@ledger.command("delete")
@click.argument("ledger_id", type=click.IntRange(0))
@zk_option
@json_option
@fails_cleanly
def ledger_delete(ledger_id: int, zk: str, zk_root: str, as_json: bool) -> None:
    """Delete a ledger's metadata; bookies reclaim its space by garbage collection."""
    _run_with_client(zk, zk_root, lambda client: client.delete_ledger(ledger_id))
    click.echo(json.dumps({"deleted": ledger_id}) if as_json else f"deleted ledger {ledger_id}")


# ---------------------------------------------------------------------------- standalone


@main.command()
@click.option("--dir", "directory", default="dlog-standalone", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="where ZooKeeper and bookies keep data")
@click.option("--bookies", default=3, show_default=True, type=click.IntRange(0, 32))
@click.option("--zk-port", default=2181, show_default=True, type=click.IntRange(0, 65535))
@click.option("--ui-port", default=0, show_default=True, type=click.IntRange(-1, 65535),
              help="status page port on 127.0.0.1 (0: any free port, -1: no status page)")
@fails_cleanly
def standalone(directory: Path, bookies: int, zk_port: int, ui_port: int) -> None:
    """ZooKeeper plus N bookie processes in the foreground, for development; Ctrl-C stops all."""
    from tools.cluster import LocalCluster
    from tools.ui import UiOptions, UiThread

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    cluster = LocalCluster(directory, bookies=bookies, zk_port=zk_port)
    ui = None if ui_port < 0 else UiThread(UiOptions(cluster.zk_address, cluster.zk_root), port=ui_port)
    try:
        cluster.start()
        ui_url = ui.start() if ui is not None else None
        addresses = ",".join(bookie.address for bookie in cluster.bookies) or "-"
        click.echo(f"dlog standalone ready zk={cluster.zk_address} bookies={addresses} "
                   f"dir={cluster.directory}", nl=True)
        if ui_url is not None:
            click.echo(f"  ui {ui_url}")
        for bookie in cluster.bookies:
            click.echo(f"  bookie {bookie.address} admin {bookie.http} data {bookie.data_dir}")
        sys.stdout.flush()
        while not stop.wait(0.5):
            for bookie in cluster.bookies:
                if bookie.process is not None and not bookie.running and not bookie.exit_reported:
                    click.echo(f"bookie {bookie.address} exited with status "
                               f"{bookie.process.returncode}", err=True)
                    bookie.exit_reported = True
    finally:
        if ui is not None:
            ui.stop()
        cluster.stop()
        click.echo("dlog standalone stopped")


# ---------------------------------------------------------------------------- ui


@main.command("ui")
@zk_option
@click.option("--namespace-root", default="/dlog", show_default=True,
              help="ZooKeeper node whose children are the namespaces")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="port to listen on (0: any free port)")
@fails_cleanly
def ui_command(zk: str, zk_root: str, namespace_root: str, host: str, port: int) -> None:
    """Serve the cluster status page (bookies, stream segments, subscription lag) until Ctrl-C."""
    from tools.ui import UiOptions, serve

    def on_ready(url: str) -> None:
        click.echo(f"dlog ui serving {url} (Ctrl-C stops it)")
        sys.stdout.flush()

    serve(UiOptions(zk, zk_root, namespace_root), host, port, on_ready)


def _register_commands() -> None:
    """Commands kept in their own modules add themselves to `main` when imported."""
    import tools.bench_commands  # noqa: F401
    import tools.stream_commands  # noqa: F401


_register_commands()

if __name__ == "__main__":
    # `python -m tools.cli` runs this file as __main__, a second copy of the module; the commands
    # above registered themselves on the importable tools.cli.main, so run that one
    from tools.cli import main as entry_point

    entry_point()
