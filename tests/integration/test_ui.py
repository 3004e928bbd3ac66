"""The status page shows real bookies, segment timelines and subscription lag: its JSON API against
real bookie processes and ZooKeeper, and the page itself rendered by a real headless chromium."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bookkeeper.autorecovery.policy import Missing, Reason
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.clock import wall_ms
from bookkeeper.meta import layout
from dlog import Namespace
from tests.helpers import readme_blocks
from dlog_tools.cli.standalone import UI_PORT_DEFAULT
from dlog_tools.cluster import LineReader, LocalCluster, free_port, load_state
from dlog_tools.ui import (
    HTTP_TIMEOUT_S,
    NO_WRITER_NOTE,
    Collector,
    RateTracker,
    UiOptions,
    bookie_directories,
    describe_writer,
    filter_namespaces,
    health_summary,
    make_app,
    parse_metrics,
    render_page,
    subscription_lag,
    truncation_point,
)

HOSTILE_NAME = "<img src=x onerror=alert(1)>"  # a ZooKeeper node name the page must show as text
# a plain headless chromium: no virtual time budget, no waiting for scripts (the served HTML holds
# the data); --no-sandbox only because the tests may run as root, where the sandbox cannot start
CHROMIUM_FLAGS = ["--headless", "--no-sandbox"]
CHROMIUM_TIMEOUT_S = 90.0
WINDOW = (1300, 1000)


# ------------------------------------------------------------------------------ pure parts


def segment(sequence: int, ledger: int, records: int | None, entries: int, state: str = "completed",
            min_active_entry: int = 0) -> dict[str, Any]:
    return {"sequence": sequence, "ledger": ledger, "state": state, "first_entry": 0,
            "last_entry": None if records is None else entries - 1, "records": records,
            "min_active_entry": min_active_entry, "min_active_slot": 0}


STREAM = [segment(1, 10, 300, 6, "truncated"), segment(2, 11, 300, 6, min_active_entry=1),
          segment(3, 12, 300, 6), segment(4, 13, 100, 2, "in_progress")]


@pytest.mark.parametrize("offset, lag, position, note", [
    ({"ledger": 12, "entry": 2, "slot": 0}, 200 + 100, 2 / 6, None),  # rest of #3, all of #4
    ({"ledger": 12, "entry": 2, "slot": 7}, 193 + 100, 107 / 300, None),  # the slot counts too
    ({"ledger": 13, "entry": 1, "slot": 49}, 1, 0.99, None),  # the last record is still to read
    ({"ledger": 13, "entry": 2, "slot": 0}, 0, 1.0, None),  # read everything
    ({"ledger": 11, "entry": 0, "slot": 0}, 700, 0.0, None),
    ({"ledger": 10, "entry": 3, "slot": 0}, 700, None, "behind the truncation point"),
    ({"ledger": 99, "entry": 0, "slot": 0}, 700, None, "behind the truncation point"),
])
def test_lag_counts_records_after_the_committed_offset(offset, lag, position, note):
    result = subscription_lag(STREAM, offset)
    assert (result["lag_records"], result["note"], result["lag_known"]) == (lag, note, True)
    if position is None:
        assert result["position"] is None
    else:
        assert result["position"] == pytest.approx(position)


def test_lag_is_a_lower_bound_when_a_segment_has_unknown_records():
    stream = [*STREAM[:3], segment(4, 13, None, 0, "in_progress")]
    result = subscription_lag(stream, {"ledger": 12, "entry": 3, "slot": 0})
    assert (result["lag_records"], result["lag_known"]) == (150, False)


def test_truncation_point_is_the_first_readable_offset():
    assert truncation_point(STREAM) == {"offset": "11:1:0", "sequence": 2, "position": pytest.approx(1 / 6)}
    assert truncation_point(STREAM[2:]) is None  # nothing was ever truncated
    assert truncation_point([STREAM[0], segment(2, 11, 5, 1)])["offset"] == "11:0:0"
    assert truncation_point([STREAM[0]])["offset"] is None  # everything is truncated


def test_metrics_parsing_and_add_rate():
    text = ("# TYPE dlog_bookie_add_entries_total counter\ndlog_bookie_add_entries_total 120.0\n"
            "dlog_bookie_add_entries_created 1.7e9\ndlog_bookie_disk_used_ratio 0.705\n"
            'dlog_bookie_journal_fsync_seconds_bucket{le="0.001"} 3.0\ndlog_bookie_read_only 0.0\n')
    assert parse_metrics(text) == {"dlog_bookie_add_entries_total": 120.0,
                                   "dlog_bookie_disk_used_ratio": 0.705, "dlog_bookie_read_only": 0.0}
    rates = RateTracker()
    assert rates.rate("b1", 100, now_s=10.0) is None  # one scrape gives no rate
    assert rates.rate("b1", 160, now_s=12.0) == 30.0
    assert rates.rate("b1", 10, now_s=14.0) == 5.0  # the bookie restarted: its counter began at 0


def test_health_names_each_problem_and_counts_them():
    healthy = {"errors": [], "bookies": [{"id": "a:1", "state": "writable"}],
               "namespaces": [{"name": "shop", "error": None, "streams": [
                   {"name": "orders", "error": None, "segments": [{**STREAM[1], "damaged": False}]}]}],
               "autorecovery": {"underreplicated": 0}}
    assert health_summary(healthy) == {"ok": True, "problems": []}
    sick = {**healthy, "bookies": [{"id": "a:1", "state": "down"}], "autorecovery": {"underreplicated": 2},
            "namespaces": [{"name": "shop", "error": None, "streams": [{"name": "orders", "error": None, "segments": [
                {**STREAM[1], "damaged": True}, {**STREAM[3], "unreadable": True}],
                "subscriptions": [{"name": "billing", "losses": ["segment 1 was removed"]}]}]}]}
    assert health_summary(sick) == {"ok": False, "problems": [
        "bookie a:1 is down (it joined this cluster but is not registered)", "stream shop/orders lost records: "
        "ledger 11 missing", "stream shop/orders: segment #4 cannot be read",
        "stream shop/orders: subscription billing will skip records it never read (segment 1 was removed)",
        "2 ledgers under-replicated"]}
    assert health_summary({"errors": ["ZooKeeper is unreachable"]})["problems"] == [
        "cannot read the cluster: ZooKeeper is unreachable"]


def test_bookie_directories_are_taken_only_as_the_bookie_says_them():
    about = ('{"directories": {"journal": {"path": "/d/journal", "bytes": 4096}, "index": {"path": 7, "bytes": 1},'
             ' "other": {"path": "/etc", "bytes": 1}}}')
    assert bookie_directories(about) == {"journal": {"path": "/d/journal", "bytes": 4096}}
    for text in ("not json", "[]", '{"directories": null}', '{"id": "a:1"}'):  # an older bookie says none
        assert bookie_directories(text) is None


def test_a_writer_lock_holder_is_shown_only_as_far_as_it_is_well_formed():
    assert describe_writer({"host": "h1", "pid": 42, "started_ms": 1_700_000_000_000, "extra": "x"}) == {
        "host": "h1", "pid": 42, "started_ms": 1_700_000_000_000}
    assert describe_writer({"host": 7, "pid": "42", "started_ms": True}) == {}  # a lock node says what it likes


def test_the_filter_keeps_streams_whose_name_or_namespace_path_matches():
    namespaces = [{"name": "shop", "streams": [{"name": "orders"}, {"name": "sales/eu/Clicks"}], "streams_omitted": 0},
                  {"name": "ads", "streams": [{"name": "clicks"}], "streams_omitted": 3}]
    assert filter_namespaces(namespaces, "  ") == (namespaces, 6)
    shown, count = filter_namespaces(namespaces, "CLICKS")
    assert count == 2 and [(ns["name"], [s["name"] for s in ns["streams"]]) for ns in shown] == [
        ("shop", ["sales/eu/Clicks"]), ("ads", ["clicks"])]
    assert filter_namespaces(namespaces, "shop/ord")[1] == 1 and filter_namespaces(namespaces, "nothing") == ([], 0)


# ------------------------------------------------------------------------------ a cluster to show


class FakeClock:
    """Each monotonic reading is 2 s after the last: every poll scrapes afresh, and rates need no
    sleeping. The wall clock is the machine's."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic_s(self) -> float:
        self.now_s += 2.0
        return self.now_s

    def wall_ms(self) -> int:
        return wall_ms()


