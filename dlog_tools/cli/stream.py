"""`dlog stream create|list|info|delete`: streams and their segments."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from bookkeeper.errors import ConfigError
from dlog.segments.metadata import SCHEMA_COMPATIBILITY_MODES as SCHEMA_MODES
from dlog_tools.cli.common import (
    TIER_FLAGS,
    cluster_options,
    compaction_options,
    fails_cleanly,
    json_option,
    print_table,
    run_namespace,
    tier_policy_options,
    tier_setting_text,
)
from dlog_tools.units import DURATION, SIZE, format_duration_ms, format_size, format_time_ms, plural

F = TypeVar("F", bound=Callable[..., Any])
ENSEMBLE_DEFAULT, WRITE_QUORUM_DEFAULT, ACK_QUORUM_DEFAULT = 3, 2, 2  # on a cluster of 3 bookies or more


def backlog_options(command: F) -> F:
    """The backlog limit options of `stream create` and `stream alter` (dlog.core.backlog)."""
    for option in reversed((
            click.option("--backlog-size", type=SIZE, default=None,
                         help="a subscription's backlog limit in unconsumed bytes (0: none)"),
            click.option("--backlog-age", type=DURATION, default=None,
                         help="a subscription's backlog limit by the age of its oldest unconsumed record (0: none)"),
            click.option("--backlog-policy", type=click.Choice(["hold", "evict", "none"]), default=None,
                         help="over a backlog limit: hold (refuse writers, keep the data), evict (retention goes "
                              "on, the subscription is marked evicted), none (default hold)"),
            click.option("--subscription-expiry", type=DURATION, default=None,
                         help="remove a subscription inactive (no commit) for this long (0: never)"))):
        command = option(command)
    return command


@click.group()
def stream() -> None:
    """Create, list, inspect and delete streams."""


@stream.command("create")
@click.argument("name")
@click.option("--ensemble", default=None, type=click.IntRange(1, 64),
              help=f"bookies per segment (default {ENSEMBLE_DEFAULT}, or every bookie of a smaller cluster)")
@click.option("--write-quorum", default=None, type=click.IntRange(1, 64),
              help=f"copies of each entry (default {WRITE_QUORUM_DEFAULT}, at most the ensemble)")
@click.option("--ack-quorum", default=None, type=click.IntRange(1, 64),
              help=f"copies fsynced before a write is acknowledged (default {ACK_QUORUM_DEFAULT}, at most the "
                   "write quorum)")
@click.option("--roll-size", type=SIZE, help="roll to a new segment after this many bytes (default 256MiB)")
@click.option("--roll-age", type=DURATION, help="roll after this long (default 2h)")
@click.option("--roll-records", default=0, type=click.IntRange(0), help="roll after this many records (0: never)")
@click.option("--retention-age", type=DURATION, default=None, help="remove segments older than this")
@click.option("--retention-size", type=SIZE, default=None, help="keep at most this many bytes")
@click.option("--if-not-exists", is_flag=True, help="succeed, changing nothing, if the stream exists")
@click.option("--schema", "schema_spec", default=None,
              help="a typed stream's schema: 'id:int32, name:string, score:float64?' or @FILE (JSON); docs/concepts.md")
@click.option("--schema-compatibility", type=click.Choice(SCHEMA_MODES, case_sensitive=False), default="BACKWARD",
              help="what the schema's later versions must keep (default BACKWARD; checked against every version)")
@backlog_options
@tier_policy_options
@cluster_options
@json_option
@fails_cleanly
@compaction_options
def stream_create(name: str, ensemble: int | None, write_quorum: int | None, ack_quorum: int | None,
                  roll_size: int | None,
                  roll_age: int | None, roll_records: int, retention_age: int | None,
                  retention_size: int | None, if_not_exists: bool, schema_spec: str | None, schema_compatibility: str,
                  tier: Any, cluster: tuple[str, str, str], as_json: bool, compaction: dict[str, Any],
                  backlog_size: int | None = None, backlog_age: int | None = None,
                  backlog_policy: str | None = None, subscription_expiry: int | None = None) -> None:
    """Create a stream (default schema: key, value, timestamp).

    Replication not given is fitted to the cluster: on fewer bookies than the default ensemble of
    3, the ensemble is every registered bookie and the quorums at most that (one line on stderr
    says which); replication given that needs more bookies than are registered is created as
    asked, with a warning. `dlog stream alter` changes it for new segments.

    The tier options give the stream its own tier policy (what is not given, the namespace's
    default gives: `dlog tier set --namespace-default`; docs/operations.md, "Tiered storage")."""
    from bookkeeper.protocol.metadata import check_quorum
    from dlog.names import check_stream_name
    from dlog.segments.schemas import first_schema

    check_stream_name(name)
    schema = first_schema(read_spec(schema_spec)) if schema_spec is not None else None
    asked = (ensemble, write_quorum, ack_quorum)
    check_quorum(*fitted_quorums(asked, max(asked[0] or 0, ENSEMBLE_DEFAULT)))

    async def action(ns: Any) -> Any:
        bookies = len(await ns.client.store.bookies())
        quorums = fitted_quorums(asked, bookies if bookies else ENSEMBLE_DEFAULT)
        created = await ns.create_stream(
            name, ensemble=quorums[0], write_quorum=quorums[1], ack_quorum=quorums[2],
            roll_bytes=roll_size, roll_age_ms=roll_age, roll_records=roll_records,
            retention_age_ms=retention_age or 0, retention_bytes=retention_size or 0, exist_ok=if_not_exists,
            tier=tier, schema=schema, schema_compatibility=schema_compatibility, backlog_bytes=backlog_size or 0,
            backlog_age_ms=backlog_age or 0, backlog_policy=backlog_policy or "hold",
            subscription_expiry_ms=subscription_expiry or 0, **compaction)
        note = replication_note(name, asked, quorums, bookies, cluster[1])
        if note and created.ensemble == quorums[0]:
            click.echo(f"dlog: {note}", err=True)
        return created

    config = run_namespace(cluster, action, create=True)
    click.echo(json.dumps(config.public_json(), sort_keys=True) if as_json else f"created stream {name}")


def fitted_quorums(asked: tuple[int | None, int | None, int | None], bookies: int) -> tuple[int, int, int]:
    """(ensemble, write quorum, ack quorum): what was asked, the rest defaults that fit `bookies`
    (ensemble at most the bookies, write quorum at most the ensemble, ack at most the write quorum)."""
    ensemble = asked[0] if asked[0] is not None else max(1, min(ENSEMBLE_DEFAULT, bookies), asked[1] or 0,
                                                         asked[2] or 0)
    write_quorum = asked[1] if asked[1] is not None else max(min(WRITE_QUORUM_DEFAULT, ensemble),
                                                             min(asked[2] or 0, ensemble))
    ack_quorum = asked[2] if asked[2] is not None else min(ACK_QUORUM_DEFAULT, write_quorum)
    return ensemble, write_quorum, ack_quorum


def replication_note(name: str, asked: tuple[int | None, ...], quorums: tuple[int, int, int], bookies: int,
                     zk_root: str) -> str | None:
    """The one line `stream create` says when the cluster is smaller than the stream's ensemble."""
    replication = f"ensemble {quorums[0]}, write quorum {quorums[1]}, ack quorum {quorums[2]}"
    if bookies == 0:
        return (f"no bookies are registered under --zk-root {zk_root}: the stream has {replication}, and "
                "writes fail until that many bookies run there (is --zk-root the bookies' root?)")
    if quorums[0] > bookies:
        fits = fitted_quorums((None, None, None), bookies)
        return (f"only {plural(bookies, 'bookie')} registered: the stream has {replication}, and writes fail "
                f"until {quorums[0]} run (`dlog stream alter {name} --ensemble {fits[0]} --write-quorum {fits[1]} "
                f"--ack-quorum {fits[2]}` fits it to this cluster)")
    if quorums != (ENSEMBLE_DEFAULT, WRITE_QUORUM_DEFAULT, ACK_QUORUM_DEFAULT) and None in asked:
        return (f"{plural(bookies, 'bookie')} registered, fewer than the default ensemble of {ENSEMBLE_DEFAULT}: "
                f"the stream has {replication} (`dlog stream alter` changes it for new segments)")
    return None


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
    """Settings, records, sizes, offsets, subscriptions (with lag) and segments of a stream.

    A segment whose ledger is missing is shown as DAMAGED: its records are lost."""
    info = run_namespace(cluster, lambda ns: ns.stream_info(name))
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    _print_settings(info["name"], info["config"])
    _print_contents(info)
    if info["subscriptions"]:
        click.echo("subscriptions")
        print_table(["name", "offset", "lag_records", "lag_bytes", "note"],
                    [{**sub, "lag_records": f"{sub['lag_records']:,}", "lag_bytes": format_size(sub["lag_bytes"])}
                     for sub in info["subscriptions"]])
    click.echo("segments")
    print_table(["sequence", "ledger", "state", "entries", "records", "bytes", "first_time", "last_time"],
                [_segment_row(segment) for segment in info["segments"]])


