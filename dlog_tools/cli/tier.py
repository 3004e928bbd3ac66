"""`dlog tier set|status|daemon` and `dlog offload`: tiered storage (docs/operations.md, "Tiered
storage"): where a stream's completed segments go as Parquet files, when, and what is where."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from typing import Any

import click

from bookkeeper.errors import ConfigError
from dlog_tools.cli.common import (
    TIER_FLAGS,
    cluster_options,
    fails_cleanly,
    json_option,
    print_table,
    refuse_empty_root,
    run_namespace,
    tier_policy_options,
    tier_setting_text,
)
from dlog_tools.units import DURATION, format_duration_ms, format_size, format_time_ms, plural

DAEMON_INTERVAL_DEFAULT = "1min"
WHERE = (("bookies", "on bookies only"), ("both", "on both"), ("tier", "on the tier only"))


@click.group()
def tier() -> None:
    """Tiered storage: set a stream's (or the namespace's) tier policy, see what is where, and run
    the offloader as a daemon (`dlog offload NAME` offloads now)."""


@tier.command("set")
@click.argument("name", required=False)
@click.option("--namespace-default", is_flag=True,
              help="set the namespace's default policy (streams inherit what they do not set)")
@tier_policy_options
@cluster_options
@json_option
@fails_cleanly
def tier_set(name: str | None, namespace_default: bool, tier: Any, cluster: tuple[str, str, str],
             as_json: bool) -> None:
    """Set a stream's own tier policy, or (--namespace-default) the namespace's default.

    The options given replace those settings; the others are kept, or inherited (a stream's from
    the namespace's default, the default's from the built-in defaults: no tier, offload only by
    `dlog offload`, nothing kept back, bookie copies deleted 4h after the offload, no tier
    retention)."""
    from dlog.segments.metadata import TierPolicy

    if (name is None) == (not namespace_default):
        raise ConfigError("give a stream NAME or --namespace-default (one of them)")
    if tier is None:
        raise ConfigError(f"nothing to set: give {TIER_FLAGS}")

    async def action(ns: Any) -> tuple[Any, Any]:
        if name is None:
            before = await ns.namespace_tier() or TierPolicy()
            return before, await ns.set_namespace_tier(tier.over(before))
        before = (await ns.config(name)).tier
        return before, (await ns.set_tier(name, tier)).tier

    before, after = run_namespace(cluster, action)
    scope = name if name is not None else f"namespace {cluster[2]} default"
    if as_json:
        click.echo(json.dumps({"stream": name, "namespace": cluster[2], "tier": after.set_fields()}, sort_keys=True))
        return
    for field in tier.set_fields():
        click.echo(f"{scope}: tier {field.removesuffix('_ms')} {tier_setting_text(field, getattr(before, field))} "
                   f"-> {tier_setting_text(field, getattr(after, field))}")


# ------------------------------------------------------------------------------ status


async def stream_tier_status(ns: Any, name: str, namespace_default: Any, now_ms: int) -> dict[str, Any]:
    """What `dlog tier status` says of one stream (its JSON)."""
    from dlog.core import backlog, tiering

    config = await ns.config(name)
    policy = tiering.effective_policy(config, namespace_default)
    listing = await ns.store.segments(name)
    subscriptions = backlog.retention_holders(
        config, await ns.store.subscriptions(name) if backlog.keeps_unconsumed(config) else {})
    return {
        "stream": name, "policy": policy.set_fields(),
        "sources": tiering.policy_sources(config.tier, namespace_default),
        "placement": tiering.placement(listing),
        "attempts_pending": len(tiering.pending_attempts(listing)),
        "due_for_offload": len(tiering.offload_plan(listing, policy, now_ms)),
        "bookie_copies_due": len(tiering.bookie_copy_plan(listing, config, policy, now_ms, subscriptions)),
        "last_run": await ns.store.tier_status(name),
    }


@tier.command("status")
@click.argument("name", required=False)
@cluster_options
@json_option
@fails_cleanly
def tier_status(name: str | None, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Per stream (NAME, or every stream of the namespace): the effective tier policy and where each
    setting comes from (stream, namespace or default), the segments, records and bytes on the
    bookies only, on both, and on the tier only, what is due, and the offloader's last run."""

    async def action(ns: Any) -> dict[str, Any]:
        default = await ns.namespace_tier()
        now_ms = ns.clock.wall_ms()
        names = [name] if name is not None else await ns.list_streams()
        return {"namespace": ns.name, "namespace_default": default.set_fields() if default else {},
                "streams": [await stream_tier_status(ns, stream, default, now_ms) for stream in names]}

    result = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    elif name is not None:
        _print_stream(result["streams"][0])
    else:
        default = result["namespace_default"]
        click.echo(f"namespace {result['namespace']} default: "
                   + (", ".join(f"{field.removesuffix('_ms')} {tier_setting_text(field, value)}"
                                for field, value in default.items()) or "none (built-in defaults)"))
        print_table(["stream", "tier", "bookies_only", "both", "tier_only", "due", "last_run"],
                    [_status_row(item) for item in result["streams"]])


