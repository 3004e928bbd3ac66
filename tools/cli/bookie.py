"""`dlog bookie start|list|info`: run and inspect bookies (storage servers)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from bookkeeper.errors import ConfigError, DlogError
from bookkeeper.meta.layout import DEFAULT_ROOT
from tools.autorecovery_options import pop_recovery, recovery_options, recovery_settings
from tools.cli.common import (
    fails_cleanly,
    http_get_json,
    json_option,
    print_table,
    with_zk,
    zk_option,
)
from tools.units import SIZE, format_size, format_time_ms


@click.group()
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
@click.option("--zk-session-timeout", default=10.0, show_default=True, type=click.FloatRange(1, 60),
              help="seconds without ZooKeeper before the session (and the registration) expires: how "
                   "soon a dead bookie is noticed")
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
@click.option("--usage-interval", default=30.0, show_default=True, type=click.FloatRange(0),
              help="seconds between publications of this bookie's stored bytes per namespace, "
                   "which the stored-bytes quota reads (secure bookies; 0: never)")
@click.option("--gc-interval", default=600.0, show_default=True, type=click.FloatRange(0),
              help="seconds between garbage collections (0: only on POST /api/v1/gc)")
@click.option("--gc-grace", default=600.0, show_default=True, type=click.FloatRange(0),
              help="seconds a ledger first seen by this bookie is kept whatever its metadata lookup says")
@click.option("--checkpoint-interval", default=10.0, show_default=True, type=click.FloatRange(0.01))
@click.option("--max-connections", default=4096, show_default=True, type=click.IntRange(1, 1_000_000),
              help="open connections in all; more are refused")
@click.option("--max-connections-per-host", default=1024, show_default=True,
              type=click.IntRange(1, 1_000_000), help="open connections from one client host")
@click.option("--max-unsent", default="16MiB", show_default=True, type=SIZE,
              help="answer bytes a client has not taken before the bookie stops reading its requests")
@click.option("--unsent-timeout", default=30.0, show_default=True, type=click.FloatRange(0.01),
              help="seconds a connection may stay over --max-unsent before it is closed")
@click.option("--first-frame-timeout", default=10.0, show_default=True, type=click.FloatRange(0.01),
              help="seconds a new connection (TLS handshake included) has to send a whole frame")
@click.option("--max-partial-bytes", default="256MiB", show_default=True, type=SIZE,
              help="bytes held in unfinished frames over all connections")
@click.option("--max-partial-bytes-before-auth", default="16KiB", show_default=True, type=SIZE,
              help="bytes of frames one connection may send before AUTH (when the bookie requires it); "
                   "counted apart from --max-partial-bytes")
@click.option("--max-global-unsent", default="256MiB", show_default=True, type=SIZE,
              help="answer bytes all clients have not taken; past it, connections holding some are "
                   "not read until they took them")
@click.option("--max-unsent-connections", default=64, show_default=True, type=click.IntRange(1, 1_000_000),
              help="connections holding unsent answers; past it, at --max-global-unsent, those whose "
                   "answers moved least recently are closed")
@click.option("--reserved-open-files", default=256, show_default=True, type=click.IntRange(16, 1_000_000),
              help="open files kept for the bookie's own (journal, entry logs, index, ZooKeeper): "
                   "connections are capped at the open-file limit minus this")
@click.option("--max-long-polls", default=10_000, show_default=True, type=click.IntRange(1, 10_000_000),
              help="long polls parked at once")
@click.option("--tls-cert", default=None, help="PEM certificate: serve the bookie protocol and the "
              "admin endpoint over TLS")
@click.option("--tls-key", default=None, help="PEM private key of --tls-cert")
@click.option("--tls-ca", default=None, help="CA that signs client certificates")
@click.option("--tls-require-client-cert", is_flag=True, help="mutual TLS: refuse clients without a "
              "certificate signed by --tls-ca")
@click.option("--token-key", default=None, help="key that verifies client tokens: an HS256 secret "
              "file or a PEM public key (RS256/ES256); with it every connection must AUTH")
@click.option("--allow-anonymous", is_flag=True, help="let connections that skip AUTH act as admin "
              "(an open bookie; asked for by name)")
@click.option("--insecure-plaintext", is_flag=True, help="serve without TLS on a non-loopback --host "
              "(asked for by name)")
@click.option("--zk-user", default=None, help="ZooKeeper digest user of the bookie identity")
@click.option("--zk-password-file", default=None, help="file holding that user's password")
@click.option("--http-open-paths", default="/health,/metrics", show_default=True,
              help="admin paths served without a token when tokens are required (comma list; "
                   "empty: none)")
@click.option("--autorecovery/--no-autorecovery", default=True, show_default=True,
              help="run an auto-recovery auditor candidate and replication worker in this bookie")
@recovery_options
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
                  zk_session_timeout: float,
                  bookie_id: str | None, rack: str | None, no_fsync: bool, group_wait_us: int,
                  group_bytes: int, entry_log_size: int, entry_log_flush_size: int,
                  write_cache_size: int, max_entry_size: int,
                  max_in_flight: int, idle_timeout: float, disk_threshold: float,
                  disk_lwm: float | None, disk_check_interval: float, gc_interval: float,
                  checkpoint_interval: float, max_connections: int = 4096,
                  max_connections_per_host: int = 1024, max_unsent: int = 16 * 2**20,
                  unsent_timeout: float = 30.0, first_frame_timeout: float = 10.0,
                  max_partial_bytes: int = 256 * 2**20, max_long_polls: int = 10_000,
                  max_partial_bytes_before_auth: int = 16 * 2**10,
                  max_global_unsent: int = 256 * 2**20, max_unsent_connections: int = 64,
                  reserved_open_files: int = 256,
                  tls_cert: str | None = None, tls_key: str | None = None, tls_ca: str | None = None,
                  tls_require_client_cert: bool = False, token_key: str | None = None,
                  allow_anonymous: bool = False, insecure_plaintext: bool = False,
                  zk_user: str | None = None, zk_password_file: str | None = None,
                  http_open_paths: str = "/health,/metrics", gc_grace: float = 600.0,
                  usage_interval: float = 30.0,
                  config: str | None = None, autorecovery: bool = True, **recovery: Any) -> Any:
    """The BookieConfig that `dlog bookie start` settings describe."""
    from bookkeeper.bookie.config import BookieConfig

    if data_dir is None:
        raise ConfigError("a bookie needs a data directory: pass --dir DIR (or data_dir in the "
                          "[bookie] table of --config)")
    from bookkeeper.bookie.limits import ServerLimits
    from bookkeeper.protocol.wire import HEADER_BYTES

    limits = ServerLimits(frame_bytes_max=max_entry_size + 1024 + HEADER_BYTES,
                          entry_bytes_max=max_entry_size, in_flight_max=max_in_flight,
                          idle_timeout_s=idle_timeout, connections_max=max_connections,
                          connections_per_host_max=max_connections_per_host,
                          unsent_bytes_max=max_unsent, unsent_timeout_s=unsent_timeout,
                          first_frame_timeout_s=first_frame_timeout,
                          partial_bytes_max=max_partial_bytes,
                          unauthenticated_partial_bytes_max=max_partial_bytes_before_auth,
                          global_unsent_bytes_max=max_global_unsent,
                          unsent_connections_max=max_unsent_connections,
                          reserved_open_files=reserved_open_files)
    security = server_security(host, tls_cert, tls_key, tls_ca, tls_require_client_cert, token_key,
                               allow_anonymous, insecure_plaintext)
    zk_password = None
    if zk_user is not None or zk_password_file is not None:
        if not (zk_user and zk_password_file):
            raise ConfigError("ZooKeeper credentials need --zk-user and --zk-password-file together")
        try:
            zk_password = Path(zk_password_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read --zk-password-file {zk_password_file}: {exc.strerror}") from exc
    return BookieConfig(
        security=security, zk_user=zk_user, zk_password=zk_password,
        http_open_paths=tuple(path.strip() for path in http_open_paths.split(",") if path.strip()),
        long_poll_waiters_max=max_long_polls,
        data_dir=data_dir, host=host, port=port, http_port=None if http_port < 0 else http_port,
        zk=zk or None, zk_root=zk_root, zk_session_timeout_s=zk_session_timeout, bookie_id=bookie_id, rack=rack, journal_sync=not no_fsync,
        journal_group_wait_us=group_wait_us, journal_group_bytes_max=group_bytes,
        entry_log_bytes_max=entry_log_size, entry_log_flush_bytes=entry_log_flush_size,
        write_cache_bytes_max=write_cache_size,
        disk_usage_threshold=disk_threshold,
        disk_usage_lwm=disk_lwm if disk_lwm is not None else max(0.001, disk_threshold - 0.05),
        disk_check_interval_s=disk_check_interval, gc_interval_s=gc_interval, gc_grace_s=gc_grace,
        checkpoint_interval_s=checkpoint_interval, limits=limits, usage_interval_s=usage_interval,
        autorecovery=(None if not autorecovery else recovery_settings(**pop_recovery(recovery))
                      if recovery else _default_recovery()))


def _default_recovery() -> Any:
    from bookkeeper.autorecovery.settings import RecoverySettings

    return RecoverySettings()



def server_security(host: str, tls_cert: str | None, tls_key: str | None, tls_ca: str | None,
                    require_client_cert: bool, token_key: str | None, allow_anonymous: bool,
                    insecure_plaintext: bool) -> Any:
    """The bookie's ServerSecurity; off loopback, TLS and authentication unless refused by name (S1)."""
    from bookkeeper.bookie.guard import ServerSecurity
    from bookkeeper.security.tls import ServerTls, is_loopback
    from bookkeeper.security.tokens import TokenKey

    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("TLS needs --tls-cert and --tls-key together")
    tls = ServerTls(tls_cert, tls_key, tls_ca, require_client_cert) if tls_cert and tls_key else None
    if tls is not None:
        tls.context()  # a bad file is one line now, not a failure after start-up
    key = TokenKey.from_file(token_key) if token_key else None
    if not is_loopback(host):
        if tls is None and not insecure_plaintext:
            raise ConfigError(f"a bookie on {host} (not loopback) serves TLS: pass --tls-cert and "
                              "--tls-key, or --insecure-plaintext to serve plaintext anyway")
        if key is None and not require_client_cert and not allow_anonymous:
            raise ConfigError(f"a bookie on {host} (not loopback) authenticates clients: pass "
                              "--token-key or --tls-require-client-cert, or --allow-anonymous")
    return ServerSecurity(tls, key, allow_anonymous)


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
