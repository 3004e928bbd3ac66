"""`dlog ledger create|list|show|read|recover|delete`: ledgers directly, below streams."""

from __future__ import annotations

import json
from typing import Any

import click

from bookkeeper.errors import ConfigError
from dlog_tools.cli.common import fails_cleanly, json_option, run_with_client, zk_option
from dlog_tools.units import format_time_ms


def _metadata_json(ledger_id: int, metadata: Any, version: int) -> dict[str, Any]:
    return {"ledger_id": ledger_id, "version": version, "state": metadata.state.value,
            "ensemble_size": metadata.ensemble_size, "write_quorum": metadata.write_quorum,
            "ack_quorum": metadata.ack_quorum, "last_entry_id": metadata.last_entry_id,
            "length": metadata.length, "digest": metadata.digest_type.name,
            "ensembles": [{"first_entry": first, "last_entry": _fragment_end(metadata, index),
                           "bookies": list(bookies)}
                          for index, (first, bookies) in enumerate(metadata.ensembles)],
            "ctime_ms": metadata.ctime_ms, "custom": dict(metadata.custom)}


def _fragment_end(metadata: Any, index: int) -> int | None:
    """The last entry a fragment holds (None: the last fragment of an open ledger, still written)."""
    if index + 1 < len(metadata.ensembles):
        end = metadata.ensembles[index + 1][0] - 1
        return min(end, metadata.last_entry_id) if metadata.is_closed else end
    return metadata.last_entry_id if metadata.is_closed else None


password_option = click.option("--password", default="", help="ledger password (default empty)")


@click.group()
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

    result = run_with_client(zk, zk_root, action)
    click.echo(json.dumps(result) if as_json else str(result["ledger_id"]))


@ledger.command("list")
@zk_option
@json_option
@fails_cleanly
def ledger_list(zk: str, zk_root: str, as_json: bool) -> None:
    """List ledger ids."""
    ids = run_with_client(zk, zk_root, lambda client: client.list_ledgers())
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

    result = run_with_client(zk, zk_root, action)
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    _print_metadata(result)


def _print_metadata(result: dict[str, Any]) -> None:
    """One `name  value` line each; ensembles as `from entry N: bookies`, custom as k=v."""
    shown = {**result, "ctime_ms": None, "ensembles": None, "custom": None}
    for key, value in shown.items():
        if value is not None:
            click.echo(f"{key:15} {value}")
    click.echo(f"{'created':15} {format_time_ms(result['ctime_ms'])}")
    for item in result["ensembles"]:
        first, last = item["first_entry"], item["last_entry"]
        span = f"entries {first}-{last}" if last is not None else f"entries {first}- (open)"
        if last is not None and last < first:
            span = "no entries"
        click.echo(f"{'fragment':15} {span}: {', '.join(item['bookies'])}")
    custom = " ".join(f"{key}={value}" for key, value in sorted(result["custom"].items()))
    click.echo(f"{'custom':15} {custom or '-'}")


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
    """Print entries of a ledger (without recovering it), up to its last add confirmed.

    A stream's segment is refused with the command that reads its records (`dlog read`): its
    entries are encoded record batches, under the stream's own password."""
    import base64

    async def action(client: Any) -> list[Any]:
        metadata, _ = await client.ledger_metadata(ledger_id)
        custom = dict(metadata.custom)
        if custom.get("stream") and custom.get("namespace") and not password:
            stream_name, namespace = custom["stream"], custom["namespace"]
            raise ConfigError(f"ledger {ledger_id} is a segment of stream {stream_name!r} in namespace {namespace!r}: "
                              f"its entries are encoded record batches; read its records with `dlog read "
                              f"{stream_name} --namespace {namespace}` (add --json for offsets)")
        handle = await client.open_ledger(ledger_id, password=password.encode(), recovery=False)
        end = handle.last_add_confirmed if last is None else last
        if end < first:
            return []
        return await handle.read(first, end)

    for entry in run_with_client(zk, zk_root, action):
        if as_json:
            try:
                item = {"entry_id": entry.entry_id, "data": entry.payload.decode()}
            except UnicodeDecodeError:
                item = {"entry_id": entry.entry_id, "data_b64": base64.b64encode(entry.payload).decode()}
            click.echo(json.dumps(item))
        else:
            click.echo(f"{entry.entry_id}\t{entry.payload.decode(errors='replace')}")


