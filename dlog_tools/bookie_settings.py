"""Every setting of a bookie, defined once.

One row per setting (a `Setting`, dlog_tools/settings.py): its name (the key in the `[bookie]` table of a
config file, the suffix of its `DLOG_BOOKIE_*` variable and, with dashes, its flag), its kind and
unit, where it lands in the config record (`BookieConfig`; `limits.` is its `ServerLimits`,
`autorecovery.` its `RecoverySettings`) and its help. Its default is the record's own field default, written in the
setting's unit, so the record, the command line and the docs cannot disagree; only a setting with
no field of its own (a file the record holds the contents of, a value worked out from others)
names its default here.

Made from this table: the options of `dlog bookie start` (`bookie_options`) and the auto-recovery
ones `dlog autorecovery` and `dlog standalone` share (`recovery_options`, `delay_option`); the
`BookieConfig` and `RecoverySettings` they describe (`bookie_config`, `recovery_settings`); and the
settings tables of docs/operations.md and the `[bookie]` table of docs/dlog.example.toml
(`python -m dlog_tools.settingsdoc`, checked by tests/unit/test_settingsdoc.py). Config files and
`DLOG_BOOKIE_*` variables reach the same options through dlog_tools/config.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bookkeeper.autorecovery.settings import RecoverySettings
from bookkeeper.bookie.config import BookieConfig, ServerSecurity
from bookkeeper.bookie.limits import ServerLimits
from bookkeeper.errors import ConfigError
from bookkeeper.protocol.frame import HEADER_BYTES
from dlog_tools.settings import (
    CommaList,
    Decorator,
    Directory,
    Duration,
    Flag,
    Number,
    Setting,
    Size,
    Switch,
    Text,
    Whole,
)

BOOKIE = "the bookie"
STORAGE = "journal and ledger storage"
DISK = "disk, checkpoints and garbage collection"
LIMITS = "limits one client cannot pass (S4; docs/operations.md)"
SECURITY = "security (docs/security.md); off loopback TLS and authentication are required unless refused"
RECOVERY = 'auto-recovery (operations.md, "Auto-recovery"); durations take units (500ms, 30s, 2h, 7d)'

SETTINGS: tuple[Setting, ...] = (  # in the order of `dlog bookie start --help`
    Setting("data_dir", Directory(), "data_dir", flag="--dir", default=None, shown=False,
            documented="(required)",
            help="data directory: journal, entry logs, index, cookie (required; data_dir in a config file)",
            details="it holds `journal/`, `ledgers/` (entry logs + index) and `cookie.json`",
            example='"/data/bookie"', section=BOOKIE),
    Setting("host", Text(), "host", "address to listen on", section=BOOKIE),
    Setting("port", Whole(0, 65535), "port", "bookie protocol port (0: any free port, only without --zk)",
            section=BOOKIE),
    Setting("http_port", Whole(-1, 65535, minus_one_is_none=True), "http_port",
            "admin HTTP port (0: any free port, -1: no admin server)", section=BOOKIE),
    Setting("zk", Text(blank_is_none=True), "zk",
            "ZooKeeper address; without it the bookie runs unregistered (tests, benchmarks)",
            details="it holds the registration and the cookie, and answers GC's metadata lookups",
            default=lambda: os.environ.get("DLOG_ZK"), shown="$DLOG_ZK", example='"zk1:2181,zk2:2181"',
            section=BOOKIE),
    Setting("zk_root", Text(), "zk_root", "ZooKeeper node under which the cluster lives", section=BOOKIE),
    Setting("zk_session_timeout", Number(1, 60, "s"), "zk_session_timeout_s",
            "seconds without ZooKeeper before the session (and the registration) expires: how soon a "
            "dead bookie is noticed", section=BOOKIE),
    Setting("bookie_id", Text(), "bookie_id", "identity in ZooKeeper (default host:port)",
            details="it must stay the same for the life of the data directory",
            shown=False, documented="host:port", example='"10.0.0.11:3181"', section=BOOKIE),
    Setting("rack", Text(), "rack", "rack or zone name used by placement", shown=False,
            example='"rack-a"', section=BOOKIE),
    Setting("no_fsync", Flag(inverted=True), "journal_sync",
            "skip fdatasync: NOT durable, for experiments only", section=STORAGE),
    Setting("group_wait_us", Whole(0, 1_000_000, "µs"), "journal_group_wait_us",
            "longest time a journal record waits for its group commit", section=STORAGE),
    Setting("group_bytes", Size("KiB"), "journal_group_bytes_max",
            "journal group commit flushes once this much is buffered", section=STORAGE),
    Setting("entry_log_size", Size("MiB"), "entry_log_bytes_max", "entry log file size before rolling",
            section=STORAGE),
    Setting("entry_log_flush_size", Size("MiB"), "entry_log_flush_bytes",
            "fdatasync entry logs every this many bytes written, so a checkpoint never holds the journal's "
            "fsync behind one big sync (0: only at checkpoints)",
            details="BookKeeper's `flushEntrylogBytes`: the journal's fsync, on the same disk, never waits "
                    "behind one sync of tens of MB", section=STORAGE),
    Setting("write_cache_size", Size("MiB"), "write_cache_bytes_max",
            "write cache size that triggers a checkpoint",
            details="the bookie's memory is about this plus the journal buffer (64 MiB at most) and the "
                    "rocksdict block cache", section=STORAGE),
    Setting("max_entry_size", Size("MiB"), "limits.entry_bytes_max", "larger entries are refused (TOO_LARGE)",
            details="a frame may be 1 KiB and a header longer", section=LIMITS),
    Setting("max_in_flight", Whole(1, 1_000_000), "limits.in_flight_max",
            "unanswered requests per connection before the bookie stops reading it",
            details="an ADD_BATCH or READ_RANGE counts as one", section=LIMITS),
    Setting("idle_timeout", Number(0.01, unit="s"), "limits.idle_timeout_s",
            "seconds a partial frame may stall before the connection is closed", section=LIMITS),
    Setting("disk_threshold", Number(0, 1), "disk_usage_threshold",
            "disk usage fraction that turns the bookie read-only", section=DISK),
    Setting("disk_lwm", Number(0, 1), "*",
            "disk usage fraction below which it turns writable again (default threshold-0.05)",
            default=None, shown=False, documented="threshold - 0.05", example="0.90", section=DISK),
    Setting("disk_check_interval", Number(0.01, unit="s"), "disk_check_interval_s",
            "seconds between checks of the disk usage", section=DISK),
    Setting("usage_interval", Number(0, unit="s"), "usage_interval_s",
            "seconds between publications of this bookie's stored bytes per namespace, which the "
            "stored-bytes quota reads (secure bookies; 0: never)",
            details="it also reads the cluster's totals then (docs/security.md). A round reads at most 1,000 "
                    "ledgers' metadata (`USAGE_LOOKUPS_MAX`, metric `dlog_bookie_usage_lookups_max`; the "
                    "rest in later rounds); the `streams_max` backstop ranks at most 10,000 streams a "
                    "namespace (`STREAMS_RANKED_MAX`, `dlog_bookie_streams_ranked_max`; beyond, it refuses "
                    "none); a reader sums at most 10,000 bookies' usage nodes (`USAGE_NODES_MAX`)",
            section=DISK),
    Setting("gc_interval", Number(0, unit="s"), "gc_interval_s",
            "seconds between garbage collections (0: only on POST /api/v1/gc)", section=DISK),
    Setting("gc_grace", Number(0, unit="s"), "gc_grace_s",
            "seconds a ledger first seen by this bookie is kept whatever its metadata lookup says",
            details="a lagging ZooKeeper follower may not know a ledger created a moment ago; every lookup "
                    "is also preceded by a ZooKeeper `sync`", section=DISK),
    Setting("checkpoint_interval", Number(0.01, unit="s"), "checkpoint_interval_s",
            "seconds between checkpoints", section=DISK),
    Setting("max_connections", Whole(1, 1_000_000), "limits.connections_max",
            "open connections in all; more are refused",
            details="they are counted from accept (TLS handshakes included); one more is refused at once",
            section=LIMITS),
    Setting("max_connections_per_host", Whole(1, 1_000_000), "limits.connections_per_host_max",
            "open connections from one client host", details="more are refused at once", section=LIMITS),
    Setting("max_unsent", Size("MiB"), "limits.unsent_bytes_max",
            "answer bytes a client has not taken before the bookie stops reading its requests",
            details="what the TLS layer holds counts too", section=LIMITS),
    Setting("unsent_timeout", Number(0.01, unit="s"), "limits.unsent_timeout_s",
            "seconds a connection may stay over --max-unsent before it is closed", section=LIMITS),
    Setting("first_frame_timeout", Number(0.01, unit="s"), "limits.first_frame_timeout_s",
            "seconds a new connection (TLS handshake included) has to send a whole frame", section=LIMITS),
    Setting("max_partial_bytes", Size("MiB"), "limits.partial_bytes_max",
            "bytes held in unfinished frames over all connections",
            details="only authenticated connections count (see the next); the connection that passes it "
                    "is closed", section=LIMITS),
    Setting("max_partial_bytes_before_auth", Size("KiB"), "limits.unauthenticated_partial_bytes_max",
            "bytes of frames one connection may send before AUTH (when the bookie requires it); counted "
            "apart from --max-partial-bytes",
            details="the longest AUTH frame fits (at least 9 KiB); the connection that passes it is closed",
            section=LIMITS),
    Setting("max_global_unsent", Size("MiB"), "limits.global_unsent_bytes_max",
            "answer bytes all clients have not taken; past it, connections holding some are not read "
            "until they took them", details="a connection holding none is still read", section=LIMITS),
    Setting("max_unsent_connections", Whole(1, 1_000_000), "limits.unsent_connections_max",
            "connections holding unsent answers; past it, at --max-global-unsent, those whose answers "
            "moved least recently are closed",
            details="what never-reading clients hold stays near `--max-global-unsent` plus one answer (at "
                    "most `--max-entry-size`) each of this many; raise it for more slow readers at once",
            section=LIMITS),
    Setting("reserved_open_files", Whole(16, 1_000_000), "limits.reserved_open_files",
            "open files kept for the bookie's own (journal, entry logs, index, ZooKeeper): connections "
            "are capped at the open-file limit minus this",
            details="the cap applies when that is below `--max-connections` (logged at start). The bookie "
                    "raises its soft open-file limit to the hard one; raise the hard one (`LimitNOFILE=`, "
                    "`ulimit -Hn`) for more connections", section=LIMITS),
    Setting("max_long_polls", Whole(1, 10_000_000), "long_poll_waiters_max", "long polls parked at once",
            details="a closed connection's are dropped at once", section=LIMITS),
    # security: the next seven make the record's `security` (server_security)
    Setting("tls_cert", Text(), "*",
            "PEM certificate: serve the bookie protocol and the admin endpoint over TLS",
            default=None, shown=False, example='"/etc/dlog/bookie.pem"', section=SECURITY),
    Setting("tls_key", Text(), "*", "PEM private key of --tls-cert", default=None, shown=False,
            example='"/etc/dlog/bookie.key"', section=SECURITY),
    Setting("tls_ca", Text(), "*", "CA that signs client certificates", default=None, shown=False,
            example='"/etc/dlog/ca.pem"', section=SECURITY),
    Setting("tls_require_client_cert", Flag(), "*",
            "mutual TLS: refuse clients without a certificate signed by --tls-ca", default=False,
            section=SECURITY),
    Setting("token_key", Text(), "*",
            "key that verifies client tokens: an HS256 secret file or a PEM public key (RS256/ES256); "
            "with it every connection must AUTH", default=None, shown=False,
            example='"/etc/dlog/token.key"', section=SECURITY),
    Setting("allow_anonymous", Flag(), "*",
            "let connections that skip AUTH act as admin (an open bookie; asked for by name)",
            default=False, section=SECURITY),
    Setting("insecure_plaintext", Flag(), "*",
            "serve without TLS on a non-loopback --host (asked for by name)", default=False,
            section=SECURITY),
    Setting("zk_user", Text(), "zk_user", "ZooKeeper digest user of the bookie identity", shown=False,
            example='"bookie"', section=SECURITY),
    Setting("zk_password_file", Text(), "*", "file holding that user's password",  # -> zk_password
            default=None, shown=False, example='"/etc/dlog/zk-bookie.password"', section=SECURITY),
    Setting("http_open_paths", CommaList(), "http_open_paths",
            "admin paths served without a token when tokens are required (comma list; empty: none)",
            section=SECURITY),
    Setting("autorecovery", Switch(), "autorecovery",
            "run an auto-recovery auditor candidate and replication worker in this bookie",
            section=RECOVERY),
    # auto-recovery: the settings `dlog autorecovery` shares (recovery_options)
    Setting("lost_bookie_recovery_delay", Duration("s"), "autorecovery.lost_bookie_recovery_delay_s",
            "a bookie gone this long is lost and its ledgers are re-replicated (0: at once); one back "
            "within it triggers nothing",
            details="`dlog standalone` takes it too. The delay starts when the bookie's ZooKeeper session "
                    "expires (`--zk-session-timeout`), and again from the election of a new auditor",
            section=RECOVERY),
    Setting("audit_interval", Duration("h"), "autorecovery.audit_interval_s",
            "time between checks of every ledger's ensembles against the registered bookies (0: only when "
            "bookies are lost or on trigger-audit)", details="a scan also runs at the election of an auditor",
            section=RECOVERY),
    Setting("replica_check_interval", Duration("d"), "autorecovery.replica_check_interval_s",
            "time between checks of every replica's presence and checksum (0: never)",
            details="closed fragments are checked; with 0, only on `trigger-audit --replica-check`",
            section=RECOVERY),
    Setting("open_ledger_grace", Duration("s"), "autorecovery.open_ledger_grace_s",
            "how long an open ledger's last fragment is left to its writer before the ledger is fenced "
            "and recovered to repair it",
            details="the writer changes ensemble on its next add; a writer idle for longer than this with "
                    "a lost bookie in its ensemble is fenced, as in BookKeeper", section=RECOVERY),
    Setting("rereplication_rate", Whole(0), "autorecovery.rereplication_entries_per_s",
            "entries per second re-replication may copy, per process (0: unlimited)", section=RECOVERY),
    Setting("rereplication_bandwidth", Size("MiB"), "autorecovery.rereplication_bytes_per_s",
            "bytes per second re-replication may copy, per process (0: unlimited)", section=RECOVERY),
    Setting("copy_latency_target", Duration("ms", least_ms=1), "autorecovery.copy_latency_target_ms",
            "a copy slower than this halves the copies in flight, so the writers of the bookies copied "
            "to and from keep their latency",
            details="below it the target is twice the latency of copies while the window is at its minimum",
            section=RECOVERY),
    Setting("audit_read_rate", Whole(1), "autorecovery.scan_reads_per_s",
            "ledger metadata reads per second of the auditor's scans (spares ZooKeeper)", section=RECOVERY),
    Setting("replica_check_rate", Whole(1), "autorecovery.replica_check_entries_per_s",
            "replicas per second a replica check asks bookies about", section=RECOVERY),
    Setting("latency_probes", Flag(), "latency_probes",
            "also export the event loop's lag and each journal record's wait as histograms (what "
            "`dlog bench tail --explain` reads; a little CPU per add)",
            details="`dlog_bookie_event_loop_lag_seconds`, `dlog_bookie_journal_durable_seconds` and "
                    "`dlog_bookie_journal_queue_seconds` (bookkeeper/bookie/probes.py)", section=BOOKIE),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}
RECOVERY_SETTINGS = tuple(setting for setting in SETTINGS if setting.recovery)


# ------------------------------------------------------------------------------ the options


def _options(settings: tuple[Setting, ...]) -> Decorator:
    def apply(function: Callable[..., Any]) -> Callable[..., Any]:
        for setting in reversed(settings):  # the first applied is the last in --help
            function = setting.option()(function)
        return function

    return apply


bookie_options = _options(SETTINGS)  # `dlog bookie start`
recovery_options = _options(RECOVERY_SETTINGS)  # `dlog autorecovery`
delay_option = BY_NAME["lost_bookie_recovery_delay"].option()  # `dlog standalone`


# ------------------------------------------------------------------------------ the record


def _landed(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The record fields under `prefix` that settings land on directly, from their values."""
    fields = {}
    for name, value in values.items():
        setting = BY_NAME.get(name)
        if setting is None or setting.lands == "*":
            continue
        head, _, field = setting.lands.rpartition(".")
        if head == prefix:
            fields[field] = setting.kind.to_record(value, field)
    return fields