def _placed(counts: dict[str, int]) -> str:
    return f"{plural(counts['segments'], 'segment')}, {plural(counts['records'], 'record')}"


def _last_run(status: dict[str, Any] | None) -> str:
    if not status:
        return "never"
    when = format_time_ms(status.get("at_ms"), "seconds")
    if status.get("error"):
        return f"FAILED at {when} ({plural(status.get('failures', 1), 'failure')} in a row): {status['error']}"
    return f"ok at {when} ({plural(status.get('offloaded', 0), 'segment')} offloaded)"


def _status_row(item: dict[str, Any]) -> dict[str, Any]:
    placement = item["placement"]
    return {"stream": item["stream"], "tier": item["policy"].get("uri") or "-",
            "bookies_only": _placed(placement["bookies"]), "both": _placed(placement["both"]),
            "tier_only": _placed(placement["tier"]),
            "due": f"{item['due_for_offload']} offload, {item['bookie_copies_due']} delete",
            "last_run": _last_run(item["last_run"])}


def _print_stream(item: dict[str, Any]) -> None:
    policy, sources = item["policy"], item["sources"]

    def setting(field: str) -> str:
        return f"{tier_setting_text(field, policy.get(field))} ({sources[field]})"

    click.echo(f"stream {item['stream']}")
    click.echo(f"  tier              {setting('uri')}")
    click.echo(f"  offload after     {setting('offload_after_ms')}, keeping {setting('keep_bytes')} on bookies only")
    click.echo(f"  delete lag        {setting('delete_lag_ms')}")
    click.echo(f"  tier retention    age {setting('retention_age_ms')}, size {setting('retention_bytes')}")
    for where, label in WHERE:
        counts = item["placement"][where]
        sizes = [f"{format_size(counts['bytes'])} on bookies" if where != "tier" else "",
                 f"{format_size(counts['tier_bytes'])} on the tier" if where != "bookies" else ""]
        click.echo(f"  {label:<17} {_placed(counts)}" + "".join(f", {size}" for size in sizes if size))
    pending = item["attempts_pending"]
    click.echo(f"  due               {plural(item['due_for_offload'], 'segment')} to offload, "
               f"{plural(item['bookie_copies_due'], 'bookie copy', 'bookie copies')} to delete"
               + (f"; {plural(pending, 'offload attempt')} pending" if pending else ""))
    click.echo(f"  last run          {_last_run(item['last_run'])}")


# ------------------------------------------------------------------------------ offload now


