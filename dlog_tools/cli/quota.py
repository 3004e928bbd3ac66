"""`dlog quota set|show`: a namespace's quotas (admins only: the quota node's ACL)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

from dlog_tools.cli.common import fails_cleanly, json_option, with_zk, zk_option
from dlog_tools.units import SIZE, format_size


@click.group()
def quota() -> None:
    """Set and show namespace quotas (streams, write bytes/s, stored bytes)."""


@quota.command("set")
@click.argument("namespace")
@click.option("--streams", "streams_max", default=None, type=click.IntRange(0),
              help="streams the namespace may have (0: unlimited)")
@click.option("--write-rate", "write_bytes_per_s", default=None, type=SIZE,
              help="entry bytes per second each bookie takes from the namespace, e.g. 50MiB "
                   "(0: unlimited); writers over it are slowed")
@click.option("--stored-bytes", "stored_bytes_max", default=None, type=SIZE,
              help="bytes the namespace may store on the bookies, every copy counted, e.g. 100GiB "
                   "(0: unlimited); bookies refuse its writes while it is over")
@zk_option
@json_option
@fails_cleanly
def quota_set(namespace: str, streams_max: int | None, write_bytes_per_s: int | None,
              stored_bytes_max: int | None, zk: str, zk_root: str, as_json: bool) -> None:
    """Change a namespace's quota (unnamed limits keep their value)."""
    from bookkeeper.meta import layout
    from bookkeeper.security.quota import UNLIMITED, Quota
    from dlog.names import check_subscription_name

    check_subscription_name(namespace)
    path = layout.quota_path(zk_root, namespace)

    async def change(client):
        found = await client.get_or_none(path)
        current = Quota.from_bytes(found[0]) if found is not None else UNLIMITED
        updated = Quota(current.streams_max if streams_max is None else streams_max,
                        current.write_bytes_per_s if write_bytes_per_s is None else write_bytes_per_s,
                        current.stored_bytes_max if stored_bytes_max is None else stored_bytes_max)
        if found is None:
            await client.create(path, updated.to_bytes(), makepath=True)
        else:
            await client.set(path, updated.to_bytes(), found[1])
        return updated

    _print(namespace, asyncio.run(with_zk(zk, change)), None, as_json)


@quota.command("show")
@click.argument("namespace")
@zk_option
@json_option
@fails_cleanly
def quota_show(namespace: str, zk: str, zk_root: str, as_json: bool) -> None:
    """Print a namespace's quota."""
    from bookkeeper.meta import layout
    from bookkeeper.meta.usage import stored_bytes_of
    from bookkeeper.security.quota import UNLIMITED, Quota

    async def read(client):
        found = await client.get_or_none(layout.quota_path(zk_root, namespace))
        return found, await stored_bytes_of(client, zk_root, namespace)

    found, stored_bytes = asyncio.run(with_zk(zk, read))
    _print(namespace, Quota.from_bytes(found[0]) if found is not None else UNLIMITED, stored_bytes, as_json)


def _print(namespace: str, quota: Any, stored_bytes: int | None, as_json: bool) -> None:
    document = {"namespace": namespace, **quota.as_dict()}
    if stored_bytes is not None:
        document["stored_bytes"] = stored_bytes  # as the bookies last published it
    if as_json:
        click.echo(json.dumps(document, sort_keys=True))
        return
    limits = ", ".join(f"{name} {value or 'unlimited'}" for name, value in quota.as_dict().items())
    stored = "" if stored_bytes is None else f"; stored now {format_size(stored_bytes)} (all copies)"
    click.echo(f"quota of {namespace}: {limits}{stored}")