def _print_settings(name: str, config: dict[str, Any]) -> None:
    click.echo(f"stream {name}")
    click.echo(f"  replication   ensemble {config['ensemble']}, write quorum {config['write_quorum']}, "
               f"ack quorum {config['ack_quorum']}")
    limits = [format_size(config["roll_bytes"]), format_duration_ms(config["roll_age_ms"])]
    if config["roll_records"]:
        limits.append(plural(config["roll_records"], "record"))
    click.echo(f"  roll          after {', '.join(limits[:-1])} or {limits[-1]}, whichever comes first")
    age, size = config["retention_age_ms"], config["retention_bytes"]
    click.echo(f"  retention     age {format_duration_ms(age) if age else 'off'}, "
               f"size {format_size(size) if size else 'off'}, "
               f"{'keeps' if config['retention_keeps_unconsumed'] else 'ignores'} what subscribers have not read")
    if config.get("backlog_bytes") or config.get("backlog_age_ms"):
        size, age = config["backlog_bytes"], config["backlog_age_ms"]
        click.echo(f"  backlog       per subscription: size {format_size(size) if size else 'off'}, "
                   f"age {format_duration_ms(age) if age else 'off'}, policy {config['backlog_policy']}")
    if config.get("subscription_expiry_ms"):
        click.echo(f"  expiry        subscriptions inactive for {format_duration_ms(config['subscription_expiry_ms'])}")
    click.echo(f"  created       {format_time_ms(config['created_ms'])}")
    if config.get("schema"):
        from dlog.segments.metadata import StreamConfig
        from dlog.segments.schemas import spec_text, versions_of

        versions = versions_of(StreamConfig(name, schema=config["schema"],
                                            schema_history=tuple(config.get("schema_history", ()))))
        click.echo(f"  schema        version {len(versions)} ({config.get('schema_compatibility', 'BACKWARD')}): "
                   f"{spec_text(versions[-1])}")
    if config.get("compaction"):
        click.echo(f"  compaction    on, min lag {format_duration_ms(config['min_compaction_lag_ms'])}, "
                   f"deletion markers kept {format_duration_ms(config['delete_retention_ms'])}")