def values(count: int, start: int = 0) -> list[bytes]:
    return [f'{{"n": {index}}}'.encode() for index in range(start, start + count)]


def namespace(cluster: LocalCluster) -> Namespace:
    return Namespace(cluster.zk_address, "shop", bookkeeper_root=cluster.zk_root,
                     root=f"{cluster.zk_root}-dlog", add_timeout_s=3.0)


def options(cluster: LocalCluster) -> UiOptions:
    return UiOptions(cluster.zk_address, cluster.zk_root, f"{cluster.zk_root}-dlog")


async def populate(ns: Namespace, zk: Any, cluster: LocalCluster) -> Any:
    """"orders": 4 segments of 50-record entries, the first truncated, two subscriptions;
    "sales/eu/clicks": one in-progress segment (the writer returned stays open); plus a namespace
    with a hostile name and a bookie that has a cookie but is not running."""
    await ns.create_stream("orders", ensemble=2, write_quorum=2, ack_quorum=2, roll_records=300)
    async with await ns.open_writer("orders") as writer:
        offsets = []
        for start in range(0, 1000, 50):
            offsets += list(await writer.write_batch(values(50, start)))
    await ns.truncate("orders", offsets[350])
    await ns.commit_subscription("orders", "billing", offsets[700])
    await ns.commit_subscription("orders", "audit", offsets[999])
    await ns.create_stream("sales/eu/clicks", ensemble=2, write_quorum=2, ack_quorum=2)
    clicks = await ns.open_writer("sales/eu/clicks")
    tail = list(await clicks.write_batch(values(25))) + list(await clicks.write_batch(values(25, 25)))
    await ns.commit_subscription("sales/eu/clicks", "dashboard", tail[25])
    await zk.ensure_path(f"{cluster.zk_root}-dlog/{HOSTILE_NAME}")
    await zk.create(f"{cluster.zk_root}/cookies/10.0.0.9:3181", b"{}")
    return clicks