@click.command("offload")
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="list what would be offloaded, change nothing")
@cluster_options
@json_option
@fails_cleanly
def offload_command(name: str, dry_run: bool, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Offload a stream's completed segments to its tier now (all but those its --offload-keep-size
    keeps on the bookies), then delete the bookie copies that are due. Another offloader at work
    on the stream (a daemon, a policy runner) is left to it."""
    from dlog import Offloader

    async def action(ns: Any) -> Any:
        if not (await ns.tier_policy(name)).enabled:
            raise ConfigError(f"stream {name!r} has no tier: give it one (dlog tier set {name} --tier URI, "
                              "or a namespace default: dlog tier set --namespace-default --tier URI)")
        return await Offloader(ns).run(name, now=True, dry_run=dry_run)

    report = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **report.to_json()}, sort_keys=True))
        return
    planned = report.planned
    if dry_run:
        records, size = sum(s.records for s in planned), sum(s.bytes for s in planned)
        click.echo(f"would offload {plural(len(planned), 'segment')} of {name} "
                   f"({plural(records, 'record')}, {format_size(size)}) to {report.tier_uri}")
        if planned:
            print_table(["sequence", "ledger", "records", "bytes"],
                        [{"sequence": s.sequence, "ledger": s.ledger_id, "records": f"{s.records:,}",
                          "bytes": format_size(s.bytes)} for s in planned])
        return
    done = report.offloaded
    click.echo(f"offloaded {plural(len(done), 'segment')} of {name} to {report.tier_uri} "
               f"({plural(sum(o.records for o in done), 'record')}, {format_size(sum(o.segment_bytes for o in done))} "
               f"on each bookie -> {format_size(sum(o.size_bytes for o in done))} of Parquet); deleted "
               f"{plural(len(report.bookie_copies_deleted), 'bookie copy', 'bookie copies')}")
    for reason in report.skipped:
        click.echo(f"  skipped: {reason}")


# ------------------------------------------------------------------------------ the Iceberg view


@tier.command("iceberg")
@click.argument("name")
@click.option("--catalog", default=None, metavar="URL",
              help="the SQL catalog (a SQLAlchemy URL); default for a local tier: sqlite in <tier>/_iceberg")
@click.option("--warehouse", default=None, metavar="URI",
              help="where the table's metadata goes; default <tier>/_iceberg/warehouse")
@cluster_options
@json_option
@fails_cleanly
def tier_iceberg(name: str, catalog: str | None, warehouse: str | None, cluster: tuple[str, str, str],
                 as_json: bool) -> None:
    """Register the stream's tier files in an Iceberg table `<namespace>.<stream>` (no file is
    rewritten: pyiceberg add_files), kept in step by offloads and retention from then on. Needs
    the extra: pip install 'dlog[iceberg]'."""

    async def action(ns: Any) -> tuple[Any, Any]:
        result = await ns.register_iceberg(name, catalog, warehouse)
        return result, await ns.config(name)

    result, config = run_namespace(cluster, action)
    document = {"stream": name, "catalog": config.iceberg_catalog, "warehouse": config.iceberg_warehouse,
                "added": result.added, "removed": result.removed, "unchanged": result.unchanged,
                "snapshot_id": result.snapshot_id}
    if as_json:
        click.echo(json.dumps(document, sort_keys=True))
        return
    click.echo(f"stream {name}: Iceberg table registered in {config.iceberg_catalog} "
               f"({plural(result.added, 'file')} added, {result.removed} removed, {result.unchanged} unchanged); "
               "offloads and retention keep it in step")


# ------------------------------------------------------------------------------ the daemon


@tier.command("daemon")
@click.option("--interval", "interval_ms", type=DURATION, default=DAEMON_INTERVAL_DEFAULT, show_default=True,
              help="look at each stream at least this often (a stream with a short offload age or delete lag "
                   "more often: every quarter of it, at most every second)")
@click.option("--all-namespaces", is_flag=True, help="every namespace of the cluster (else --namespace's)")
@cluster_options
@fails_cleanly
def tier_daemon(interval_ms: int, all_namespaces: bool, cluster: tuple[str, str, str]) -> None:
    """Run the offloader until SIGINT or SIGTERM: offload the due segments of every stream with a
    tier and delete their due bookie copies, each stream on its policy's schedule. A tier error is
    logged once and retried with back-off (doubling, up to 5 minutes); it never stops the daemon.
    One offloader works on a stream at a time (a ZooKeeper lock): daemons, `dlog offload` and the
    policy runners of `dlog standalone` and `dlog serve` may all run."""
    from bookkeeper.meta.zk import refuse_unreachable
    from bookkeeper.security.settings import load_client_settings
    from dlog.core.policies import PolicyLimits
    from dlog_tools.config import tier_options
    from dlog_tools.policies import PolicyThread

    if interval_ms <= 0:
        raise ConfigError("--interval must be more than 0")
    zk, zk_root, namespace = cluster
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("dlog.policies").setLevel(logging.INFO)  # each offload is one line
    daemon = PolicyThread(zk, bookkeeper_root=zk_root, security=load_client_settings(),
                          limits=PolicyLimits.at_most_every(interval_ms), retention=False, offload=True,
                          namespaces=None if all_namespaces else [namespace], tier_options=tier_options())

    async def go() -> None:
        await refuse_unreachable(zk)
        await refuse_empty_root(zk, zk_root)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        scope = "every namespace" if all_namespaces else f"namespace {namespace}"
        click.echo(f"dlog tier daemon offloading {scope} (each stream at least every "
                   f"{format_duration_ms(interval_ms)}); Ctrl-C stops it")
        sys.stdout.flush()
        await daemon.run(stop)

    asyncio.run(go())
    totals = [runner.stats.tier.total for runner in daemon.runners.values()]
    click.echo(f"dlog tier daemon stopped: offloaded {plural(sum(t.offloaded_segments for t in totals), 'segment')} "
               f"({format_size(sum(t.offloaded_bytes for t in totals))}), deleted "
               f"{plural(sum(t.bookie_copies_deleted for t in totals), 'bookie copy', 'bookie copies')}, "
               f"{plural(sum(t.offload_failures for t in totals), 'failed run')}")