force_option = click.option("--force", is_flag=True,
                            help="even if the ledger is a live segment of a stream (breaks that stream)")


async def refuse_stream_ledger(client: Any, ledger_id: int, doing: str, consequence: str,
                               only_open: bool = False) -> None:
    """LedgerInUseError when the ledger is a live segment of a stream (its metadata names the stream
    and the stream's segment list agrees)."""
    from dlog.describe import LedgerInUseError, segment_of_ledger

    metadata, _ = await client.ledger_metadata(ledger_id)
    if only_open and metadata.is_closed:
        return
    owner = await segment_of_ledger(client.store.zk, ledger_id, dict(metadata.custom))
    if owner is not None:
        raise LedgerInUseError(f"ledger {ledger_id} is {owner}; {doing} it would {consequence}; "
                               "pass --force to do it anyway")


async def require_ledger_admin(client: Any, ledger_id: int, doing: str) -> None:
    """Recovering or deleting a namespace's ledger is its admins' (issue 20: a consumer deleted a
    stream's data); ZooKeeper's ACLs and the bookies refuse others too, this says so first."""
    metadata, _ = await client.ledger_metadata(ledger_id)
    namespace = dict(metadata.custom).get("namespace")
    if namespace is not None:
        client.security.require_role(namespace, "admin", f"{doing} ledger {ledger_id}")


@ledger.command("recover")
@click.argument("ledger_id", type=click.IntRange(0))
@password_option
@force_option
@zk_option
@json_option
@fails_cleanly
def ledger_recover(ledger_id: int, password: str, force: bool, zk: str, zk_root: str, as_json: bool) -> None:
    """Fence and close a ledger whose writer is gone; prints where it ends.

    Refuses an open ledger that is a stream's segment (that would fence the stream's writer)
    unless --force."""

    async def action(client: Any) -> dict[str, Any]:
        await require_ledger_admin(client, ledger_id, "recovering")
        if not force:
            await refuse_stream_ledger(client, ledger_id, "recovering",
                                       "fence that stream's writer (its records in flight would fail)",
                                       only_open=True)
        handle = await client.open_ledger(ledger_id, password=password.encode(), recovery=True)
        return {"ledger_id": ledger_id, "state": handle.metadata.state.value,
                "last_entry_id": handle.last_add_confirmed, "length": handle.metadata.length}

    result = run_with_client(zk, zk_root, action)
    click.echo(json.dumps(result) if as_json else
               f"ledger {ledger_id} {result['state']} at entry {result['last_entry_id']}")


@ledger.command("delete")
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--force", is_flag=True,
              help="even if the ledger is a live segment of a stream: its records are destroyed for good "
                   "(readers stop at a completed segment whose ledger is gone until the stream is "
                   "truncated past it), and a writer appending to it fails, the records it had "
                   "acknowledged into it lost")
@zk_option
@json_option
@fails_cleanly
def ledger_delete(ledger_id: int, force: bool, zk: str, zk_root: str, as_json: bool) -> None:
    """Delete a ledger's metadata; bookies reclaim its space by garbage collection.

    Refuses a ledger that is a live segment of a stream unless --force: to remove a stream's old
    records use `dlog truncate` or retention, which keep the stream consistent. Deleting a ledger
    destroys its records even before garbage collection: nothing reads a ledger without metadata."""

    async def action(client: Any) -> None:
        await require_ledger_admin(client, ledger_id, "deleting")
        if not force:
            await refuse_stream_ledger(client, ledger_id, "deleting",
                                       "lose that segment's records (use `dlog truncate` or retention "
                                       "to remove old records)")
        await client.delete_ledger(ledger_id)

    run_with_client(zk, zk_root, action)
    click.echo(json.dumps({"deleted": ledger_id}) if as_json else f"deleted ledger {ledger_id}")
