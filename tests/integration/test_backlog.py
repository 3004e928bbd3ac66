"""Backlog limits on a real cluster: an abandoned subscription under each policy (hold refuses
writers and keeps its records, then clears once it commits past; evict lets retention remove them
and its next read fails until told to skip; none does nothing), expiry removes an inactive
subscription, bad option values get one clear line. One 1-bookie cluster for the file."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from click.testing import CliRunner

from dlog import Namespace
from dlog.core.errors import BacklogExceededError, SubscriptionEvictedError
from dlog.offsets import Offset
from dlog.policies import PolicyRunner
from dlog.server.metrics import backlog_metrics
from dlog_tools.cli.app import main
from dlog_tools.cluster import LocalCluster
from tests.helpers import dlog_runner, eventually

ONE_COPY = {"ensemble": 1, "write_quorum": 1, "ack_quorum": 1}


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("backlog"), bookies=1, zk_root=f"/t-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
async def ns(cluster):
    namespace = Namespace(cluster.zk_address, f"ns{uuid.uuid4().hex[:6]}", bookkeeper_root=cluster.zk_root)
    await namespace.start()
    yield namespace
    await namespace.close()


async def write_segment(ns, name: str, label: str, records: int = 5) -> list[Offset]:
    """One completed segment (a writer's close seals it); the offsets written."""
    async with ns.open_writer(name) as writer:
        offsets = [await writer.write(f"{label}-{index}".encode()) for index in range(records)]
    return offsets


def dlog(cluster: LocalCluster, namespace: str, *arguments: str) -> tuple[int, str, str]:
    """`dlog ARGUMENTS` in this process (a subprocess costs seconds here): exit code, stdout, stderr."""
    result = CliRunner().invoke(main, [*arguments, "--zk", cluster.zk_address, "--zk-root", cluster.zk_root,
                                       "--namespace", namespace])
    return result.exit_code, result.stdout, result.stderr


async def values(ns, name: str, **options) -> list[bytes]:
    async with ns.open_reader(name, "earliest", follow=False, **options) as reader:
        return [record.value async for record in reader]


async def test_hold_refuses_writers_and_keeps_the_backlog_until_the_subscription_commits_past(ns, cluster):
    await ns.create_stream("held", **ONE_COPY, retention_bytes=1, backlog_bytes=1, backlog_policy="hold")
    await ns.alter_stream("held", retention_keeps_unconsumed=False)  # hold keeps the backlog by itself
    first = await write_segment(ns, "held", "a")
    await ns.commit_subscription("held", "abandoned", first[0])
    run = dlog_runner(cluster.zk_address, cluster.zk_root, ns.name)  # a process: `dlog write` reads fd 0
    refused_cli = await asyncio.to_thread(run, "write", "held", stdin="refused by the command too\n", ok=False)
    assert refused_cli.returncode != 0 and "Traceback" not in refused_cli.stderr, refused_cli.stderr
    assert refused_cli.stderr.startswith("dlog: stream 'held' is over its backlog limit: subscription 'abandoned'")
    assert len(refused_cli.stderr.strip().splitlines()) == 1, refused_cli.stderr
    async with ns.open_writer("held") as writer:
        with pytest.raises(BacklogExceededError, match="subscription 'abandoned'") as refused:
            await writer.write(b"refused")
        assert refused.value.code == 336
        with pytest.raises(BacklogExceededError):
            writer.offer(b"refused too")
        assert [s.sequence for s in await ns.apply_retention("held")] == []  # its records are kept
        await ns.commit_subscription("held", "abandoned", Offset(writer.segment.ledger_id, 0))  # past it all

        async def accepted() -> bool:
            try:
                await writer.write(b"after")
            except BacklogExceededError:
                return False  # this refused write checked again: the next one sees the commit
            return True

        assert await eventually(accepted, timeout_s=10)
    assert (await values(ns, "held"))[-1] == b"after"
    assert b"refused" not in await values(ns, "held")


async def test_evict_lets_retention_go_and_the_next_read_fails_until_told_to_skip(ns, cluster):
    await ns.create_stream("evicting", **ONE_COPY, retention_bytes=1, backlog_bytes=1, backlog_policy="evict")
    first = await write_segment(ns, "evicting", "a")
    await ns.commit_subscription("evicting", "abandoned", first[0])
    await write_segment(ns, "evicting", "b")  # writers are not refused under evict
    await write_segment(ns, "evicting", "c")
    removed = await ns.apply_retention("evicting")
    assert [s.sequence for s in removed] == [1, 2]  # the abandoned subscription's records went too
    with pytest.raises(SubscriptionEvictedError, match="'abandoned'.*evicted") as failed:
        await ns.open_reader("evicting", subscription="abandoned")
    assert failed.value.code == 337
    skipped = await values(ns, "evicting", subscription="abandoned", skip_evicted=True)
    assert skipped == [f"c-{index}".encode() for index in range(5)]  # from the earliest record kept

    code, _, stderr = await asyncio.to_thread(dlog, cluster, ns.name, "read", "evicting", "--subscription", "abandoned")
    assert code != 0 and "evicted" in stderr and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    code, stdout, stderr = await asyncio.to_thread(dlog, cluster, ns.name, "read", "evicting", "--subscription",
                                                   "abandoned", "--skip-evicted", "--max", "2")
    assert code == 0 and stdout.splitlines() == ["c-0", "c-1"], stderr
    assert await ns.subscription_start("evicting", "abandoned") is not None  # its commit cleared the mark


async def test_none_policy_neither_refuses_nor_evicts(ns):
    await ns.create_stream("loose", **ONE_COPY, retention_bytes=1, backlog_bytes=1, backlog_policy="none")
    first = await write_segment(ns, "loose", "a")
    await ns.commit_subscription("loose", "abandoned", first[0])
    await write_segment(ns, "loose", "b")
    await write_segment(ns, "loose", "c")  # accepted though the backlog is over its limit
    assert await ns.apply_retention("loose") == []  # retention keeps what it has not read, as ever
    assert await ns.subscription_start("loose", "abandoned") == first[0]  # not evicted
    assert [b.level for b in await ns.backlogs("loose")] == ["over"]
    runner = PolicyRunner(ns, offload=False)  # as a serving-tier server or `dlog standalone` runs it
    await runner.run_round()
    fraction = runner.stats.backlogs[("loose", "abandoned")]
    assert fraction > 1.0
    exported = {sample.labels["subscription"]: sample.value for family in backlog_metrics(runner.stats)
                for sample in family.samples if family.name == "dlog_subscription_backlog_fraction"}
    assert exported == {"abandoned": fraction}


async def test_expiry_removes_a_subscription_inactive_longer_than_the_setting(ns):
    await ns.create_stream("expiring", **ONE_COPY, subscription_expiry_ms=60_000)
    first = await write_segment(ns, "expiring", "a", records=1)
    await ns.commit_subscription("expiring", "idle", first[0])
    now_ms = ns.clock.wall_ms()
    await ns.apply_retention("expiring", now_ms=now_ms + 30_000)
    assert set(await ns.subscriptions("expiring")) == {"idle"}  # inactive for less than the expiry
    await ns.apply_retention("expiring", now_ms=now_ms + 61_000)
    assert await ns.subscriptions("expiring") == {}


@pytest.mark.parametrize("arguments, words", [
    (("stream", "create", "s", "--backlog-policy", "drop"), "'drop' is not one of 'hold', 'evict', 'none'"),
    (("stream", "create", "s", "--backlog-size", "12 parsecs"), "bad size '12 parsecs'"),
    (("stream", "alter", "kept", "--backlog-age", "soon"), "bad duration 'soon'"),
    (("stream", "alter", "kept", "--subscription-expiry", "5"), "bad duration '5'"),
])
def test_bad_backlog_options_get_one_clear_line_and_change_nothing(cluster, arguments, words):
    assert dlog(cluster, "badopts", "stream", "create", "kept", "--backlog-size", "1MiB", "--if-not-exists")[0] == 0
    before = json.loads(dlog(cluster, "badopts", "stream", "info", "kept", "--json")[1])["config"]
    assert before["backlog_bytes"] == 2**20 and before["backlog_policy"] == "hold"
    code, _, stderr = dlog(cluster, "badopts", *arguments)
    assert code != 0 and words in stderr and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    assert json.loads(dlog(cluster, "badopts", "stream", "info", "kept", "--json")[1])["config"] == before
    assert "s" not in json.loads(dlog(cluster, "badopts", "stream", "list", "--json")[1])["streams"]


async def test_the_status_page_warns_at_80_percent_and_names_a_subscription_over_its_limit(cluster):
    from dlog_tools.ui import Collector, UiOptions, health_summary, render_page

    root = f"{cluster.zk_root}-dlog"  # a namespace root of its own: the page reads every namespace under it
    async with Namespace(cluster.zk_address, "watched", bookkeeper_root=cluster.zk_root, root=root) as ns:
        await ns.create_stream("near", **ONE_COPY, backlog_policy="none")
        first = await write_segment(ns, "near", "a")
        second = await write_segment(ns, "near", "b")
        for name in ("near-limit", "over-limit"):
            await ns.commit_subscription("near", name, first[0])
        await ns.commit_subscription("near", "caught-up", Offset(second[-1].ledger_id, second[-1].entry_id + 1))
        unconsumed = {b.subscription: b.bytes for b in await ns.backlogs("near")}["near-limit"]
        await ns.alter_stream("near", backlog_bytes=round(unconsumed / 0.9))  # 90%: a warning, not over
        collector = Collector(UiOptions(cluster.zk_address, cluster.zk_root, root))
        try:
            warned = await collector.snapshot()
            await ns.alter_stream("near", backlog_bytes=unconsumed // 2)
            collector._last = None  # the next snapshot reads again
            over = await collector.snapshot()
        finally:
            await collector.close()

    def subscriptions(result):
        return {sub["name"]: sub["backlog"] for sub in result["namespaces"][0]["streams"][0]["subscriptions"]}

    near = subscriptions(warned)
    assert near["near-limit"]["level"] == "warning" and near["near-limit"]["note"].startswith("is at 90% of its")
    assert (near["caught-up"]["level"], near["caught-up"]["bytes"], near["caught-up"]["label"]) == ("ok", 0, "")
    assert "backlog 90%" in render_page(warned)
    assert not [p for p in health_summary(warned)["problems"] if "backlog" in p]  # a warning, not a problem
    assert subscriptions(over)["over-limit"]["level"] == "over"
    problems = health_summary(over)["problems"]
    assert any("subscription over-limit is over its backlog limit" in p for p in problems), problems
    assert "over backlog limit" in render_page(over)