def _print_contents(info: dict[str, Any]) -> None:
    segments = info["segments"]
    alive = [s for s in segments if s["state"] != "truncated"]
    truncated = len(segments) - len(alive)
    estimated = any(s["bytes_estimated"] for s in alive)
    click.echo(f"  records       {plural(info['records'], 'record')} in {plural(len(alive), 'live segment')}"
               + (f" ({truncated} truncated)" if truncated else ""))
    click.echo(f"  size          {format_size(info['bytes'])}"
               + (" (the in-progress segment's is estimated)" if estimated else ""))
    click.echo(f"  offsets       first {info['first_offset'] or '-'}, last {info['last_offset'] or '-'}")
    if info["next_position"] is not None:
        click.echo(f"  positions     first {info['first_position']}, next {info['next_position']}")
    for segment in segments:
        if segment["damaged"]:
            click.echo(f"  DAMAGED       segment {segment['sequence']}: {segment['damaged']}")


def _segment_row(segment: dict[str, Any]) -> dict[str, Any]:
    last, first = segment["last_entry"], segment["first_entry"]
    entries = "-" if last is None or segment["state"] == "truncated" else f"{first}..{last}"
    size = "-" if segment["bytes"] is None else format_size(segment["bytes"])
    return {"sequence": segment["sequence"], "ledger": segment["ledger"],
            "state": "DAMAGED" if segment["damaged"] else segment["state"].replace("_", " "),
            "entries": entries, "records": "-" if segment["records"] is None else f"{segment['records']:,}",
            "bytes": ("~" + size) if segment["bytes_estimated"] else size,
            "first_time": format_time_ms(segment["first_timestamp_ms"], "seconds"),
            "last_time": format_time_ms(segment["last_timestamp_ms"], "seconds")}


@stream.command("alter")
@click.argument("name")
@click.option("--roll-size", type=SIZE, help="roll to a new segment after this many bytes")
@click.option("--roll-age", type=DURATION, help="roll after this long")
@click.option("--roll-records", type=click.IntRange(0), help="roll after this many records (0: no limit)")
@click.option("--retention-age", type=DURATION, help="remove completed segments older than this (0: off)")
@click.option("--retention-size", type=SIZE, help="keep at most this many bytes (0: off)")
@click.option("--keep-unconsumed/--ignore-subscribers", default=None,
              help="whether retention keeps what a subscriber has not read yet")
@click.option("--ensemble", type=click.IntRange(1, 64), help="bookies per new segment")
@click.option("--write-quorum", type=click.IntRange(1, 64), help="copies of each entry of new segments")
@click.option("--ack-quorum", type=click.IntRange(1, 64), help="copies fsynced before a write is acknowledged")
@click.option("--schema", "schema_spec", default=None,
              help="the typed stream's next schema version: a spec or @FILE (JSON); refused, naming the field and "
                   "the rule, unless the compatibility mode allows it")
@click.option("--schema-compatibility", type=click.Choice(SCHEMA_MODES, case_sensitive=False), default=None,
              help="what later schema versions must keep (with --schema: applies to that change too)")
