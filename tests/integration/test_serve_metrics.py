"""`dlog serve --admin-port` exports the server's counters and every named limit with its use: a
real `dlog serve` process on a real cluster, real librdkafka traffic, scraped over real HTTP."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import eventually
from tests.integration.serving import ServeProcess, serve_processes
from tests.integration.test_serve_kafka import expected_records, librdkafka_produce, librdkafka_read

RECORDS = 50
# every limit of docs/serving.md's "Server limits" table and the wire limits, each beside its use
LIMITS_WITH_USE = {"connections_max": "connections", "in_flight_per_connection_max": "in_flight_requests",
                   "unsent_bytes_max": "unsent_bytes", "owned_streams_max": "owned_streams",
                   "writer_buffer_bytes_max": "writer_buffer_bytes", "tail_bytes_max": "tail_bytes",
                   "readers_per_connection_max": "readers", "producers_per_stream_max": "producers"}
LIMITS_ALONE = ("fetch_bytes_max", "lock_wait_seconds", "request_bytes_max", "batch_bytes_max",
                "batch_decompressed_bytes_max", "producer_idle_seconds_max")


@pytest.fixture
def serve(cluster_factory) -> Iterator[Callable[..., ServeProcess]]:
    with serve_processes(cluster_factory) as start:
        yield start


async def scrape(url: str) -> dict[str, float]:
    """Sample name -> value of every dlog_server_ sample (counters with their _total suffix)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
            session.get(f"{url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("dlog_server_")}


async def test_the_admin_endpoint_exports_counters_that_move_with_traffic_and_every_limit(cluster_factory, serve):
    cluster = cluster_factory(bookies=1)
    server = serve(cluster, f"metrics-{uuid.uuid4().hex[:8]}", "--auto-create-topics", "--admin-port", "0")
    assert server.admin is not None and server.admin.startswith("http://127.0.0.1:")
    before = await scrape(server.admin)
    assert before["dlog_server_records_produced_total"] == 0
    assert before["dlog_server_owned_streams"] == 0
    assert before["dlog_server_connections_max"] == 1024
    assert before["dlog_server_owned_streams_max"] == 10_000
    assert before["dlog_server_tail_bytes_max"] == 8 << 20
    for limit, use in LIMITS_WITH_USE.items():
        assert before[f"dlog_server_{limit}"] > 0, limit
        assert f"dlog_server_{use}" in before, use
    for limit in LIMITS_ALONE:
        assert before[f"dlog_server_{limit}"] > 0, limit

    records = expected_records("metrics", RECORDS)
    await asyncio.to_thread(librdkafka_produce, server.bootstrap, "scraped", records)

    async def produced() -> dict[str, float] | None:
        found = await scrape(server.admin)
        return found if found["dlog_server_records_produced_total"] >= RECORDS else None

    after = await eventually(produced, timeout_s=30)
    assert after["dlog_server_records_produced_total"] == RECORDS
    assert after["dlog_server_owned_streams"] == 1
    assert after["dlog_server_takeovers_total"] == 1
    assert after["dlog_server_tail_bytes"] > 0  # the produced records, durable, kept for fetches
    assert after["dlog_server_tail_bytes"] <= after["dlog_server_tail_bytes_max"]

    assert len(await asyncio.to_thread(librdkafka_read, server.bootstrap, "scraped", RECORDS)) == RECORDS

    async def fetched() -> dict[str, float] | None:
        found = await scrape(server.admin)
        return found if found["dlog_server_records_fetched_total"] >= RECORDS else None

    assert (await eventually(fetched, timeout_s=30))["dlog_server_records_fetched_total"] >= RECORDS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
            session.get(f"{server.admin}/health") as response:
        health = await response.json()
    assert health["status"] == "ok" and health["streams"] == ["scraped"]
    assert server.stop() == 0


def test_an_admin_endpoint_off_loopback_is_refused_in_one_line(cluster_factory):
    from tests.helpers import dlog_runner, one_error_line

    cluster = cluster_factory(bookies=1)
    run = dlog_runner(cluster.zk_address, cluster.zk_root, "default")
    result = run("serve", "--kafka-port", "0", "--admin-port", "0", "--admin-host", "0.0.0.0", ok=False,
                 timeout_s=60)
    assert "admin endpoint of `dlog serve` has no TLS nor tokens" in one_error_line(result)


async def test_the_server_offloads_owned_streams_with_a_tier_and_counts_it_by_stream(cluster_factory, serve,
                                                                                    tmp_path):
    from dlog import Namespace, TierPolicy

    cluster = cluster_factory(bookies=1)
    namespace = f"tiered-{uuid.uuid4().hex[:8]}"
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("archived", ensemble=1, write_quorum=1, ack_quorum=1, roll_records=10,
                               tier=TierPolicy(uri=f"file://{tmp_path}/tier", offload_after_ms=0, delete_lag_ms=0))
    server = serve(cluster, namespace, "--admin-port", "0")
    await asyncio.to_thread(librdkafka_produce, server.bootstrap, "archived", expected_records("tier", RECORDS))

    async def offloaded() -> dict[tuple[str, str], float] | None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
                session.get(f"{server.admin}/metrics") as response:
            text = await response.text()
        found = {(sample.name, sample.labels.get("stream", "")): sample.value
                 for family in text_string_to_metric_families(text) for sample in family.samples
                 if sample.name.startswith("dlog_tier_")}
        return found if found.get(("dlog_tier_bookie_copies_deleted_total", "archived"), 0) >= 1 else None

    tier = await eventually(offloaded, timeout_s=60)
    assert tier[("dlog_tier_offloaded_segments_total", "archived")] >= 1
    assert tier[("dlog_tier_offloaded_bytes_total", "archived")] > 0
    assert tier[("dlog_tier_offload_failures_total", "archived")] == 0
    assert list((tmp_path / "tier" / namespace / "archived").glob("segment=*/*.parquet"))
    assert len(await asyncio.to_thread(librdkafka_read, server.bootstrap, "archived", RECORDS)) == RECORDS
    assert server.stop() == 0
