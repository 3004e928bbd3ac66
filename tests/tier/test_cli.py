"""The operator's side of the tier (issue 24): `dlog stream create|alter` and `dlog tier set` with
the tier options, `dlog tier status`, `dlog offload`, `dlog tier daemon`, the policy runner
offloading by itself, and the status page's tier view; all against a real cluster."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from bookkeeper.clock import monotonic_s
from dlog.core.policies import PolicyLimits
from dlog.policies import PolicyRunner
from dlog.segments.metadata import TierPolicy
from dlog_tools.ui import Collector, UiOptions, render_page
from tests.helpers import dlog_runner, one_error_line
from tests.tier.conftest import connect

pytestmark = pytest.mark.timeout(240)
DEADLINE_S = 60.0


def fresh() -> str:
    return f"ns{uuid.uuid4().hex[:6]}"


def write(run, name: str, *batches: list[str]) -> None:
    for batch in batches:  # each `dlog write` run seals its segment when it ends
        run("write", name, stdin="".join(f"{value}\n" for value in batch))


def status(run, name: str) -> dict:
    return json.loads(run("tier", "status", name, "--json").stdout)["streams"][0]


def read_values(run, name: str) -> list[str]:
    return [json.loads(line)["value"] for line in run("read", name, "--json").stdout.splitlines()]


def test_a_stream_created_with_a_tier_is_offloaded_by_dlog_offload_and_reads_back_whole(cluster, tmp_path):
    run = dlog_runner(cluster.zk_address, cluster.zk_root, fresh())
    tier = f"file://{tmp_path}/tier"
    created = json.loads(run("stream", "create", "orders", "--tier", tier, "--offload-after", "-1",
                             "--offload-delete-lag", "0", "--tier-retention-age", "30d", "--json").stdout)
    assert created["tier"] == {"uri": tier, "offload_after_ms": -1, "delete_lag_ms": 0,
                               "retention_age_ms": 30 * 86_400_000}
    write(run, "orders", [f"a{i}" for i in range(50)], [f"b{i}" for i in range(70)], ["c0"])

    before = status(run, "orders")
    assert before["placement"]["bookies"]["segments"] == 3 and before["placement"]["bookies"]["records"] == 121
    assert before["placement"]["tier"]["segments"] == 0 and before["last_run"] is None
    assert before["sources"] == {"uri": "stream", "offload_after_ms": "stream", "keep_bytes": "default",
                                 "delete_lag_ms": "stream", "retention_age_ms": "stream", "retention_bytes": "default"}
    assert before["due_for_offload"] == 0  # -1: only when asked

    dry = json.loads(run("offload", "orders", "--dry-run", "--json").stdout)
    assert dry["dry_run"] and [p["records"] for p in dry["planned"]] == [50, 70, 1] and dry["offloaded"] == []
    assert status(run, "orders")["placement"]["bookies"]["segments"] == 3  # a dry run changes nothing
    text = run("offload", "orders", "--dry-run").stdout
    assert text.startswith("would offload 3 segments of orders (121 records, ")

    done = json.loads(run("offload", "orders", "--json").stdout)
    assert [o["records"] for o in done["offloaded"]] == [50, 70, 1] and done["error"] == ""
    assert len(done["bookie_copies_deleted"]) == 3  # the delete lag is 0
    assert all(o["uri"].startswith(f"{tier}/") and o["uri"].endswith(".parquet") for o in done["offloaded"])

    after = status(run, "orders")
    assert after["placement"]["tier"] == {"segments": 3, "records": 121, "bytes": 0,
                                          "tier_bytes": sum(o["file_bytes"] for o in done["offloaded"])}
    assert after["placement"]["bookies"]["segments"] == 0 and after["placement"]["both"]["segments"] == 0
    assert after["last_run"]["error"] == "" and after["last_run"]["offloaded"] == 3
    assert read_values(run, "orders") == [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(70)] + ["c0"]

    shown = run("tier", "status", "orders").stdout
    assert f"tier              {tier} (stream)" in shown
    assert "on the tier only  3 segments, 121 records" in shown and "last run          ok at " in shown
    again = run("offload", "orders").stdout  # nothing left to do
    assert again.startswith(f"offloaded 0 segments of orders to {tier}")


def test_a_stream_without_its_own_tier_inherits_the_namespace_default(cluster, tmp_path):
    namespace = fresh()
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    tier = f"file://{tmp_path}/default-tier"
    run("stream", "create", "clicks")
    set_default = run("tier", "set", "--namespace-default", "--tier", tier, "--offload-delete-lag", "-1")
    assert set_default.stdout.splitlines() == [f"namespace {namespace} default: tier uri inherited -> {tier}",
                                               f"namespace {namespace} default: tier delete_lag inherited -> never"]
    write(run, "clicks", ["x", "y"], ["z"])
    inherited = status(run, "clicks")
    assert inherited["policy"]["uri"] == tier and inherited["sources"]["uri"] == "namespace"
    assert inherited["sources"]["delete_lag_ms"] == "namespace" and inherited["sources"]["keep_bytes"] == "default"
    assert json.loads(run("offload", "clicks", "--json").stdout)["bookie_copies_deleted"] == []  # never
    kept = status(run, "clicks")["placement"]
    assert kept["both"]["segments"] == 2 and kept["both"]["records"] == 3 and kept["both"]["bytes"] > 0

    changed = run("stream", "alter", "clicks", "--offload-delete-lag", "0").stdout
    assert changed.strip() == "clicks: tier delete_lag inherited -> 0 (at once)"
    own = status(run, "clicks")
    assert own["sources"]["delete_lag_ms"] == "stream" and own["sources"]["uri"] == "namespace"
    assert own["bookie_copies_due"] == 2
    assert len(json.loads(run("offload", "clicks", "--json").stdout)["bookie_copies_deleted"]) == 2
    assert read_values(run, "clicks") == ["x", "y", "z"]

    overview = json.loads(run("tier", "status", "--json").stdout)
    assert overview["namespace_default"] == {"uri": tier, "delete_lag_ms": -1}
    assert [item["stream"] for item in overview["streams"]] == ["clicks"]
    table = run("tier", "status").stdout
    assert table.startswith(f"namespace {namespace} default: uri {tier}, delete_lag never") and "clicks" in table

    own_tier = json.loads(run("tier", "set", "clicks", "--tier", f"file://{tmp_path}/own", "--json").stdout)
    assert own_tier["tier"] == {"uri": f"file://{tmp_path}/own", "delete_lag_ms": 0}


@pytest.mark.parametrize("arguments, words", [
    (("stream", "create", "bad", "--tier", "ftp://host/x"), "tier URI 'ftp://host/x' has scheme 'ftp'"),
    (("stream", "create", "bad", "--tier", "file://relative/x"), "is not an absolute local path"),
    (("stream", "alter", "s", "--offload-after", "soon"), "bad duration 'soon'"),
    (("stream", "alter", "s", "--offload-delete-lag", "-2"), "bad duration '-2'"),
    (("tier", "set", "s", "--offload-keep-size", "lots"), "bad size 'lots'"),
    (("tier", "set", "s", "--tier-retention-age", "-1"), "bad duration '-1'"),
    (("tier", "set", "--namespace-default", "--tier", "s3://"), "names no bucket"),
])
def test_bad_tier_options_are_one_line_exit_2_and_change_nothing(cluster, arguments, words):
    run = dlog_runner(cluster.zk_address, cluster.zk_root, fresh())
    run("stream", "create", "s")
    result = run(*arguments, ok=False)
    assert result.returncode == 2 and words in one_error_line(result), result.stderr
    assert json.loads(run("stream", "info", "s", "--json").stdout)["config"]["tier"] == {}
    assert json.loads(run("tier", "status", "--json").stdout)["namespace_default"] == {}


def test_refusals_of_the_tier_commands_are_one_line(cluster):
    run = dlog_runner(cluster.zk_address, cluster.zk_root, fresh())
    run("stream", "create", "plain")
    cases = [
        (("offload", "nowhere"), 1, "stream 'nowhere'"),
        (("tier", "status", "nowhere"), 1, "stream 'nowhere'"),
        (("tier", "set", "nowhere", "--tier", "file:///tmp/t"), 1, "stream 'nowhere'"),
        (("offload", "plain"), 1, "stream 'plain' has no tier: give it one (dlog tier set plain --tier URI"),
        (("tier", "set", "plain"), 1, "nothing to set: give --tier, --offload-after"),
        (("tier", "set", "--tier", "file:///tmp/t"), 1, "give a stream NAME or --namespace-default"),
        (("tier", "set", "plain", "--namespace-default", "--tier", "file:///tmp/t"), 1, "give a stream NAME or"),
    ]
    for arguments, code, words in cases:
        result = run(*arguments, ok=False)
        line = one_error_line(result)
        assert result.returncode == code and words in line, (arguments, result.stderr)
    assert json.loads(run("stream", "info", "plain", "--json").stdout)["config"]["tier"] == {}


def test_a_bad_tier_table_in_client_toml_is_one_line(cluster, tmp_path):
    config = tmp_path / "client.toml"
    config.write_text('[tier]\ns3_endpoint = "127.0.0.1:1"\ns3_bucket = "x"\n')
    run = dlog_runner(cluster.zk_address, cluster.zk_root, fresh(), env={"DLOG_CONFIG": str(config)})
    line = one_error_line(run("stream", "list", ok=False))
    assert line == (f"dlog: unknown setting s3_bucket in [tier] of {config}; known: s3_endpoint, s3_region, "
                    "s3_access_key, s3_secret_key")


async def wait_for(predicate, what: str):
    deadline = monotonic_s() + DEADLINE_S
    while True:
        found = await predicate()
        if found:
            return found
        assert monotonic_s() < deadline, f"waited {DEADLINE_S} s for {what}"
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def running(ns):
    """A policy runner with short intervals, running until the block ends (and it stopped cleanly)."""
    runner = PolicyRunner(ns, limits=PolicyLimits(interval_min_ms=100, interval_max_ms=500, list_interval_ms=200))
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runner.run(stop))
    try:
        yield runner
    finally:
        stop.set()
        await task  # raises what the runner raised: a tier error must never get here


async def write_sealed(ns, name: str, segments: int, per_segment: int) -> None:
    for number in range(segments):
        async with ns.open_writer(name) as writer:
            for index in range(per_segment):
                writer.write_nowait(f"{number}-{index}".encode())
            await writer.flush()


async def test_the_policy_runner_offloads_by_itself_once_the_offload_age_passes(cluster, tmp_path):
    async with connect(cluster) as ns:
        await ns.create_stream("events", tier=TierPolicy(uri=f"file://{tmp_path}/t", offload_after_ms=300,
                                                         delete_lag_ms=0))
        await ns.create_stream("untiered")
        await write_sealed(ns, "events", 3, 40)
        await write_sealed(ns, "untiered", 1, 5)
        async with running(ns) as runner:
            async def offloaded():
                listing = await ns.store.segments("events")
                return all(s.tier is not None and not s.tier.on_bookies for s in listing.segments)

            await wait_for(offloaded, "the runner to offload every segment and delete the bookie copies")
        assert runner.stats.tier.total.offloaded_segments == 3 and runner.stats.tier.total.offload_failures == 0
        assert runner.stats.tier.total.bookie_copies_deleted == 3
        assert set(runner.stats.tier.streams) == {"events"}  # the stream without a tier is left alone
        assert all(s.tier is None for s in (await ns.store.segments("untiered")).segments)
        values = []
        async with ns.open_reader("events", "earliest", follow=False) as reader:
            async for record in reader:
                values.append(record.value)
        assert values == [f"{n}-{i}".encode() for n in range(3) for i in range(40)]


async def test_a_failing_tier_backs_off_never_stops_the_runner_and_shows_on_the_status_page(cluster, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the tier's directory would be")
    async with connect(cluster) as ns:
        await ns.create_stream("broken", tier=TierPolicy(uri=f"file://{blocker}/tier", offload_after_ms=0))
        await ns.create_stream("fine", tier=TierPolicy(uri=f"file://{tmp_path}/fine", offload_after_ms=0))
        await write_sealed(ns, "broken", 2, 10)
        await write_sealed(ns, "fine", 2, 10)
        async with running(ns) as runner:
            async def failed_twice():
                found = await ns.store.tier_status("broken")
                return found if found and found["failures"] >= 2 else None

            failing = await wait_for(failed_twice, "two failed offload runs of the broken stream")

            async def fine_offloaded():
                return all(s.tier is not None for s in (await ns.store.segments("fine")).segments)

            await wait_for(fine_offloaded, "the other stream offloaded meanwhile")
        assert "cannot write" in failing["error"] and failing["last_success_ms"] == 0
        assert runner.stats.tier.streams["broken"].offload_failures >= 2
        assert all(s.tier is None and s.offload_attempt for s in (await ns.store.segments("broken")).segments[:1])
        assert runner.stats.failures >= 2 and runner.stats.tier.streams["fine"].offloaded_segments == 2

        collector = Collector(UiOptions(cluster.zk_address, cluster.zk_root, namespaces=(ns.name,)))
        try:
            snapshot = await collector.snapshot()
        finally:
            await collector.close()
        streams = {s["name"]: s for n in snapshot["namespaces"] if n["name"] == ns.name for s in n["streams"]}
        assert streams["broken"]["tier"]["last_run"]["error"] == failing["error"] or \
            "cannot write" in streams["broken"]["tier"]["last_run"]["error"]
        assert streams["fine"]["tier"]["placement"]["both"]["segments"] == 2
        assert [s["tier"] for s in streams["fine"]["segments"]] == ["both", "both"]
        problems = snapshot["health"]["problems"]
        assert any(p.startswith(f"stream {ns.name}/broken: the last offload failed (") for p in problems), problems
        assert not any("fine" in p for p in problems), problems
        page = render_page(snapshot, query=ns.name)
        assert "offload failing" in page and "cannot write" in page
        assert f"tier file://{tmp_path}/fine · bookies only: 0 segments" in page
        assert "both: 2 segments, 20 records" in page


async def test_the_status_page_does_not_call_an_offloaded_segment_without_its_ledger_damaged(cluster, tmp_path):
    async with connect(cluster) as ns:
        await ns.create_stream("old", tier=TierPolicy(uri=f"file://{tmp_path}/t", delete_lag_ms=0))
        await write_sealed(ns, "old", 2, 10)
        from dlog import Offloader

        report = await Offloader(ns).run("old", now=True)
        assert len(report.bookie_copies_deleted) == 2
        collector = Collector(UiOptions(cluster.zk_address, cluster.zk_root, namespaces=(ns.name,)))
        try:
            snapshot = await collector.snapshot()
        finally:
            await collector.close()
    stream = next(s for n in snapshot["namespaces"] if n["name"] == ns.name for s in n["streams"])
    assert [(s["tier"], s["damaged"]) for s in stream["segments"]] == [("tier", False), ("tier", False)]
    assert stream["tier"]["placement"]["tier"]["records"] == 20
    assert not any(ns.name in problem for problem in snapshot["health"]["problems"])
    page = render_page(snapshot, query=ns.name)
    assert "on tier" in page and "tier only: 2 segments, 20 records" in page and "segment damaged" not in page


def test_the_daemon_offloads_due_segments_and_stops_cleanly_on_sigterm(cluster, tmp_path):
    namespace = fresh()
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    run("stream", "create", "logs", "--tier", f"file://{tmp_path}/t", "--offload-after", "0",
        "--offload-delete-lag", "0")
    write(run, "logs", ["one", "two"], ["three"])
    daemon = subprocess.Popen(
        [sys.executable, "-m", "dlog_tools.cli", "tier", "daemon", "--interval", "1s", "--zk", cluster.zk_address,
         "--zk-root", cluster.zk_root, "--namespace", namespace],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + DEADLINE_S
        while status(run, "logs")["placement"]["tier"]["segments"] != 2:
            assert daemon.poll() is None, daemon.communicate()
            assert time.monotonic() < deadline, "the daemon did not offload within the deadline"
            time.sleep(0.2)
        write(run, "logs", ["four"])  # a segment completed while it runs is offloaded too
        while status(run, "logs")["placement"]["tier"]["segments"] != 3:
            assert time.monotonic() < deadline, "the daemon did not offload the new segment within the deadline"
            time.sleep(0.2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        stdout, stderr = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith(f"dlog tier daemon offloading namespace {namespace} (each stream at least every 1s)")
    assert lines[-1].startswith("dlog tier daemon stopped: offloaded 3 segments (") and "0 failed runs" in lines[-1]
    assert "Traceback" not in stderr and "stream 'logs': offloaded" in stderr, stderr
    assert read_values(run, "logs") == ["one", "two", "three", "four"]
