"""What every `dlog` command shares: cluster options, `--json`, one-line errors, tables, and running
a coroutine against a cluster (the size and duration types are dlog_tools.units'). Command modules import from here and
never from each other or from `dlog_tools.cli.app`."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from bookkeeper.errors import ConfigError, DlogError
from bookkeeper.meta.layout import DEFAULT_ROOT
from dlog_tools.interrupts import Interrupts

DEFAULT_ZK = "127.0.0.1:2181"
PIPED_TABLE_WIDTH = 240
NATURAL_WIDTH_MAX = 10_000  # to measure how wide a table would be unconstrained


def default_zk() -> str:
    """$DLOG_ZK, else the [cluster] zk of client.toml ($DLOG_CONFIG / --config), else loopback."""
    from bookkeeper.security.settings import load_cluster_table

    return os.environ.get("DLOG_ZK") or str(load_cluster_table().get("zk") or DEFAULT_ZK)


def _set_environment(variable: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """An eager option's callback: the value goes to the environment, where the libraries (and
    the defaults of the options after it) read client settings from (bookkeeper.security)."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value:
            os.environ[variable] = str(value)

    return callback


def security_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--config (client.toml: cluster address, TLS, token, ZooKeeper credentials) and --token."""
    function = click.option("--token", default=None, expose_value=False, is_eager=True,
                            callback=_set_environment("DLOG_TOKEN"), show_default="$DLOG_TOKEN",
                            help="token for bookies and admin endpoints (replaces client.toml's)")(function)
    return click.option("--config", "client_config", default=None, expose_value=False, is_eager=True,
                        type=click.Path(dir_okay=False, exists=True),
                        callback=_set_environment("DLOG_CONFIG"), show_default="$DLOG_CONFIG",
                        help="client settings file (client.toml): zk, TLS, token, ZooKeeper "
                             "credentials")(function)


def zk_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return security_options(click.option("--zk", default=default_zk,
                                         show_default="$DLOG_ZK, client.toml, or 127.0.0.1:2181",
                                         help="ZooKeeper address, host:port[,host:port...]")(
        click.option("--zk-root", default=DEFAULT_ROOT, show_default=True,
                     help="ZooKeeper node under which the cluster lives")(function)))


def json_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")(function)


# What the library says in Python terms, as the CLI spells it (longest first, so the whole phrase
# is replaced before its parts).
CLI_WORDING = (
    ("open with takeover=True to fence it and take over", "pass --takeover to fence it and take over"),
    ("reopen with skip_truncated=True to skip them", "pass --skip-truncated to skip them"),
    ("reopen with skip_truncated=True", "pass --skip-truncated"),
    ("open with skip_truncated=True", "pass --skip-truncated"),
    ("takeover=True", "--takeover"),
    ("skip_truncated=True", "--skip-truncated"),
    ("exist_ok=True", "--if-not-exists"),
)


def cli_wording(message: str) -> str:
    """A library message with its Python argument names replaced by the CLI's flags."""
    for python, flag in CLI_WORDING:
        message = message.replace(python, flag)
    return message


