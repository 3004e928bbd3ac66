"""Auto-recovery's metrics: plain counters bumped by the auditor, workers and copier, turned into
Prometheus families when scraped (by a bookie's `/metrics`, or `dlog autorecovery`'s own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bookkeeper.autorecovery.settings import RecoverySettings

REPAIR_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


class RecoveryMetrics:
    def __init__(self, settings: RecoverySettings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.is_auditor = False
        self.underreplicated: int | None = None  # known to the auditor only
        self.lost_bookies = 0
        self.entries_copied = 0
        self.bytes_copied = 0
        self.entries_rewritten = 0  # damaged or absent replicas written back in place
        self.ledgers_repaired = 0
        self.repair_failures = 0
        self.ledgers_marked = 0
        self.scan_metadata_reads = 0
        self.replica_check_entries = 0
        self.replica_check_bad = 0
        self.replica_check_lost = 0
        self.throttle_wait_s = 0.0
        self.copy_slowdowns = 0
        self.copy_window = 0
        self.repair_seconds = Histogram(
            "dlog_autorecovery_repair_seconds",
            "Time from a ledger's under-replication mark to its repair", buckets=REPAIR_BUCKETS_S,
            registry=registry)
        registry.register(_Collector(self))


class _Collector(Collector):
    def __init__(self, metrics: RecoveryMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m, s = self.metrics, self.metrics.settings
        counters = {
            "dlog_autorecovery_entries_copied": ("Entries copied to replacement bookies", m.entries_copied),
            "dlog_autorecovery_bytes_copied": ("Entry bytes copied to replacement bookies", m.bytes_copied),
            "dlog_autorecovery_entries_rewritten": ("Absent or damaged replicas written back in place",
                                                    m.entries_rewritten),
            "dlog_autorecovery_ledgers_repaired": ("Marks resolved by this process", m.ledgers_repaired),
            "dlog_autorecovery_repair_failures": ("Repair attempts that failed (retried later)",
                                                  m.repair_failures),
            "dlog_autorecovery_ledgers_marked": ("Marks made or extended by this process as auditor",
                                                 m.ledgers_marked),
            "dlog_autorecovery_scan_metadata_reads": ("Ledger metadata reads of the auditor's scans",
                                                      m.scan_metadata_reads),
            "dlog_autorecovery_replica_check_entries": ("Replicas checked (entries x write-set members)",
                                                        m.replica_check_entries),
            "dlog_autorecovery_replica_check_bad": ("Absent, damaged or divergent replicas found",
                                                    m.replica_check_bad),
            "dlog_autorecovery_replica_check_lost": ("Entries with no good replica left", m.replica_check_lost),
            "dlog_autorecovery_copy_slowdowns": ("Times a slow copy halved the copy window", m.copy_slowdowns),
            "dlog_autorecovery_throttle_wait_seconds": ("Time re-replication waited for its rate limits",
                                                        m.throttle_wait_s),
        }
        for name, (documentation, value) in counters.items():
            yield CounterMetricFamily(name, documentation, value=value)
        gauges = {
            "dlog_autorecovery_is_auditor": ("1 while this process is the cluster's auditor", int(m.is_auditor)),
            "dlog_autorecovery_lost_bookies": ("Bookies the auditor counts as lost", m.lost_bookies),
            "dlog_autorecovery_copy_window": ("Copy requests allowed in flight now", m.copy_window),
            "dlog_autorecovery_copy_window_max": ("Most copy requests in flight for one repair",
                                                  s.copy_window_max),
            "dlog_autorecovery_rereplication_entries_per_second_max": (
                "Re-replication rate limit in entries/s (0: none)", s.rereplication_entries_per_s),
            "dlog_autorecovery_rereplication_bytes_per_second_max": (
                "Re-replication rate limit in bytes/s (0: none)", s.rereplication_bytes_per_s),
            "dlog_autorecovery_scan_reads_per_second_max": ("Metadata reads/s of the auditor's scans",
                                                            s.scan_reads_per_s),
            "dlog_autorecovery_replica_check_entries_per_second_max": (
                "Replicas/s a replica check asks about", s.replica_check_entries_per_s),
        }
        if m.is_auditor and m.underreplicated is not None:
            gauges["dlog_autorecovery_underreplicated_ledgers"] = (
                "Ledgers marked under-replicated (reported by the auditor)", m.underreplicated)
        for name, (documentation, value) in gauges.items():
            yield GaugeMetricFamily(name, documentation, value=value)
