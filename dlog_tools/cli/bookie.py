"""`dlog bookie start|list|info`: run and inspect bookies (storage servers)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click

from bookkeeper.errors import DlogError
from dlog_tools.bookie_settings import bookie_config, bookie_options
from dlog_tools.cli.common import (
    fails_cleanly,
    http_get_json,
    json_option,
    print_table,
    with_zk,
    zk_option,
)
from dlog_tools.units import format_size, format_time_ms


@click.group()
def bookie() -> None:
    """Run and inspect bookies (storage servers)."""


@bookie.command("start")
@bookie_options
@click.option("--config", type=click.Path(dir_okay=False, exists=True), default=None,
              help="TOML file whose [bookie] table sets any of these (flags and DLOG_BOOKIE_* "
                   "environment variables override it); default $DLOG_CONFIG")
@click.pass_context
@fails_cleanly
def bookie_start(ctx: click.Context, **_: Any) -> None:
    """Run one bookie in the foreground until SIGINT or SIGTERM."""
    from bookkeeper.bookie.main import run
    from dlog_tools.config import layered_params

    sys.exit(run(bookie_config(layered_params(ctx, "bookie", "DLOG_BOOKIE_"))))


@bookie.command("list")
@zk_option
@json_option
@fails_cleanly
def bookie_list(zk: str, zk_root: str, as_json: bool) -> None:
    """List bookies: registered ones (writable or read-only) and down ones (a cookie in ZooKeeper
    but no registration: stopped, crashed or cut off)."""
    from bookkeeper.bookie.registration import list_bookies_and_down

    bookies = asyncio.run(with_zk(zk, lambda client: list_bookies_and_down(client, zk_root)))
    if as_json:
        for item in bookies:
            click.echo(json.dumps(item, sort_keys=True))
        return
    if not bookies:
        click.echo(f"no bookies under {zk_root}")
        return
    print_table(["id", "address", "state", "http", "rack"],
                [{**item, "state": str(item.get("state")).replace("_", "-")} for item in bookies])


@bookie.command("info")
@click.argument("bookie_id")
@zk_option
@json_option
@fails_cleanly
def bookie_info(bookie_id: str, zk: str, zk_root: str, as_json: bool) -> None:
    """Show one bookie's details from its admin endpoint."""
    from bookkeeper.bookie.registration import list_bookies

    bookies = asyncio.run(with_zk(zk, lambda client: list_bookies(client, zk_root)))
    found = [item for item in bookies if item.get("id") == bookie_id]
    if not found:
        known = ", ".join(item.get("id", "?") for item in bookies) or "none registered"
        raise DlogError(f"no bookie {bookie_id!r} is registered (known: {known})")
    details = dict(found[0])
    if details.get("http"):
        details.update(asyncio.run(http_get_json(details["http"] + "/api/v1/bookie/info")))
    if as_json:
        click.echo(json.dumps(details, sort_keys=True))
        return
    for key, value in sorted(_flattened(details).items()):
        click.echo(f"{key:22} {_detail_text(key, value)}")


def _flattened(details: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as `outer.inner` keys, so every line is `name  value`."""
    flat: dict[str, Any] = {}
    for key, value in details.items():
        if isinstance(value, dict):
            flat.update(_flattened(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _detail_text(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_bytes") and isinstance(value, int):
        return format_size(value)
    if key.endswith("_ms") and isinstance(value, int):
        return format_time_ms(value)
    if key.endswith("usage") and isinstance(value, float):
        return f"{value:.1%}"
    return str(value)
