"""`dlog quota set|show`: a namespace's quotas (admins only: the quota node's ACL)."""

from __future__ import annotations

import asyncio
import json

import click

from tools.cli.common import SIZE, fails_cleanly, json_option, with_zk, zk_option


@click.group()
def quota() -> None:
    """Set and show namespace quotas (streams, write bytes/s)."""


@quota.command("set")
@click.argument("namespace")
@click.option("--streams", "streams_max", default=None, type=click.IntRange(0),
              help="streams the namespace may have (0: unlimited)")
@click.option("--write-rate", "write_bytes_per_s", default=None, type=SIZE,
              help="entry bytes per second each bookie takes from the namespace, e.g. 50MiB "
                   "(0: unlimited); writers over it are slowed")
@zk_option
@json_option
@fails_cleanly
def quota_set(namespace: str, streams_max: int | None, write_bytes_per_s: int | None, zk: str,
              zk_root: str, as_json: bool) -> None:
    """Change a namespace's quota (unnamed limits keep their value)."""
    from bookkeeper.meta import layout
    from bookkeeper.security.quota import UNLIMITED, Quota
    from dlog.names import check_subscription_name

    check_subscription_name(namespace)
    path = layout.quota_path(zk_root, namespace)

    async def change(client):  # type: ignore[no-untyped-def]
        found = await client.get_or_none(path)
        current = Quota.from_bytes(found[0]) if found is not None else UNLIMITED
        updated = Quota(current.streams_max if streams_max is None else streams_max,
                        current.write_bytes_per_s if write_bytes_per_s is None else write_bytes_per_s)
        if found is None:
            await client.create(path, updated.to_bytes(), makepath=True)
        else:
            await client.set(path, updated.to_bytes(), found[1])
        return updated

    updated = asyncio.run(with_zk(zk, change))
    document = {"namespace": namespace, "streams_max": updated.streams_max,
                "write_bytes_per_s": updated.write_bytes_per_s}
    click.echo(json.dumps(document, sort_keys=True) if as_json else
               f"quota of {namespace}: streams_max {updated.streams_max or 'unlimited'}, "
               f"write_bytes_per_s {updated.write_bytes_per_s or 'unlimited'}")


@quota.command("show")
@click.argument("namespace")
@zk_option
@json_option
@fails_cleanly
def quota_show(namespace: str, zk: str, zk_root: str, as_json: bool) -> None:
    """Print a namespace's quota."""
    from bookkeeper.meta import layout
    from bookkeeper.security.quota import UNLIMITED, Quota

    found = asyncio.run(with_zk(zk, lambda client: client.get_or_none(layout.quota_path(zk_root, namespace))))
    current = Quota.from_bytes(found[0]) if found is not None else UNLIMITED
    document = {"namespace": namespace, "streams_max": current.streams_max,
                "write_bytes_per_s": current.write_bytes_per_s}
    click.echo(json.dumps(document, sort_keys=True) if as_json else
               f"quota of {namespace}: streams_max {current.streams_max or 'unlimited'}, "
               f"write_bytes_per_s {current.write_bytes_per_s or 'unlimited'}")