@backlog_options
@tier_policy_options
@cluster_options
@json_option
@fails_cleanly
@compaction_options
def stream_alter(name: str, roll_size: int | None, roll_age: int | None, roll_records: int | None,
                 retention_age: int | None, retention_size: int | None, keep_unconsumed: bool | None,
                 ensemble: int | None, write_quorum: int | None, ack_quorum: int | None, schema_spec: str | None,
                 schema_compatibility: str | None, tier: Any, cluster: tuple[str, str, str], as_json: bool,
                 compaction: dict[str, Any], backlog_size: int | None = None, backlog_age: int | None = None,
                 backlog_policy: str | None = None, subscription_expiry: int | None = None) -> None:
    """Change a stream's roll, retention, replication, tier, schema, backlog and compaction settings.

    A writer takes new roll and replication settings when it next opens the stream (`dlog write`
    does at each run): replication applies to the segments it creates, existing ones keep theirs.
    The quorums must satisfy ensemble >= write quorum >= ack quorum, checked with the stream's
    current values for those not given. Retention applies its settings at its next run; the tier
    options given replace the stream's own (the others it keeps or inherits).

    `--schema` adds a typed stream's next schema version (a field keeps its id by name, or takes the
    one written `name#ID`: a rename); writers write it from when they next open the stream, readers
    read every record with one schema (docs/concepts.md, "Schemas")."""
    from dlog.segments.schemas import schema_version, spec_text, versions_of

    changes = {key: value for key, value in (
        ("roll_bytes", roll_size), ("roll_age_ms", roll_age), ("roll_records", roll_records),
        ("retention_age_ms", retention_age), ("retention_bytes", retention_size),
        ("retention_keeps_unconsumed", keep_unconsumed), ("ensemble", ensemble), ("write_quorum", write_quorum),
        ("ack_quorum", ack_quorum), ("schema", read_spec(schema_spec) if schema_spec is not None else None),
        ("schema_compatibility", schema_compatibility), ("backlog_bytes", backlog_size),
        ("backlog_age_ms", backlog_age), ("backlog_policy", backlog_policy),
        ("subscription_expiry_ms", subscription_expiry)) if value is not None}
    changes.update(compaction)
    if not changes and tier is None:
        raise ConfigError("nothing to change: give --roll-size, --roll-age, --roll-records, --retention-age, "
                          "--retention-size, --keep-unconsumed/--ignore-subscribers, --ensemble, --write-quorum, "
                          f"--ack-quorum, {TIER_FLAGS}, --schema, --schema-compatibility, --backlog-size, "
                          "--backlog-age, --backlog-policy, --subscription-expiry, --compaction, "
                          "--min-compaction-lag, --delete-retention")

    async def action(ns: Any) -> tuple[Any, Any]:
        before = await ns.config(name)
        if tier is not None:
            changes["tier"] = tier.over(before.tier)
        return before, await ns.alter_stream(name, **changes)

    before, after = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps(after.public_json(), sort_keys=True))
        return
    for key in changes:
        if key == "tier":
            continue
        if key == "schema":
            click.echo(f"{name}: schema version {schema_version(before)} -> {schema_version(after)}: "
                       f"{spec_text(versions_of(after)[-1])}")
            continue
        click.echo(f"{name}: {key.removesuffix('_ms')} {_setting_text(key, getattr(before, key))} -> "
                   f"{_setting_text(key, getattr(after, key))}")
    if tier is not None:
        for field in tier.set_fields():
            was, now = getattr(before.tier, field), getattr(after.tier, field)
            click.echo(f"{name}: tier {field.removesuffix('_ms')} {tier_setting_text(field, was)} -> "
                       f"{tier_setting_text(field, now)}")


def _setting_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if key.startswith(("retention", "backlog", "subscription")) and value == 0:
        return "off"
    if key.endswith("_ms"):
        return format_duration_ms(value)
    if key.endswith("_bytes"):
        return format_size(value)
    return f"{value:,}" if value else "no limit"


@stream.command("delete")
@click.argument("name")
@cluster_options
@json_option
@fails_cleanly
def stream_delete(name: str, cluster: tuple[str, str, str], as_json: bool) -> None:
    """Delete a stream and its ledgers (bookies reclaim the space by garbage collection)."""
    ledgers = run_namespace(cluster, lambda ns: ns.delete_stream(name))
    click.echo(json.dumps({"deleted": name, "ledgers": ledgers}) if as_json
               else f"deleted stream {name} ({plural(len(ledgers), 'ledger')})")



def read_spec(value: str) -> str:
    """A schema spec as given, or the contents of the file `@path` names (one clear line if unreadable)."""
    if not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise ConfigError(f"cannot read schema file {value[1:]!r}: {exc.strerror or exc}") from None
