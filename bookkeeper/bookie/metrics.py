"""Prometheus metrics of one bookie.

The hot path only bumps plain integers on the core and the server; this collector turns them
into Prometheus families when `/metrics` is scraped, so an add costs no lock and no call into
the metrics library. Journal commits (one per group, not per entry) feed real histograms.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bookkeeper.bookie.bookie import DELETED_LEDGERS_REMEMBERED_MAX, BookieCore
from bookkeeper.bookie.guard import Guard
from bookkeeper.bookie.journal import Journal
from bookkeeper.bookie.ledgers import LedgerMetadataAccess
from bookkeeper.bookie.server import BookieServer
from bookkeeper.bookie.storage import LedgerStorage
from bookkeeper.clock import perf_s
from bookkeeper.meta.usage import USAGE_LOOKUPS_MAX
from bookkeeper.security.quota import STREAMS_RANKED_MAX

FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
PAUSE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
NAMESPACES_SHOWN_MAX = 1_000  # namespaces labelled in dlog_bookie_namespace_stored_bytes (label cardinality)


class MeteredBookie(Protocol):
    """The parts of a bookie (service.py's BookieService) whose counters and gauges are scraped."""

    core: BookieCore
    server: BookieServer
    guard: Guard | None
    ledgers: LedgerMetadataAccess
    storage: LedgerStorage
    journal: Journal

    def disk_usage(self) -> dict[str, Any]: ...


class BookieMetrics:
    def __init__(self, service: MeteredBookie) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.journal_fsync_seconds = Histogram(
            "dlog_bookie_journal_fsync_seconds", "Time to write and fdatasync one journal group",
            buckets=FSYNC_BUCKETS_S, registry=self.registry)
        self.journal_group_entries = Histogram(
            "dlog_bookie_journal_group_records", "Journal records made durable by one fdatasync",
            buckets=GROUP_BUCKETS, registry=self.registry)
        self.journal_group_bytes_total = 0
        self.checkpoints_total = 0
        self.gc_ledgers_deleted_total = 0
        self.gc_reclaimed_bytes_total = 0
        self.gc_ledgers_kept_by_grace = 0  # at the last run: gone from metadata, kept by the grace
        self.gc_pause_seconds = Histogram(
            "dlog_bookie_python_gc_pause_seconds", "Pauses of Python's cycle collector, by generation",
            ["generation"], buckets=PAUSE_BUCKETS_S, registry=self.registry)
        self._gc_started = 0.0
        self.registry.register(_ServiceCollector(service, self))

    def time_gc_pauses(self) -> None:
        """Observe every cycle collection (it stops the whole bookie: adds, fsync callbacks, reads)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop_timing_gc_pauses(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = perf_s()
        elif self._gc_started:
            self.gc_pause_seconds.labels(str(info["generation"])).observe(
                perf_s() - self._gc_started)

    def on_journal_commit(self, records: int, size_bytes: int, seconds: float) -> None:
        self.journal_fsync_seconds.observe(seconds)
        self.journal_group_entries.observe(records)
        self.journal_group_bytes_total += size_bytes

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ServiceCollector(Collector):
    def __init__(self, service: MeteredBookie, metrics: BookieMetrics) -> None:
        self.service = service
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        core, server, metrics = self.service.core, self.service.server, self.metrics
        counters = {
            "dlog_bookie_add_entries": ("Entries added", core.add_count),
            "dlog_bookie_add_bytes": ("Entry bytes added", core.add_bytes),
            "dlog_bookie_read_entries": ("Entries read", core.read_count),
            "dlog_bookie_read_bytes": ("Entry bytes read", core.read_bytes),
            "dlog_bookie_fences": ("Ledgers fenced", core.fence_count),
            "dlog_bookie_check_entries": ("Entries asked about by replica checks", core.check_count),
            "dlog_bookie_journal_bytes": ("Bytes written to the journal",
                                          metrics.journal_group_bytes_total),
            "dlog_bookie_journal_inline_groups": ("Journal groups of one record written and fsynced on "
                                                  "the event loop's thread (the idle path)",
                                                  self.service.journal.inline_groups),
            "dlog_bookie_protocol_errors": ("Frames refused", server.protocol_errors),
            "dlog_bookie_backpressure_pauses": ("Times a connection stopped being read",
                                                server.backpressure_pauses),
            "dlog_bookie_checkpoints": ("Checkpoints completed", metrics.checkpoints_total),
            "dlog_bookie_gc_ledgers_deleted": ("Ledgers removed by garbage collection",
                                               metrics.gc_ledgers_deleted_total),
            "dlog_bookie_gc_reclaimed_bytes": ("Bytes reclaimed by compaction",
                                               metrics.gc_reclaimed_bytes_total),
        }
        counters.update({
            "dlog_bookie_connections_closed_idle": ("Connections closed for sending no whole frame in "
                                                    "time or stalling a partial frame", server.idle_closed),
            "dlog_bookie_connections_closed_unsent": ("Connections closed for not taking their answers "
                                                      "within unsent_timeout, or for taking them least "
                                                      "of unsent_connections_max holding them",
                                                      server.unsent_closed + server.unsent.closed),
            "dlog_bookie_connections_closed_partial": ("Connections closed because partial frames held "
                                                       "partial_bytes_max", server.partial.closed),
            "dlog_bookie_connections_closed_partial_before_auth": (
                "Connections closed for sending more than unauthenticated_partial_bytes_max of frames "
                "before AUTH", server.partial.before_auth_closed),
            "dlog_bookie_tls_handshake_failures": ("TLS handshakes that failed or timed out",
                                                   server.handshake_failures),
            "dlog_bookie_unsent_pauses": ("Times a connection stopped being read for unsent answers",
                                          server.unsent_blocks),
            "dlog_bookie_long_polls_dropped": ("Long polls dropped because their connection closed",
                                               core.dropped_waiters),
            "dlog_bookie_deleted_ledger_refusals": ("Adds and fences refused because garbage collection "
                                                    "had dropped their ledger", core.deleted_refusals),
        })
        guard = self.service.guard
        if guard is not None:
            counters["dlog_bookie_auth_failures"] = ("Connections or requests refused as "
                                                     "unauthenticated", guard.auth_failures)
            counters["dlog_bookie_forbidden_requests"] = ("Requests refused by authorization",
                                                          guard.forbidden)
            counters["dlog_bookie_ledger_namespace_lookups"] = ("Ledger metadata reads for "
                                                                "authorization", guard.lookups)
            counters["dlog_bookie_quota_throttles"] = ("Times a connection was slowed for its "
                                                       "namespace's write quota", guard.throttled)
            counters["dlog_bookie_quota_refusals"] = ("Adds refused because their namespace reached "
                                                      "its stored_bytes_max", guard.quota_refusals)
        ledgers = self.service.ledgers
        counters["dlog_bookie_ledgers_created"] = ("Ledgers created for clients (CREATE_LEDGER)", ledgers.created)
        counters["dlog_bookie_ledger_namespaces_untrusted"] = ("Ledger metadata lookups refused because the "
                                                               "node's ACL cannot vouch for its namespace",
                                                               ledgers.untrusted)
        for name, (documentation, value) in counters.items():
            yield CounterMetricFamily(name, documentation, value=value)
        refused = CounterMetricFamily("dlog_bookie_connections_refused", "Connections refused at a cap",
                                      labels=["cap"])
        for cap, value in server.refused_connections.items():
            refused.add_metric([cap], value)
        yield refused
        if guard is not None:
            stored = GaugeMetricFamily("dlog_bookie_namespace_stored_bytes", "Bytes a namespace stores on "
                                       "all bookies (every copy), as last published: what stored_bytes_max "
                                       "is checked against", labels=["namespace"])
            for namespace, size_bytes in sorted(guard.stored_usage.items())[:NAMESPACES_SHOWN_MAX]:
                stored.add_metric([namespace], size_bytes)
            yield stored
        disk = self.service.disk_usage()
        gauges = {
            "dlog_bookie_in_flight_requests": ("Requests received and not yet answered",
                                               server.in_flight),
            "dlog_bookie_connections": ("Open client connections, those in their TLS handshake "
                                        "included", len(server.connections)),
            "dlog_bookie_connections_max": ("Open connections at which new ones are refused (lower "
                                            "than --max-connections when the open-file limit is)",
                                            server.connections_max),
            "dlog_bookie_reserved_open_files": ("Open files kept from client connections for the "
                                                "bookie's own", server.limits.reserved_open_files),
            "dlog_bookie_tls_handshakes": ("Connections in their TLS handshake", server.handshakes),
            "dlog_bookie_connections_per_host_max": ("Open connections from one host at which its new "
                                                     "ones are refused",
                                                     server.limits.connections_per_host_max),
            "dlog_bookie_unsent_bytes": ("Answer bytes clients have not taken yet", server.unsent_bytes),
            "dlog_bookie_unsent_bytes_max": ("Unsent answer bytes per connection at which it stops "
                                             "being read", server.limits.unsent_bytes_max),
            "dlog_bookie_global_unsent_bytes_max": ("Unsent answer bytes of all connections at which "
                                                    "those holding some stop being read",
                                                    server.limits.global_unsent_bytes_max),
            "dlog_bookie_unsent_connections": ("Connections holding answers their clients have not taken",
                                               len(server.unsent.holders)),
            "dlog_bookie_unsent_connections_max": ("Connections holding unsent answers past which, "
                                                   "at global_unsent_bytes_max, the least progressing "
                                                   "are closed", server.limits.unsent_connections_max),
            "dlog_bookie_partial_frame_bytes": ("Bytes held in unfinished frames of authenticated (or "
                                                "open) connections", server.partial.bytes),
            "dlog_bookie_unauthenticated_partial_frame_bytes": (
                "Bytes held in unfinished frames of connections that have not sent AUTH",
                server.partial.before_auth_bytes),
            "dlog_bookie_unauthenticated_partial_frame_bytes_max": (
                "Bytes of frames one connection may hold before AUTH",
                server.limits.unauthenticated_partial_bytes_max),
            "dlog_bookie_partial_frame_bytes_max": ("Bytes in unfinished frames at which connections are "
                                                    "closed", server.limits.partial_bytes_max),
            "dlog_bookie_long_polls": ("Long polls parked", core.waiter_count),
            "dlog_bookie_long_polls_max": ("Long polls parked at which more are refused",
                                           core.long_poll_waiters_max),
            "dlog_bookie_ledger_creates_pending": ("Ledger creations (CREATE_LEDGER) running",
                                                   self.service.ledgers.creates_pending),
            "dlog_bookie_ledger_creates_pending_max": ("Ledger creations running at which more are refused",
                                                       self.service.ledgers.creates_pending_max),
            "dlog_bookie_read_only": ("1 when the bookie refuses adds", int(core.read_only)),
            "dlog_bookie_write_cache_bytes": ("Entry bytes not yet checkpointed",
                                              self.service.storage.write_cache_bytes),
            "dlog_bookie_journal_buffered_bytes": ("Journal bytes waiting for fsync",
                                                   self.service.journal.buffered_bytes),
            "dlog_bookie_journal_buffered_bytes_max": ("Journal bytes waiting for fsync at which "
                                                       "the bookie stops reading requests",
                                                       self.service.journal.buffered_bytes_max),
            "dlog_bookie_gc_ledgers_kept_by_grace": ("Ledgers whose metadata the last garbage "
                                                     "collection found gone, kept because this bookie "
                                                     "first saw them less than the grace period ago",
                                                     metrics.gc_ledgers_kept_by_grace),
            "dlog_bookie_deleted_ledgers_remembered": ("Ledgers garbage collection dropped that this bookie "
                                                       "remembers, to refuse adds to them",
                                                       core.deleted_remembered),
            "dlog_bookie_deleted_ledgers_remembered_max": ("Dropped ledgers remembered at most (the oldest "
                                                           "are forgotten first)", DELETED_LEDGERS_REMEMBERED_MAX),
            "dlog_bookie_ledger_storage_bytes": ("Bytes of entry logs and index",
                                                 self.service.storage.disk_bytes()),
            "dlog_bookie_disk_used_ratio": ("Used fraction of the data directory's file system",
                                            disk["usage"]),
            "dlog_bookie_disk_free_bytes": ("Free bytes on the data directory's file system",
                                            disk["free_bytes"]),
        }
        if guard is not None:
            gauges["dlog_bookie_ledger_namespaces_cached"] = ("Ledger namespaces cached for "
                                                              "authorization", guard.cached_namespaces)
            gauges["dlog_bookie_ledger_namespace_waiting"] = ("Requests waiting for their ledger's "
                                                              "metadata", guard.waiting)
            gauges["dlog_bookie_usage_lookups_max"] = ("Ledger metadata reads one usage round makes at most "
                                                       "(the rest wait for the next round)", USAGE_LOOKUPS_MAX)
            gauges["dlog_bookie_streams_ranked_max"] = ("Streams of one namespace the streams_max backstop "
                                                        "ranks; beyond, it refuses none", STREAMS_RANKED_MAX)
        for name, (documentation, value) in gauges.items():
            yield GaugeMetricFamily(name, documentation, value=value)
