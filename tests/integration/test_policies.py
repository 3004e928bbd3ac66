"""Policies run by themselves (issue 23, item 1): a Kafka user sets a retention age and expects it
enforced without running `dlog retention apply`. `dlog standalone` applies every stream's
retention on its schedule; two runners on one stream never both run it (the runner claim), and
when the claiming runner's session ends another takes over."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from dlog import Namespace
from dlog.core.policies import PolicyLimits
from dlog.policies import PolicyRunner
from tests.helpers import dlog_runner, eventually
from tests.integration.test_standalone import start_standalone, stop_standalone
from dlog_tools.cluster import LocalCluster, free_port

pytestmark = pytest.mark.timeout(180)
FAST = PolicyLimits(interval_min_ms=100, interval_max_ms=1_000, backoff_max_ms=5_000, list_interval_ms=100)


def test_standalone_enforces_a_retention_age_by_itself(tmp_path):
    process, zk, _ = start_standalone(tmp_path / "sa", free_port(), 3, "--policy-check-interval", "2s")
    try:
        run = dlog_runner(zk, "/bookkeeper")
        run("stream", "create", "clicks")
        for start in range(0, 50, 10):  # five runs: five completed segments of ten records
            run("write", "clicks", stdin="".join(f"click {index}\n" for index in range(start, start + 10)))

        def info() -> dict:
            return json.loads(run("stream", "info", "clicks", "--json").stdout)

        assert info()["first_position"] == 0
        run("stream", "alter", "clicks", "--retention-age", "1s")  # as a Kafka user alters a topic
        # nobody applies retention: the standalone does, keeping the last completed segment (L5)
        truncated = asyncio.run(eventually(lambda: info()["first_position"] == 40, 30, interval_s=0.5))
        assert truncated
        assert run("read", "clicks").stdout.splitlines() == [f"click {index}" for index in range(40, 50)]
    finally:
        assert stop_standalone(process) == 0


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("policies"), bookies=3, zk_root=f"/t-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server)
    cluster.start()
    yield cluster
    cluster.stop()


def connect(cluster, namespace: str) -> Namespace:
    return Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root)


async def test_one_runner_per_stream_and_another_takes_over_when_it_ends(cluster):
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("s", roll_records=5, retention_bytes=1)
        async with ns.open_writer("s") as writer:
            for index in range(30):
                await writer.write(b"%d" % index)
        first = connect(cluster, namespace)
        second = connect(cluster, namespace)
        await first.start()
        await second.start()
        one = PolicyRunner(first, limits=FAST, runner_id="one")
        two = PolicyRunner(second, limits=FAST, runner_id="two")
        await one.run_round()
        await two.run_round()
        assert (one.stats.runs, one.stats.segments_removed) == (1, 5)  # six segments, the last kept
        assert (two.stats.runs, two.stats.held_elsewhere) == (0, 1)
        assert (await ns.position_bounds("s"))[0] == 25

        await first.close()  # its session, and with it the claim, ends
        async with ns.open_writer("s") as writer:
            for index in range(30, 40):
                await writer.write(b"%d" % index)

        async def second_took_over() -> bool:
            await two.run_round()
            return two.stats.runs >= 1 and (await ns.position_bounds("s"))[0] == 35

        await eventually(second_took_over, 20, interval_s=0.2)
        await second.close()


async def test_a_failing_stream_backs_off_and_the_others_go_on(cluster):
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("good", roll_records=5, retention_bytes=1)
        await ns.create_stream("bad", roll_records=5, retention_bytes=1)
        for name in ("good", "bad"):
            async with ns.open_writer(name) as writer:
                for index in range(15):
                    await writer.write(b"%d" % index)
        await ns.zk.set(ns.store.inner.segments_path("bad"), b"not json")  # the list cannot be read
        runner = PolicyRunner(ns, limits=FAST)
        await runner.run_round()
        assert runner.stats.failures == 1 and runner.stats.last_removed == {"good": 2}
        assert runner.schedule.due(ns.clock.wall_ms()) == []  # "bad" waits its back-off
