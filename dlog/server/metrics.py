"""Prometheus metrics of one Kafka server, and its admin endpoint (`dlog serve --admin-port`).

As the bookie's (`bookkeeper.bookie.metrics`): the hot path only bumps plain integers on the
server, its API and its streams; this collector turns them into Prometheus families when
`/metrics` is scraped. Every named limit of docs/serving.md is exported twice: its value
(`dlog_server_<limit>`) and its current use beside it (for a per-connection or per-stream limit,
the most any one connection or stream uses now), so an alert can compare the two.

    endpoint = AdminEndpoint(server)
    url = await endpoint.start("127.0.0.1", 0)    # http://127.0.0.1:PORT: /metrics and /health
    ...
    await endpoint.stop()
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bookkeeper.errors import ConfigError, PortInUseError
from bookkeeper.security.tls import is_loopback
from dlog.core.dedup import DedupLimits
from dlog.policies import BACKLOGS_LABELLED_MAX, PolicyStats, TierStats
from dlog.serve.kafka import BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT
from dlog.server.streams import TAKEOVER_SCAN_MAX

if TYPE_CHECKING:
    from dlog.server.server import KafkaServer

ADMIN_BODY_BYTES_MAX = 1024  # the endpoint takes GETs only


class ServerMetrics:
    def __init__(self, server: KafkaServer) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(server))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Collector(Collector):
    def __init__(self, server: KafkaServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server, settings = self.server, self.server.settings
        use = server.limits_in_use()
        counters = {
            "dlog_server_connections_refused": ("Client connections closed at once: connections_max were open",
                                                server.connections_refused),
            "dlog_server_takeovers": ("Streams this server took (opened their writer)", server.streams.takeovers),
            "dlog_server_streams_lost": ("Owned streams whose writer ended without a clean stop (fenced, failed, "
                                         "the session lost)", server.streams.losses),
            "dlog_server_records_produced": ("Records of produce requests buffered into owned streams' writers",
                                             server.api.records_produced),
            "dlog_server_records_fetched": ("Records sent in fetch answers", server.api.records_fetched),
            "dlog_server_proactive_takeovers": ("Streams of a server gone taken with no client asking",
                                                server.streams.proactive_takeovers),
            "dlog_server_dedup_batches_replayed": ("Producer batches replayed into rebuilt dedup tables on takeover",
                                                   server.streams.replayed_batches),
            "dlog_server_authentications": ("SASL authentications that succeeded", server.api.authentications),
            "dlog_server_authentications_failed": ("SASL authentications refused", server.api.authentications_failed),
            "dlog_server_policy_runs": ("Policy runs (retention) of owned streams", server.policies.stats.runs),
            "dlog_server_policy_failures": ("Policy runs that failed", server.policies.stats.failures),
            "dlog_server_compactions": ("Key compactions swapped in on owned streams (--compaction on)",
                                        server.policies.stats.compactions),
        }
        for name, (documentation, value) in counters.items():
            yield CounterMetricFamily(name, documentation, value=value)
        gauges = {
            # each limit, then its use now
            "dlog_server_connections_max": ("Client connections at which one more is closed at once",
                                            settings.connections_max),
            "dlog_server_connections": ("Client connections open now", use["connections"]),
            "dlog_server_in_flight_per_connection_max": (
                "Requests of one connection read and not answered at which it stops reading",
                settings.in_flight_per_connection_max),
            "dlog_server_in_flight_requests": ("Requests read and not answered: the most of any one connection",
                                               use["in_flight_requests"]),
            "dlog_server_unsent_bytes_max": ("Answer bytes queued on one connection at which the server waits "
                                             "for the client to read", settings.unsent_bytes_max),
            "dlog_server_unsent_bytes": ("Answer bytes queued and not sent: the most of any one connection",
                                         use["unsent_bytes"]),
            "dlog_server_owned_streams_max": ("Streams one server owns at which it takes no more",
                                              settings.owned_streams_max),
            "dlog_server_owned_streams": ("Streams this server owns now", use["owned_streams"]),
            "dlog_server_writer_buffer_bytes_max": ("Bytes of one owned stream buffered and in flight at which "
                                                    "its writer takes no more", settings.writer_buffer_bytes_max),
            "dlog_server_writer_buffer_bytes": ("Bytes buffered and in flight: the most of any one owned stream",
                                                use["writer_buffer_bytes"]),
            "dlog_server_tail_bytes_max": ("Bytes of recent durable records one owned stream keeps for fetches",
                                           settings.tail_bytes_max),
            "dlog_server_tail_bytes": ("Bytes of recent durable records kept: the most of any one owned stream",
                                       use["tail_bytes"]),
            "dlog_server_readers_per_connection_max": ("Stream readers one connection's fetches keep open",
                                                       settings.readers_per_connection_max),
            "dlog_server_readers": ("Stream readers kept open: the most of any one connection", use["readers"]),
            "dlog_server_producers_per_stream_max": ("Idempotent producers one stream's dedup table holds",
                                                     DedupLimits().producers_max),
            "dlog_server_producers": ("Idempotent producers known: the most of any one owned stream",
                                      use["producers"]),
            "dlog_server_producer_idle_seconds_max": ("How long an idempotent producer may stay idle before its "
                                                      "stream forgets it", DedupLimits().producer_idle_ms_max / 1000),
            "dlog_server_fetch_bytes_max": ("Bytes of one fetch answer, whatever the client asks",
                                            settings.fetch_bytes_max),
            "dlog_server_lock_wait_seconds": ("How long taking a free stream waits for its writer lock",
                                              settings.lock_wait_s),
            "dlog_server_request_bytes_max": ("Bytes of one request frame", settings.request_bytes_max),
            "dlog_server_batch_bytes_max": ("Bytes of one produced record batch as sent", settings.batch_bytes_max),
            "dlog_server_batch_decompressed_bytes_max": ("Bytes of one batch's records after decompression",
                                                         BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT),
            "dlog_server_request_bytes_before_auth_max": ("Bytes of one request frame before SASL succeeded",
                                                          settings.request_bytes_before_auth_max),
            "dlog_server_auth_timeout_seconds": ("From accept: TLS handshake and SASL done within it, else closed",
                                                 settings.auth_timeout_s),
            "dlog_server_dedup_replay_bytes_max": ("Records of one owned stream made durable between two stores "
                                                   "of its dedup snapshot", settings.dedup_replay_bytes_max),
            "dlog_server_takeover_scan_max": ("Stream markers of servers gone looked at per change of the servers",
                                              TAKEOVER_SCAN_MAX),
        }
        for name, (documentation, level) in gauges.items():
            yield GaugeMetricFamily(name, documentation, value=level)
        yield from tier_metrics(server.policies.stats.tier)
        yield from backlog_metrics(server.policies.stats)


def tier_metrics(stats: TierStats) -> Iterator[Metric]:
    """The offloads of a policy runner (`dlog.policies.TierStats`), per stream: the first
    TIER_STREAMS_LABELLED_MAX streams by name, the rest as stream="_other" (bounded labels)."""
    families = (
        ("dlog_tier_offloaded_segments", "Segments offloaded to the tier (Parquet files committed)",
         "offloaded_segments"),
        ("dlog_tier_offloaded_bytes", "Bytes of Parquet files offloaded to the tier", "offloaded_bytes"),
        ("dlog_tier_offload_failures", "Offload runs that ended with an error (retried with back-off)",
         "offload_failures"),
        ("dlog_tier_bookie_copies_deleted", "Ledgers (bookie copies) of offloaded segments deleted",
         "bookie_copies_deleted"))
    for name, documentation, attribute in families:
        family = CounterMetricFamily(name, documentation, labels=["stream"])
        for stream, counts in sorted(stats.streams.items()):
            family.add_metric([stream], getattr(counts, attribute))
        yield family


def backlog_metrics(stats: PolicyStats) -> Iterator[Metric]:
    """Each subscription's backlog over its stream's nearest limit (1.0 = at it; 0.8 is the warning
    level) at the stream's last policy run (`dlog.core.backlog`), for streams with backlog limits."""
    family = GaugeMetricFamily("dlog_subscription_backlog_fraction",
                               "A subscription's backlog (unconsumed bytes or oldest record's age) over its stream's "
                               "nearest backlog limit, at the last policy run: >= 0.8 warns, >= 1 is over",
                               labels=["stream", "subscription"])
    for (stream, subscription), fraction in sorted(stats.backlogs.items()):
        family.add_metric([stream, subscription], fraction)
    yield family
    yield GaugeMetricFamily("dlog_subscription_backlogs_labelled_max",
                            "Subscriptions whose backlog fraction is exported (the rest are left out)",
                            value=BACKLOGS_LABELLED_MAX)


def check_admin_host(host: str) -> None:
    """Refuse an admin endpoint off loopback (it has no TLS and no tokens)."""
    if not is_loopback(host):
        raise ConfigError(f"the admin endpoint of `dlog serve` has no TLS nor tokens: serve it on a loopback "
                          f"--admin-host (not {host}), or pass --admin-port -1")


class AdminEndpoint:
    """`/metrics` (Prometheus text) and `/health` (the server's stats as JSON) over aiohttp; on
    loopback only, as `dlog autorecovery`'s: it has no TLS and no tokens."""

    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self.metrics = ServerMetrics(server)
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> str:
        """Listen on host:port (0: any free port); the endpoint's URL."""
        check_admin_host(host)
        app = web.Application(client_max_size=ADMIN_BODY_BYTES_MAX)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise PortInUseError(f"cannot serve the admin endpoint on {host}:{port}: {exc.strerror} (pass another "
                              "--admin-port, or 0 for any free port)") from exc
        self._runner = runner
        return f"http://{host}:{runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **self.server.stats()})