async def poll_api(client: Any, ready: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """GET /api/cluster until `ready(answer)` holds; the last answer in the failure otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with client.get("/api/cluster") as response:
            assert response.status == 200
            answer = await response.json()
        if ready(answer) or time.monotonic() > deadline:
            assert ready(answer), answer
            return answer
        await asyncio.sleep(0.1)


async def poll_page(client: Any, ready: Any, path: str = "/", timeout_s: float = 60.0) -> str:
    """GET the page (HTML, as served: no script has run) until `ready(html)` holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with client.get(path) as response:
            assert response.status == 200 and response.content_type == "text/html"
            html = await response.text()
        if ready(html) or time.monotonic() > deadline:
            assert ready(html), html
            return html
        await asyncio.sleep(0.2)


def streams_of(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {stream["name"]: stream for ns in answer["namespaces"] for stream in ns["streams"]}


def tail_records(answer: dict[str, Any]) -> int | None:
    clicks = streams_of(answer).get("sales/eu/clicks")
    return clicks["segments"][-1]["records"] if clicks and clicks["segments"] else None


# ------------------------------------------------------------------------------ the JSON API


async def test_api_reports_bookies_segments_truncation_and_lag(cluster_factory, zk):
    cluster = cluster_factory(bookies=2)
    async with namespace(cluster) as ns:
        clicks = await populate(ns, zk, cluster)
        collector = Collector(options(cluster), clock=FakeClock())
        async with TestClient(TestServer(make_app(collector))) as client:
            first = await poll_api(client, lambda answer: tail_records(answer) == 50)
            assert first["errors"] == []
            bookies = {bookie["id"]: bookie for bookie in first["bookies"]}
            assert sorted(bookies) == sorted([b.address for b in cluster.bookies] + ["10.0.0.9:3181"])
            assert bookies["10.0.0.9:3181"]["state"] == "down"
            for bookie in cluster.bookies:
                row = bookies[bookie.address]
                assert (row["state"], row["admin"]) == ("writable", "ok")
                assert 0 < row["disk_used_percent"] <= 100
            assert [ns_["name"] for ns_ in first["namespaces"]] == sorted([HOSTILE_NAME, "shop"])

            orders = streams_of(first)["orders"]
            assert [(s["sequence"], s["state"], s["records"]) for s in orders["segments"]] == [
                (1, "truncated", 300), (2, "completed", 300), (3, "completed", 300), (4, "completed", 100)]
            assert orders["truncation_point"]["offset"] == f"{orders['segments'][1]['ledger']}:1:0"
            lags = {sub["name"]: (sub["lag_records"], sub["segment"]) for sub in orders["subscriptions"]}
            assert lags == {"billing": (300, 3), "audit": (1, 4)}  # exact: equal-sized entries
            clicks_info = streams_of(first)["sales/eu/clicks"]
            assert clicks_info["segments"][0]["state"] == "in_progress"
            assert clicks_info["segments"][0]["last_entry"] == 1
            assert [(s["name"], s["lag_records"]) for s in clicks_info["subscriptions"]] == [("dashboard", 25)]

            await clicks.write_batch(values(20, 50))  # acknowledged: one more entry on each bookie
            second = await poll_api(client, lambda answer: True)  # the next scrape sees it
            for bookie in second["bookies"]:
                if bookie["state"] != "down":
                    assert bookie["adds_per_second"] > 0, bookie
            await poll_api(client, lambda answer: tail_records(answer) == 70)
            await clicks.close()

            async with aiohttp.ClientSession() as http:
                async with http.put(cluster.bookies[1].http + "/api/v1/bookie/state",
                                    json={"read_only": True}) as response:
                    assert response.status == 200
            third = await poll_api(client, lambda answer: {b["id"]: b["state"] for b in answer["bookies"]}
                                   .get(cluster.bookies[1].address) == "read_only")
            assert streams_of(third)["sales/eu/clicks"]["segments"][0]["state"] == "completed"

            async with client.get("/") as response:
                assert "default-src 'self'" in response.headers["Content-Security-Policy"]
                assert '<script src="/static/app.js"' in await response.text()
            async with client.get("/static/app.js") as response:
                assert response.status == 200 and "textContent" in await response.text()


async def test_the_page_reads_a_bounded_number_of_namespaces_says_how_many_more_and_shows_chosen_ones(
        cluster_factory, zk, monkeypatch):
    import dlog_tools.ui

    cluster = cluster_factory(bookies=1)
    for name in ("alpha", "beta", "gamma"):
        async with Namespace(cluster.zk_address, name, bookkeeper_root=cluster.zk_root,
                             root=f"{cluster.zk_root}-dlog") as ns:
            await ns.create_stream(f"{name}-stream", ensemble=1, write_quorum=1, ack_quorum=1)
    monkeypatch.setattr(dlog_tools.ui, "NAMESPACES_MAX", 2)

    async def shown(**chosen: Any) -> tuple[list[str], int, str]:
        collector = Collector(dataclasses.replace(options(cluster), **chosen), clock=FakeClock())
        try:
            result = await collector.snapshot()
        finally:
            await collector.close()
        assert result["errors"] == []
        page = render_page(result)
        return [n["name"] for n in result["namespaces"]], result["namespaces_omitted"], page

    names, omitted, page = await shown()
    assert (names, omitted) == (["alpha", "beta"], 1)  # the first by name, and a count of the rest
    assert "1 more namespaces not shown" in page and "dlog ui --namespace NAME" in page
    names, omitted, page = await shown(namespaces=("gamma", "no-such-namespace"))
    assert (names, omitted) == (["gamma"], 0)  # the one past the bound, when named
    assert "gamma-stream" in page and "more namespaces not shown" not in page


async def test_a_paused_bookie_shows_as_unreachable_not_as_an_error(cluster_factory, zk):
    cluster = cluster_factory(bookies=2)
    async with namespace(cluster) as ns:
        await ns.create_stream("orders", ensemble=2, write_quorum=2, ack_quorum=2)
        async with await ns.open_writer("orders") as writer:
            await writer.write_batch(values(10))
    collector = Collector(options(cluster), clock=FakeClock())
    cluster.kill_bookie(0, signal.SIGSTOP)  # its admin port still accepts, but nothing answers
    try:
        async with TestClient(TestServer(make_app(collector))) as client:
            started_s = time.monotonic()
            answer = await poll_api(client, lambda answer: True)
            assert time.monotonic() - started_s < HTTP_TIMEOUT_S + 5
    finally:
        cluster.kill_bookie(0, signal.SIGCONT)
    admin = {bookie["id"]: bookie["admin"] for bookie in answer["bookies"]}
    assert admin == {cluster.bookies[0].address: "unreachable", cluster.bookies[1].address: "ok"}
    assert [s["records"] for s in streams_of(answer)["orders"]["segments"]] == [10]


async def test_the_header_is_green_then_red_counting_and_naming_each_problem(cluster_factory, zk):
    cluster = cluster_factory(bookies=3)
    async with namespace(cluster) as ns:
        offsets = {}
        for name in ("orders", "lost"):
            await ns.create_stream(name, ensemble=2, write_quorum=2, ack_quorum=2)
            async with await ns.open_writer(name) as writer:
                offsets[name] = list(await writer.write_batch(values(10)))
            await ns.commit_subscription(name, "late", offsets[name][0])
        lost_ledger = offsets["lost"][0].ledger_id
        recovery = RecoveryStore(zk, cluster.zk_root)
        await recovery.set_enabled(False)  # nothing repairs what the test breaks
        async with TestClient(TestServer(make_app(Collector(options(cluster), clock=FakeClock())))) as client:
            html = await poll_page(client, lambda html: "<h4 class=\"stream-name\">lost</h4>" in html)
            assert '<span id="health" class="health ok">● healthy</span>' in html and 'id="problems"' not in html

            cluster.stop_bookie(2)  # it joined the cluster (its cookie stays): down, not gone
            await zk.delete(layout.ledger_path(cluster.zk_root, lost_ledger))  # as `dlog ledger delete --force`
            await ns.truncate("orders", offsets["orders"][5])  # "late" has read none of it: it will skip 5 records
            await recovery.mark(lost_ledger + 1000, [Missing(cluster.bookies[2].address, Reason.LOST, 1)], 1)
            problems = [f"bookie {cluster.bookies[2].address} is down (it joined this cluster but is not registered)",
                        "stream shop/orders: subscription late will skip records it never read",
                        f"stream shop/lost lost records: ledger {lost_ledger} missing", "ledger under-replicated"]
            html = await poll_page(client, lambda html: all(problem in html for problem in problems))
            answer = await poll_api(client, lambda answer: True)
    found = answer["health"]["problems"]
    assert answer["health"]["ok"] is False and len(found) == 4, answer["health"]
    assert found[0] == problems[0] and problems[2] in found
    [skipping] = [problem for problem in found if problem.startswith(problems[1])]
    assert "records before" in skipping and "were truncated" in skipping  # resolve()'s words
    assert re.fullmatch(r"\d+ ledgers? under-replicated", found[3])
    assert '<span id="health" class="health bad">● 4 problems</span>' in html
    assert html.count("<li>") == 4 and "skips records it never read</span>" in html


async def test_a_segment_whose_writer_died_is_not_shown_as_writing(cluster_factory):
    cluster = cluster_factory(bookies=2)
    script = ("import sys, dlog\n"
              "ns = dlog.connect(sys.argv[1], 'shop', bookkeeper_root=sys.argv[2], root=sys.argv[2] + '-dlog')\n"
              "ns.create_stream('orders', ensemble=2, write_quorum=2, ack_quorum=2)\n"
              "w = ns.open_writer('orders')\n"
              "w.write(b'one')\n"
              "print('acked', flush=True)\n"
              "sys.stdin.read()\n")
    writer = subprocess.Popen([sys.executable, "-c", script, cluster.zk_address, cluster.zk_root],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert LineReader(writer).next_line(60) == "acked"
        async with TestClient(TestServer(make_app(Collector(options(cluster), clock=FakeClock())))) as client:
            html = await poll_page(client, lambda html: 'class="entries muted activity">writing<' in html)
            assert NO_WRITER_NOTE not in html and 'class="segment in_progress g-' in html
            assert f"writer: pid {writer.pid} on " in html
            answer = await poll_api(client, lambda answer: True)
            assert streams_of(answer)["orders"]["segments"][0]["writer"]["pid"] == writer.pid

            os.kill(writer.pid, signal.SIGKILL)  # no close, no seal: its lock goes with its session
            writer.wait(timeout=30)
            html = await poll_page(client, lambda html: NO_WRITER_NOTE in html)
            answer = await poll_api(client, lambda answer: True)

            for index in (0, 1):  # its whole ensemble: nobody can read the segment's tail now
                cluster.stop_bookie(index)
            unreadable = await poll_api(client, lambda answer: len(answer["health"]["problems"]) == 3)
            unreadable_html = await poll_page(client, lambda html: True)
    finally:
        if writer.poll() is None:
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(timeout=30)
        writer.stdin.close()
        writer.stdout.close()
    assert 'class="entries muted activity">writing<' not in html
    assert 'class="segment in_progress no-writer g-' in html and f"segment #1: {NO_WRITER_NOTE}" in html
    [segment] = streams_of(answer)["orders"]["segments"]
    assert (segment["state"], segment["writer"], segment["note"]) == ("in_progress", None, NO_WRITER_NOTE)
    assert answer["health"]["ok"], answer["health"]  # a crashed writer loses nothing acknowledged
    assert unreadable["health"]["problems"][2] == "stream shop/orders: segment #1 cannot be read"
    assert "● 3 problems<" in unreadable_html
    assert "<li>stream shop/orders: segment #1 cannot be read</li>" in unreadable_html


async def test_each_bookie_shows_its_own_directories_not_the_machines_disk(cluster_factory):
    cluster = cluster_factory(bookies=2)
    async with namespace(cluster) as ns:
        await ns.create_stream("orders", ensemble=2, write_quorum=2, ack_quorum=2)
        async with await ns.open_writer("orders") as writer:
            await writer.write_batch(values(100))
    async with TestClient(TestServer(make_app(Collector(options(cluster), clock=FakeClock())))) as client:
        answer = await poll_api(client, lambda answer: all(b["directories"] for b in answer["bookies"]))
        html = await poll_page(client, lambda html: True)
    rows = {bookie["id"]: bookie for bookie in answer["bookies"]}
    for bookie in cluster.bookies:
        directories = rows[bookie.address]["directories"]
        expected = {"journal": bookie.data_dir / "journal", "entry_logs": bookie.data_dir / "ledgers" / "entrylogs",
                    "index": bookie.data_dir / "ledgers" / "index"}
        assert {name: Path(item["path"]) for name, item in directories.items()} == {
            name: path.resolve() for name, path in expected.items()}
        assert directories["journal"]["bytes"] > 0 and directories["index"]["bytes"] > 0
        for item in directories.values():
            assert f'<code class="dir-path">{item["path"]}</code>' in html


async def test_a_secure_bookies_directories_need_the_pages_token_its_metrics_do_not(secure_cluster):
    admin = secure_cluster.secure_dir.admin_settings()
    for security, has_directories in ((admin, True), (dataclasses.replace(admin, token=None), False)):
        collector = Collector(UiOptions(secure_cluster.zk_address, secure_cluster.zk_root, security=security),
                              clock=FakeClock())
        async with TestClient(TestServer(make_app(collector))) as client:
            answer = await poll_api(client, lambda answer: len(answer["bookies"]) == 2)
        for bookie in answer["bookies"]:
            assert bookie["admin"] == "ok" and bookie["disk_used_percent"] is not None, bookie
            assert (bookie["directories"] is not None) == has_directories, bookie


async def test_the_stream_filter_is_a_query_parameter_served_filtered(cluster_factory, zk):
    cluster = cluster_factory(bookies=2)
    async with namespace(cluster) as ns:
        clicks = await populate(ns, zk, cluster)
        await clicks.close()
    async with TestClient(TestServer(make_app(Collector(options(cluster), clock=FakeClock())))) as client:
        everything = await poll_page(client, lambda html: "sales/eu/clicks</h4>" in html)
        filtered = await poll_page(client, lambda html: True, "/?q=EU%2Fcl")
        nothing = await poll_page(client, lambda html: True, "/?q=%3Cnone%3E")
    assert '<h4 class="stream-name">orders</h4>' in everything
    assert '<span id="stream-count" class="count">(2)' in everything
    assert '<h4 class="stream-name">sales/eu/clicks</h4>' in filtered and "stream-name\">orders<" not in filtered
    assert 'name="q" value="EU/cl"' in filtered and "1 stream matches “EU/cl”" in filtered
    assert "no stream matches “&lt;none&gt;”" in nothing and "<none>" not in nothing
    assert '<span id="health" class="health bad">● 1 problem</span>' in filtered  # health covers every stream


async def test_standalone_serves_the_page_and_prints_its_url(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(tmp_path / "sa"),
                                "--bookies", "1", "--zk-port", str(free_port()), "--ui-port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = LineReader(process)
        ready = lines.line_starting("dlog standalone ready zk=", 90)
        ui_line = lines.next_line(10)
        assert ready is not None and ui_line is not None and ui_line.startswith("  ui http://127.0.0.1:"), \
            (ready, ui_line)
        bookie_address = ready.split("bookies=")[1].split()[0]
        async with aiohttp.ClientSession(base_url=ui_line.split()[1].rstrip("/")) as http:
            answer = await poll_api(http, lambda answer: [b["id"] for b in answer["bookies"]] == [bookie_address])
        assert answer["errors"] == [] and answer["bookies"][0]["admin"] == "ok"
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=60)
        with process.stdout, process.stderr:
            assert status == 0, process.stderr.read()


def start_standalone(directory: Path, *arguments: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(directory),
                                "--bookies", "1", *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = LineReader(process)
    ready = lines.line_starting("dlog standalone ready zk=", 90)
    ui_line = lines.next_line(10)
    if ready is None or ui_line is None or not ui_line.startswith("  ui http://127.0.0.1:"):
        process.kill()
        with process.stdout, process.stderr:
            raise AssertionError(f"no ready and ui lines ({ready!r}, {ui_line!r}): {process.stderr.read()}")
    return process, ui_line.split()[1]


def stop(process: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM, its exit status and what it said on stderr; its pipes closed."""
    process.send_signal(signal.SIGTERM)
    status = process.wait(timeout=60)
    with process.stdout, process.stderr:
        return status, process.stderr.read()


def test_standalone_keeps_its_status_page_port_as_it_keeps_the_zookeeper_port(tmp_path):
    assert f"status page http://127.0.0.1:{UI_PORT_DEFAULT}/" in "\n".join(readme_blocks(""))  # the README says where
    directory = tmp_path / "sa"
    process, first_url = start_standalone(directory, "--zk-port", str(free_port()), "--ui-port", "0")
    status, stderr = stop(process)
    assert status == 0, stderr
    port = load_state(directory)["ui_port"]
    assert first_url == f"http://127.0.0.1:{port}/" and port not in (0, UI_PORT_DEFAULT)

    process, second_url = start_standalone(directory)  # neither port given: both as last time
    try:
        again = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(directory)],
                               capture_output=True, text=True, timeout=90)
    finally:
        status, stderr = stop(process)
        assert status == 0, stderr
    assert second_url == first_url
    assert again.returncode == 1 and f"is in use by pid {process.pid}" in again.stderr, again.stderr  # not "port"

    with socket.socket() as holder:  # someone else took it meanwhile: named before anything starts
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(directory),
                                 "--bookies", "1"], capture_output=True, text=True, timeout=90)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"the status page port 127.0.0.1:{port} is held by" in result.stderr and "--ui-port" in result.stderr
    assert load_state(directory)["ui_port"] == port


# ------------------------------------------------------------------------------ the page in a browser


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("chromium is not installed: run scripts/ensure-chromium.sh as root "
                "(or apt-get install chromium) to run the browser test")


async def run_chromium(binary: str, profile: Path, *arguments: str) -> str:
    process = await asyncio.create_subprocess_exec(
        binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *arguments,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), CHROMIUM_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"chromium did not finish within {CHROMIUM_TIMEOUT_S} s") from None
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
    return stdout.decode(errors="replace")


async def test_the_page_renders_bookies_timelines_and_subscriptions_in_chromium(cluster_factory, zk,
                                                                                 tmp_path):
    binary = chromium_binary()
    cluster = cluster_factory(bookies=2)
    async with namespace(cluster) as ns:
        clicks = await populate(ns, zk, cluster)
        runner = web.AppRunner(make_app(Collector(options(cluster))), access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            url = f"http://127.0.0.1:{port}/"
            async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
                answer = await poll_api(http, lambda answer: tail_records(answer) == 50)
            ledgers = [s["ledger"] for stream in streams_of(answer).values() for s in stream["segments"]]
            recovery = RecoveryStore(zk, cluster.zk_root)
            await recovery.set_enabled(False)  # so the mark below stays to be shown
            await recovery.mark(ledgers[-1], [Missing("10.0.0.9:3181", Reason.LOST, 1)], 1)
            async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
                await poll_api(http, lambda answer: answer["autorecovery"]["underreplicated"] == 1)
            dom = await run_chromium(binary, tmp_path / "profile-dom", "--dump-dom", url)
            screenshot = await take_screenshot(binary, tmp_path, url)
        finally:
            await clicks.close()
            await runner.cleanup()

    if os.environ.get("DLOG_UI_SCREENSHOT"):  # to look at it: DLOG_UI_SCREENSHOT=/tmp/ui.png pytest ...
        shutil.copy(screenshot, os.environ["DLOG_UI_SCREENSHOT"])
    assert 'data-loaded="1"' in dom, dom[:2000]
    for bookie in cluster.bookies:
        assert f'<code class="bookie-id">{bookie.address}</code>' in dom
    assert '<h4 class="stream-name">orders</h4>' in dom
    assert '<h4 class="stream-name">sales/eu/clicks</h4>' in dom
    for ledger_id in ledgers:
        assert f'data-ledger="{ledger_id}"' in dom and f"ledger {ledger_id}</div>" in dom
    assert dom.count('class="segment truncated g-') == 1 and dom.count('class="segment in_progress g-') == 1
    for name in ("billing", "audit", "dashboard"):
        assert f'<code class="sub-name">{name}</code>' in dom
    assert "≈ 300" in dom and "≈ 25" in dom  # lag of billing and dashboard
    assert "&lt;img src=x onerror=alert(1)&gt;" in dom and "<img" not in dom  # shown, never parsed
    assert f'<code class="ledger-id">{ledgers[-1]}</code>' in dom and "10.0.0.9:3181 (lost)" in dom
    assert "DISABLED" in dom and "1 under-replicated" in dom
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    assert 'class="health bad">● 2 problems<' in dom and "bookie 10.0.0.9:3181 is down" in dom
    assert "<li>1 ledger under-replicated</li>" in dom


HEALTH_RED = (0xC0, 0x39, 0x2B)  # style.css: --bad, the background of a red health summary
HEALTH_GREEN = (0xE3, 0xF5, 0xEA)  # style.css: .health.ok


def header_pixels(screenshot: Path, color: tuple[int, int, int]) -> int:
    """How many pixels of the page's header (its top 48 px) have `color`, give or take a little."""
    from PIL import Image

    with Image.open(screenshot) as image:
        assert image.size == WINDOW
        colors = image.convert("RGB").crop((0, 0, WINDOW[0], 48)).getcolors(WINDOW[0] * 48)
    assert colors is not None
    return sum(count for count, pixel in colors
               if isinstance(pixel, tuple) and all(abs(a - b) <= 8 for a, b in zip(pixel, color, strict=True)))


def distinct_colors(screenshot: Path) -> int:
    from PIL import Image

    with Image.open(screenshot) as image:
        colors = image.convert("RGB").getcolors(WINDOW[0] * WINDOW[1])
    assert colors is not None
    return len(colors)


async def take_screenshot(binary: str, tmp_path: Path, url: str) -> Path:
    """`chromium --headless --screenshot` of the page as served: no time for scripts to run."""
    shot = tmp_path / f"ui-{len(list(tmp_path.glob('ui-*.png')))}.png"
    await run_chromium(binary, tmp_path / f"profile-{shot.stem}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                       f"--screenshot={shot}", url)
    return shot


async def test_a_plain_screenshot_shows_the_health_green_then_red_when_a_bookie_stops(cluster_factory, tmp_path):
    binary = chromium_binary()
    cluster = cluster_factory(bookies=2)
    runner = web.AppRunner(make_app(Collector(options(cluster))), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/"
    try:
        async with aiohttp.ClientSession(base_url=url) as http:
            healthy = await poll_page(http, lambda html: "● healthy" in html)
            green = await take_screenshot(binary, tmp_path, url)
            cluster.stop_bookie(1)
            sick = await poll_page(http, lambda html: "● 1 problem<" in html)
            red = await take_screenshot(binary, tmp_path, url)
    finally:
        await runner.cleanup()
    if os.environ.get("DLOG_UI_SCREENSHOT"):
        shutil.copy(red, os.environ["DLOG_UI_SCREENSHOT"])
    assert 'class="health ok"' in healthy and 'class="health bad"' in sick
    down = f"bookie {cluster.bookies[1].address} is down (it joined this cluster but is not registered)"
    assert f"<li>{down}</li>" in sick
    for shot in (green, red):
        assert distinct_colors(shot) > 20  # a page, not a blank window
    assert header_pixels(green, HEALTH_GREEN) > 300 and header_pixels(green, HEALTH_RED) == 0
    assert header_pixels(red, HEALTH_RED) > 300 and header_pixels(red, HEALTH_GREEN) == 0
