"""`dlog subscription list|describe|reset|delete`: subscriptions (Kafka's consumer groups) from the
shell. A subscription is a committed offset per stream: the next record its reader will read
(`dlog read --subscription`, the Spark source's `subscription` option). Lag is the records and
bytes after it (dlog/describe.py says how they are counted)."""

from __future__ import annotations

import json
from typing import Any

import click

from dlog_tools.cli.common import cluster_options, fails_cleanly, json_option, print_table, run_namespace
from dlog_tools.units import format_size, plural


@click.group()
def subscription() -> None:
    """List, describe, reset and delete subscriptions, with their lag."""


def _lag_row(stream: str, name: str, lag: dict[str, Any]) -> dict[str, Any]:
    return {"stream": stream, "subscription": name, "offset": lag["offset"],
            "lag_records": f"{lag['lag_records']:,}" + ("" if lag["lag_known"] else " or more"),
            "lag_bytes": format_size(lag["lag_bytes"]), "note": lag["note"]}


@subscription.command("list")
@click.argument("stream", required=False)
@cluster_options
@json_option
@fails_cleanly
def subscription_list(stream: str | None, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Subscriptions of one stream, or of every stream of the namespace, with their lag."""

    async def action(ns: Any) -> dict[str, dict[str, dict[str, Any]]]:
        streams = [stream] if stream else await ns.list_streams()
        found = {}
        for name in streams:
            lags = await ns.subscription_lag(name) if stream or await ns.subscriptions(name) else {}
            if lags or stream:
                found[name] = lags
        return found

    found = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps({"subscriptions": [{"stream": name, "subscription": sub, **lag}
                                                 for name, lags in found.items() for sub, lag in lags.items()]},
                              sort_keys=True))
        return
    rows = [_lag_row(name, sub, lag) for name, lags in found.items() for sub, lag in lags.items()]
    if not rows:
        click.echo(f"stream {stream} has no subscriptions" if stream else "no subscriptions")
        return
    print_table(["stream", "subscription", "offset", "lag_records", "lag_bytes", "note"], rows)


@subscription.command("describe")
@click.argument("stream")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def subscription_describe(stream: str, name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """One subscription: its committed offset, the segment it is in, and its lag."""
    lag = run_namespace(cluster, lambda ns: ns.subscription_lag(stream, name))[name]
    if as_json:
        click.echo(json.dumps({"stream": stream, "subscription": name, **lag}, sort_keys=True))
        return
    click.echo(f"subscription {name} of stream {stream}")
    click.echo(f"  offset      {lag['offset']} (the next record it reads)")
    where = "-" if lag["segment"] is None else f"segment {lag['segment']}, {lag['position']:.0%} read"
    click.echo(f"  position    {where}" + (f" ({lag['note']})" if lag["note"] else ""))
    more = "" if lag["lag_known"] else " or more (some segment's records are unknown)"
    click.echo(f"  lag         {plural(lag['lag_records'], 'record')}{more}, {format_size(lag['lag_bytes'])}")


@subscription.command("reset")
@click.argument("stream")
@click.argument("name")
@click.option("--to", "target", required=True,
              help="earliest, latest, an offset L:E[:S] of the stream, a stream position N, or a time "
                   "(2026-11-20T10:00, -15m): the first record at or after it")
@cluster_options
@json_option
@fails_cleanly
def subscription_reset(stream: str, name: str, target: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Move a subscription's committed offset (creating the subscription if it has none).

    Its reader takes the new offset when it next starts; one running now commits its own position
    over it."""
    from dlog.names import check_subscription_name
    from dlog_tools.positions import first_offset_from, parse_start

    check_subscription_name(name)
    start = parse_start(target, flag="--to")

    async def action(ns: Any) -> tuple[Any, Any]:
        ns.security.require_role(ns.name, "admin", f"resetting subscription {name!r}")
        before = (await ns.subscriptions(stream)).get(name)
        offset = await first_offset_from(ns, stream, start)
        await ns.commit_subscription(stream, name, offset)
        return before, offset

    before, offset = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps({"stream": stream, "subscription": name, "offset": str(offset),
                               "previous": None if before is None else str(before)}))
        return
    click.echo(f"subscription {name} of stream {stream}: {'-' if before is None else before} -> {offset}")


@subscription.command("delete")
@click.argument("stream")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def subscription_delete(stream: str, name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Delete a subscription (retention then no longer keeps what it has not read)."""
    run_namespace(cluster, lambda ns: ns.delete_subscription(stream, name))
    click.echo(json.dumps({"stream": stream, "deleted": name}) if as_json
               else f"deleted subscription {name} of stream {stream}")