def recovery_settings(values: dict[str, Any], *, auditor: bool = True,
                      workers: bool = True) -> RecoverySettings:
    """The RecoverySettings the auto-recovery settings among `values` describe (the others default)."""
    return RecoverySettings(auditor=auditor, workers=workers, **_landed(values, "autorecovery"))


def pop_recovery(params: dict[str, Any]) -> dict[str, Any]:
    """Take the auto-recovery settings out of a command's parameters."""
    return {setting.name: params.pop(setting.name) for setting in RECOVERY_SETTINGS if setting.name in params}


def bookie_config(values: dict[str, Any]) -> BookieConfig:
    """The BookieConfig that `dlog bookie start`'s settings describe: each lands where the table
    says, then the few that are worked out from others."""
    values = {setting.name: setting.default_value for setting in SETTINGS} | values
    if values["data_dir"] is None:
        raise ConfigError("a bookie needs a data directory: pass --dir DIR (or data_dir in the "
                          "[bookie] table of --config)")
    limits = ServerLimits(**_landed(values, "limits"))
    # a frame holds the largest entry, the request around it and the header
    limits = dataclasses.replace(limits, frame_bytes_max=limits.entry_bytes_max + 1024 + HEADER_BYTES)
    fields = _landed(values, "")
    threshold = fields["disk_usage_threshold"]
    lwm = values["disk_lwm"]
    fields["disk_usage_lwm"] = lwm if lwm is not None else max(0.001, threshold - 0.05)
    fields["autorecovery"] = recovery_settings(values) if values["autorecovery"] else None
    fields["security"] = server_security(
        values["host"], values["tls_cert"], values["tls_key"], values["tls_ca"],
        values["tls_require_client_cert"], values["token_key"], values["allow_anonymous"],
        values["insecure_plaintext"])
    fields["zk_password"] = _zk_password(values["zk_user"], values["zk_password_file"])
    return BookieConfig(limits=limits, **fields)


def _zk_password(user: str | None, password_file: str | None) -> str | None:
    if user is None and password_file is None:
        return None
    if not (user and password_file):
        raise ConfigError("ZooKeeper credentials need --zk-user and --zk-password-file together")
    try:
        return Path(password_file).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read --zk-password-file {password_file}: {exc.strerror}") from exc


def server_security(host: str, tls_cert: str | None, tls_key: str | None, tls_ca: str | None,
                    require_client_cert: bool, token_key: str | None, allow_anonymous: bool,
                    insecure_plaintext: bool, what: str = "a bookie") -> ServerSecurity:
    """The bookie's ServerSecurity (or that of `what`, a Kafka server); off loopback, TLS and
    authentication unless refused by name (S1)."""
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
            raise ConfigError(f"{what} on {host} (not loopback) serves TLS: pass --tls-cert and "
                              "--tls-key, or --insecure-plaintext to serve plaintext anyway")
        if key is None and not require_client_cert and not allow_anonymous:
            raise ConfigError(f"{what} on {host} (not loopback) authenticates clients: pass "
                              "--token-key or --tls-require-client-cert, or --allow-anonymous")
    return ServerSecurity(tls, key, allow_anonymous)