def fails_cleanly(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a DlogError into one line on stderr (Python argument names translated to flags) and exit
    status 1."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DlogError as exc:
            zk = kwargs["cluster"][0] if "cluster" in kwargs else kwargs.get("zk")
            click.echo(f"dlog: {cli_wording(str(exc))}{secure_hint(exc, zk)}", err=True)
            sys.exit(1)

    return wrapper


def secure_hint(error: DlogError, zk: str | None) -> str:
    """For a refusal of a secure cluster to a command run without client settings: which file to
    export (the admin's client.toml `dlog standalone --secure` wrote for that cluster, if known)."""
    from bookkeeper.errors import AuthenticationError, MetadataPermissionError, UnauthorizedError
    from dlog_tools.secure import remembered_client_config

    if os.environ.get("DLOG_CONFIG") or not isinstance(
            error, (AuthenticationError, MetadataPermissionError, UnauthorizedError)):
        return ""
    found = remembered_client_config(zk) if zk else None
    if found is not None:
        return f"; this cluster is secure: export DLOG_CONFIG={found} (its admin's client.toml)"
    return ("; the cluster is secure: export DLOG_CONFIG=FILE, the client.toml that `dlog standalone --secure` "
            "printed or `dlog token create --client-config` made")


async def with_zk(zk: str, action: Callable[[Any], Any]) -> Any:
    """Run `action(client)` with a started AsyncZooKeeper client, closed afterwards."""
    from bookkeeper.meta.acl import zk_options
    from bookkeeper.meta.zk import AsyncZooKeeper, refuse_unreachable
    from bookkeeper.security.settings import load_client_settings
    from dlog_tools.config import zk_timeout_s

    client = AsyncZooKeeper(zk, timeout_s=zk_timeout_s(), **zk_options(load_client_settings()))
    await refuse_unreachable(zk)
    await client.start()
    try:
        return await action(client)
    finally:
        await client.close()


async def refuse_empty_root(zk: str, zk_root: str) -> None:
    """A --zk-root with nothing under it is a typo, not a cluster: say so before anything is
    created there (a Namespace would create its layout; reads would call every segment damaged)."""

    async def exists(client: Any) -> bool:
        return bool(await client.exists(zk_root))

    if not await with_zk(zk, exists):
        raise ConfigError(f"no bookies are registered under --zk-root {zk_root}: nothing is there (give the "
                          f"--zk-root the bookies were started with; the default is {DEFAULT_ROOT})")


async def http_get_json(url: str) -> Any:
    """GET a bookie admin URL with the client's CA and token (client.toml), if any."""
    import aiohttp

    from bookkeeper.security.settings import load_client_settings

    settings = load_client_settings()
    headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
    ssl_context = settings.tls.context() if settings.tls is not None else None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session, \
                session.get(url, headers=headers, ssl=ssl_context or True) as response:
            return await response.json()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise DlogError(f"cannot reach {url}: {exc!r}") from exc


def print_table(columns: list[str], rows: list[dict[str, Any]]) -> None:
    """A table: piped, as wide as it needs (rich would cut it at 80 columns); on a terminal too
    narrow for it, one block of `column  value` lines per row instead of a squeezed table."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else PIPED_TABLE_WIDTH)
    table = Table(*columns)
    cells = [["" if row.get(column) is None else str(row.get(column)) for column in columns] for row in rows]
    for row_cells in cells:
        table.add_row(*row_cells)
    natural_width = console.measure(table, options=console.options.update_width(NATURAL_WIDTH_MAX)).maximum
    if console.is_terminal and natural_width > console.width:
        width = max(len(column) for column in columns)
        for index, row_cells in enumerate(cells):
            if index:
                click.echo("")
            for column, cell in zip(columns, row_cells, strict=True):
                click.echo(f"{column:<{width}}  {cell}")
        return
    console.print(table)


def run_with_client(zk: str, zk_root: str, action: Callable[[Any], Any]) -> Any:
    """Run `action(bookkeeper_client)` on a started BookKeeper client."""
    from bookkeeper.client import BookKeeper
    from bookkeeper.meta.zk import refuse_unreachable
    from dlog_tools.config import client_options, zk_timeout_s

    async def go() -> Any:
        await refuse_unreachable(zk)
        await refuse_empty_root(zk, zk_root)
        async with BookKeeper(zk=zk, root=zk_root, zk_timeout_s=zk_timeout_s(),
                              **client_options()) as client:
            return await action(client)

    return asyncio.run(go())


def cluster_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--zk, --zk-root (the BookKeeper cluster's root) and --namespace, collected into `cluster`."""

    @functools.wraps(function)
    def wrapper(*args: Any, zk: str, zk_root: str, namespace: str, **kwargs: Any) -> Any:
        return function(*args, cluster=(zk, zk_root, namespace), **kwargs)

    wrapper = click.option("--zk", default=default_zk, show_default="$DLOG_ZK, client.toml, or "
                           "127.0.0.1:2181", help="ZooKeeper address")(wrapper)
    wrapper = click.option("--zk-root", default=DEFAULT_ROOT, show_default=True,
                           help="ZooKeeper node of the BookKeeper cluster")(wrapper)
    return security_options(click.option("--namespace", default="default", show_default=True,
                                         help="namespace (a ZooKeeper subtree /dlog/<namespace>)")(wrapper))


def run_namespace(cluster: tuple[str, str, str], action: Callable[[Any], Any],
                  interrupts: Interrupts | None = None, create: bool = False) -> Any:
    """Run `action(namespace)` on a started dlog Namespace of `cluster` (zk, zk root, namespace).
    Nothing is created in ZooKeeper unless `create` (`stream create`): a typo in --namespace or
    --zk-root leaves no trace. With `interrupts`, Ctrl-C is counted (dlog_tools/interrupts.py) and an
    interrupted run raises KeyboardInterrupt once its clean-up ended."""
    from bookkeeper.meta.zk import refuse_unreachable
    from dlog import Namespace
    from dlog_tools.config import client_options, tier_options, zk_timeout_s

    zk, zk_root, namespace = cluster
    reach_tier = tier_options()  # a bad [tier] table is one line before anything starts

    async def go() -> Any:
        if interrupts is not None:
            interrupts.install()
        try:
            await refuse_unreachable(zk)
            await refuse_empty_root(zk, zk_root)
            async with Namespace(zk, namespace, bookkeeper_root=zk_root, zk_timeout_s=zk_timeout_s(), create=create,
                                 tier_options=reach_tier, **client_options()) as ns:
                return await action(ns)
        finally:
            if interrupts is not None:
                interrupts.uninstall()

    try:
        return asyncio.run(go())
    except asyncio.CancelledError:
        if interrupts is not None and interrupts.count:
            raise KeyboardInterrupt from None
        raise


# ------------------------------------------------------------------------------ tier policy options

TIER_OPTION_FIELDS = (("tier", "uri"), ("offload_after", "offload_after_ms"), ("offload_keep_size", "keep_bytes"),
                      ("offload_delete_lag", "delete_lag_ms"), ("tier_retention_age", "retention_age_ms"),
                      ("tier_retention_size", "retention_bytes"))
TIER_FLAGS = ("--tier, --offload-after, --offload-keep-size, --offload-delete-lag, --tier-retention-age or "
              "--tier-retention-size")


def _checked_uri(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A tier URI checked as the command line reads it: a bad one is a usage error (one line, exit 2)."""
    from dlog.segments.tier import check_tier_uri

    if value is None or value == "":
        return value  # "" takes the tier away
    try:
        return check_tier_uri(value)
    except DlogError as exc:
        raise click.BadParameter(str(exc)) from exc


def tier_policy_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The tier policy's options (`dlog stream create|alter`, `dlog tier set`), collected into
    `tier`: a `dlog.TierPolicy` of the options given (None fields inherit), or None when none is."""
    from dlog_tools.units import DURATION, DURATION_OR_NEVER, SIZE

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from dlog.segments.metadata import TierPolicy

        given = {field: kwargs.pop(option) for option, field in TIER_OPTION_FIELDS}
        given = {field: value for field, value in given.items() if value is not None}
        return function(*args, tier=TierPolicy(**given) if given else None, **kwargs)

    for flag, kind, text in reversed((
            ("--tier", None, "the stream's tier: file:///absolute/path or s3://bucket/prefix (\"\": none)"),
            ("--offload-after", DURATION_OR_NEVER, "offload a completed segment this long after it completed "
                                                   "(0: at once; -1: only by `dlog offload`)"),
            ("--offload-keep-size", SIZE, "keep the newest completed segments up to this size on the bookies only"),
            ("--offload-delete-lag", DURATION_OR_NEVER, "delete the bookie copy this long after the offload "
                                                        "(-1: never)"),
            ("--tier-retention-age", DURATION, "the tier's retention: remove segments older than this (0: off)"),
            ("--tier-retention-size", SIZE, "the tier's retention: keep at most this many bytes (0: off)"))):
        if kind is None:
            wrapper = click.option(flag, "tier", default=None, metavar="URI", callback=_checked_uri,
                                   help=text)(wrapper)
        else:
            wrapper = click.option(flag, type=kind, default=None, help=text)(wrapper)
    return wrapper


def tier_setting_text(field: str, value: Any) -> str:
    """A tier policy field as people read it: `inherited` (None), `none` (no URI), `never` (-1)..."""
    from dlog_tools.units import format_duration_ms, format_size

    if value is None:
        return "inherited"
    if field == "uri":
        return value or "none"
    if value == -1:
        return "never"
    if value == 0 and field.startswith("retention"):
        return "off"
    if field.endswith("_ms"):
        return format_duration_ms(value) if value else "0 (at once)"
    return format_size(value)


def compaction_options(command: Any) -> Any:
    """`--compaction on|off`, `--min-compaction-lag`, `--delete-retention` of `dlog stream
    create|alter` (they arrive as one `compaction` dict of the StreamConfig fields given)."""
    from dlog_tools.units import DURATION

    def gather(**kwargs: Any) -> Any:
        on = kwargs.pop("compaction_switch")
        lag = kwargs.pop("min_compaction_lag")
        keep = kwargs.pop("delete_retention")
        settings = {key: value for key, value in (
            ("compaction", None if on is None else on == "on"), ("min_compaction_lag_ms", lag),
            ("delete_retention_ms", keep)) if value is not None}
        return command(compaction=settings, **kwargs)

    gather.__name__, gather.__doc__ = command.__name__, command.__doc__
    gather.__click_params__ = list(getattr(command, "__click_params__", []))  # type: ignore[attr-defined]
    for option in reversed([
        click.option("--compaction", "compaction_switch", type=click.Choice(["on", "off"]), default=None,
                     help="key compaction by the policy runner: keep the latest record per key (default off)"),
        click.option("--min-compaction-lag", type=DURATION, default=None,
                     help="compact a segment only once its newest record is this old (default 0)"),
        click.option("--delete-retention", type=DURATION, default=None,
                     help="keep deletion markers this long after their segment's first compaction (default 1d)"),
    ]):
        gather = option(gather)
    return gather
