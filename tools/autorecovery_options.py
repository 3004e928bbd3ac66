"""The auto-recovery settings as command-line options, shared by `dlog bookie start` and
`dlog autorecovery` (each also readable from the TOML file and DLOG_BOOKIE_* variables, like every
bookie setting), and their conversion into `RecoverySettings`."""

from __future__ import annotations

from typing import Any, Callable

import click

from tools.units import DURATION, SIZE

RECOVERY_SETTINGS = ("lost_bookie_recovery_delay", "audit_interval", "replica_check_interval",
                     "open_ledger_grace", "rereplication_rate", "rereplication_bandwidth",
                     "copy_latency_target", "audit_read_rate", "replica_check_rate")


def delay_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--lost-bookie-recovery-delay", default="60s", show_default=True, type=DURATION,
                        help="a bookie gone this long is lost and its ledgers are re-replicated "
                             "(0: at once); one back within it triggers nothing")(function)


def recovery_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Every auto-recovery setting as an option (the delay first in --help)."""
    options = [
        click.option("--replica-check-rate", default=5000, show_default=True, type=click.IntRange(1),
                     help="replicas per second a replica check asks bookies about"),
        click.option("--audit-read-rate", default=200, show_default=True, type=click.IntRange(1),
                     help="ledger metadata reads per second of the auditor's scans (spares ZooKeeper)"),
        click.option("--copy-latency-target", default="20ms", show_default=True, type=DURATION,
                     help="a copy slower than this halves the copies in flight, so the writers of "
                          "the bookies copied to and from keep their latency"),
        click.option("--rereplication-bandwidth", default="64MiB", show_default=True, type=SIZE,
                     help="bytes per second re-replication may copy, per process (0: unlimited)"),
        click.option("--rereplication-rate", default=10_000, show_default=True, type=click.IntRange(0),
                     help="entries per second re-replication may copy, per process (0: unlimited)"),
        click.option("--open-ledger-grace", default="30s", show_default=True, type=DURATION,
                     help="how long an open ledger's last fragment is left to its writer before the "
                          "ledger is fenced and recovered to repair it"),
        click.option("--replica-check-interval", default="7d", show_default=True, type=DURATION,
                     help="time between checks of every replica's presence and checksum (0: never)"),
        click.option("--audit-interval", default="24h", show_default=True, type=DURATION,
                     help="time between checks of every ledger's ensembles against the registered "
                          "bookies (0: only when bookies are lost or on trigger-audit)"),
        delay_option,
    ]
    for option in options:
        function = option(function)
    return function


def recovery_settings(lost_bookie_recovery_delay: int, audit_interval: int, replica_check_interval: int,
                      open_ledger_grace: int, rereplication_rate: int, rereplication_bandwidth: int,
                      copy_latency_target: int, audit_read_rate: int, replica_check_rate: int,
                      auditor: bool = True, workers: bool = True) -> Any:
    """The RecoverySettings those options describe (durations in milliseconds, or text such as
    "30s" as a TOML file holds them; sizes in bytes or text such as "64MiB")."""
    from bookkeeper.autorecovery.settings import RecoverySettings

    lost_bookie_recovery_delay, audit_interval, replica_check_interval, open_ledger_grace, \
        copy_latency_target = (DURATION.convert(value, None, None) for value in (
            lost_bookie_recovery_delay, audit_interval, replica_check_interval, open_ledger_grace,
            copy_latency_target))
    rereplication_bandwidth = SIZE.convert(rereplication_bandwidth, None, None)
    return RecoverySettings(
        auditor=auditor, workers=workers, lost_bookie_recovery_delay_s=lost_bookie_recovery_delay / 1000,
        audit_interval_s=audit_interval / 1000, replica_check_interval_s=replica_check_interval / 1000,
        open_ledger_grace_s=open_ledger_grace / 1000, rereplication_entries_per_s=rereplication_rate,
        rereplication_bytes_per_s=rereplication_bandwidth,
        copy_latency_target_ms=max(1, copy_latency_target), scan_reads_per_s=audit_read_rate,
        replica_check_entries_per_s=replica_check_rate)


def pop_recovery(params: dict[str, Any]) -> dict[str, Any]:
    """Take the auto-recovery settings out of a command's parameters."""
    return {name: params.pop(name) for name in RECOVERY_SETTINGS if name in params}
