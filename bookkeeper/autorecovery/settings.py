"""Every setting of auto-recovery, with its default and its check (docs/operations.md lists them
with their flags: `dlog bookie start`, `dlog autorecovery` and `dlog standalone` share them)."""

from __future__ import annotations

from dataclasses import dataclass

from bookkeeper.autorecovery.throttle import Limits
from bookkeeper.errors import ConfigError

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class RecoverySettings:
    auditor: bool = True  # contend for the auditor (one is elected per cluster)
    workers: bool = True  # repair marked ledgers
    lost_bookie_recovery_delay_s: float = 60.0  # a bookie gone this long is lost (0: at once)
    audit_interval_s: float = DAY_S  # every ledger's ensembles vs registered bookies (0: never)
    replica_check_interval_s: float = 7 * DAY_S  # every closed fragment's replicas (0: never)
    open_ledger_grace_s: float = 30.0  # an open ledger's last fragment is its writer's this long
    rereplication_entries_per_s: float = 10_000.0  # copy rate limits (0: unlimited)
    rereplication_bytes_per_s: float = 64 * 2**20
    copy_window_max: int = 16  # copy requests in flight for one repair, at most
    copy_latency_target_ms: float = 20.0  # a copy slower than this halves the window
    scan_reads_per_s: float = 200.0  # ledger metadata reads of the auditor's scans
    replica_check_entries_per_s: float = 5_000.0  # entries x replicas a replica check asks about
    marks_poll_interval_s: float = 10.0  # a worker looks for marks this often even without a wake
    retry_delay_s: float = 5.0  # a ledger whose repair failed is retried after this (doubling)
    retry_delay_s_max: float = 300.0

    def __post_init__(self) -> None:
        for name in ("lost_bookie_recovery_delay_s", "audit_interval_s", "replica_check_interval_s",
                     "open_ledger_grace_s", "rereplication_entries_per_s", "rereplication_bytes_per_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("copy_latency_target_ms", "scan_reads_per_s", "replica_check_entries_per_s",
                     "marks_poll_interval_s", "retry_delay_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 1 <= self.copy_window_max <= 1024:
            raise ConfigError(f"copy_window_max must be in 1..1024, got {self.copy_window_max}")
        if self.retry_delay_s_max < self.retry_delay_s:
            raise ConfigError("retry_delay_s_max must be >= retry_delay_s")

    @property
    def limits(self) -> Limits:
        return Limits(self.rereplication_entries_per_s, self.rereplication_bytes_per_s)

    @property
    def delay_ms(self) -> int:
        return int(self.lost_bookie_recovery_delay_s * 1000)

    @property
    def grace_ms(self) -> int:
        return int(self.open_ledger_grace_s * 1000)
