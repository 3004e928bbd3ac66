"""`dlog write` never reports as written what is not durable (issue 20): a second Ctrl-C under load
ends the run within a bounded time with an account of what is durable and what is unknown, which a
read confirms, and a live writer whose ledger is deleted under it fails loudly at once instead of
exiting 0; the metadata store's deletion watch fires for a deleted node and for a tombstone."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

import dlog
from bookkeeper.meta import layout
from bookkeeper.meta.acl import TOMBSTONE
from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.meta.zkstore import ZooKeeperMetadataStore
from bookkeeper.protocol.metadata import LedgerMetadata
from tests.helpers import dlog_runner, eventually, eventually_blocking

pytestmark = pytest.mark.timeout(240)

EXIT_BOUND_S = 20.0  # the old code hung in asyncio.run's task cancellation until a third Ctrl-C
NOISE = ("Traceback", "never retrieved", "Task was destroyed")


def start(cluster_factory, zk_server):
    cluster = cluster_factory(bookies=1)
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    run = dlog_runner(zk_server.address, cluster.zk_root, namespace)
    scope = ["--zk", zk_server.address, "--zk-root", cluster.zk_root, "--namespace", namespace]
    return cluster, run, scope, dlog.connect(zk_server.address, namespace, bookkeeper_root=cluster.zk_root)


def create(run, name: str) -> None:
    run("stream", "create", name, "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1")


def sealed_records(ns, name: str) -> list[tuple[str, bytes]]:
    """The stream's records once a new writer sealed what the last one left in progress."""
    ns.open_writer(name, takeover=True).close()
    with ns.open_reader(name, follow=False) as reader:
        return [(str(record.offset), record.value) for record in reader]


def quiet(stderr: str) -> None:
    assert not any(noise in stderr for noise in NOISE), stderr


def interrupt_twice_under_load(cluster, run, scope, ns, name: str) -> tuple[str, str, int]:
    """`dlog write` of a long run of numbers, its one bookie stopped under load, then Ctrl-C twice."""
    create(run, name)
    numbers = subprocess.Popen(["seq", "1", "5000000"], stdout=subprocess.PIPE)  # distinct, in order
    writing = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "write", name, *scope],
                               stdin=numbers.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert numbers.stdout is not None
    numbers.stdout.close()
    try:
        eventually_blocking(lambda: ns.stream_info(name)["records"] >= 10_000, timeout_s=60)
        cluster.kill_bookie(0, signal.SIGSTOP)  # under load: what is in flight stays in flight
        writing.send_signal(signal.SIGINT)
        time.sleep(0.1)
        writing.send_signal(signal.SIGINT)
        try:
            out, err = writing.communicate(timeout=EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"dlog write did not end within {EXIT_BOUND_S} s of a second Ctrl-C")
    finally:
        cluster.kill_bookie(0, signal.SIGCONT)
        writing.kill()
        numbers.kill()
        numbers.wait(timeout=30)
    quiet(err)
    return out, err, writing.returncode


def test_a_second_ctrl_c_under_load_ends_the_run_with_an_account_a_read_confirms(cluster_factory, zk_server):
    cluster, run, scope, ns = start(cluster_factory, zk_server)
    with ns:
        for attempt in range(3):  # bounded: a loaded machine may not schedule the writer in between
            name = f"load{attempt}"
            out, err, returncode = interrupt_twice_under_load(cluster, run, scope, ns, name)
            clean = re.fullmatch(rf"wrote ([\d,]+) records to {name} \((\S+) \.\. (\S+)\)\n", out)
            if clean is None:
                break
            # Nothing was in flight when the first Ctrl-C came (every sent entry was acknowledged before
            # the bookie stopped): a clean end, whose account a read confirms too; try again.
            records = sealed_records(ns, name)
            assert returncode == 0 and int(clean[1].replace(",", "")) == len(records), (out, err)
            assert records[-1][0] == clean[3]
        else:
            pytest.fail("three runs had nothing in flight at the second Ctrl-C")
        account = re.fullmatch(rf"([\d,]+) records durable in {name} up to (\S+); ([\d,]+) in flight with an "
                               r"unknown outcome\n", out)
        assert account is not None, out
        durable, last, unknown = int(account[1].replace(",", "")), account[2], int(account[3].replace(",", ""))
        assert unknown > 0 and returncode == 1, (returncode, err)
        assert err.startswith("dlog: interrupted twice") and len(err.splitlines()) == 1, err
        records = sealed_records(ns, name)
        assert durable <= len(records) <= durable + unknown  # the unknown ones may or may not have landed
        assert [int(value) for _, value in records] == list(range(1, len(records) + 1))
        assert records[durable - 1][0] == last  # where to resume from


def test_a_writer_whose_ledger_is_deleted_under_it_fails_at_once_and_reports_nothing_lost_as_written(
        cluster_factory, zk_server):
    cluster, run, scope, ns = start(cluster_factory, zk_server)
    with ns:
        create(run, "deleted")
        writing = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "write", "deleted", *scope],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert writing.stdin is not None
        try:
            for index in range(40):
                writing.stdin.write(b"record-%d\n" % index)
                writing.stdin.flush()  # like `tail -f`: the input stays open
            eventually_blocking(lambda: ns.stream_info("deleted")["records"] == 40, timeout_s=60)
            info = json.loads(run("stream", "info", "deleted", "--json").stdout)
            ledger = next(s["ledger"] for s in info["segments"] if s["state"] == "in_progress")
            run("ledger", "delete", str(ledger), "--force", namespaced=False)
            try:
                writing.stdin.write(b"after the deletion\n")
                writing.stdin.flush()
            except BrokenPipeError:
                pass  # it already stopped
            try:
                writing.wait(timeout=EXIT_BOUND_S)  # standard input is still open
            except subprocess.TimeoutExpired:
                pytest.fail(f"the writer went on for {EXIT_BOUND_S} s after its ledger {ledger} was deleted")
            out, err = (stream.read().decode() for stream in (writing.stdout, writing.stderr))  # type: ignore[union-attr]
        finally:
            writing.kill()
            writing.wait(timeout=30)
            for stream in (writing.stdin, writing.stdout, writing.stderr):
                try:
                    stream.close()  # type: ignore[union-attr]
                except BrokenPipeError:
                    pass  # stdin still held the line the writer, gone, never read: closing flushes it
        quiet(err)
        assert writing.returncode == 1 and len(err.splitlines()) == 1, err
        assert err.startswith(f"dlog: ledger {ledger} of the in-progress segment 1 of stream 'deleted' was "
                              "deleted under its writer"), err
        account = re.match(r"([\d,]+) records durable in deleted", out)
        assert account is not None and f"acknowledged into ledger {ledger}, deleted under the writer, lost" in out, out
        records = sealed_records(ns, "deleted")
        assert int(account[1].replace(",", "")) == len(records) == 0  # nothing reported durable is gone


async def test_the_metadata_stores_deletion_watch_fires_for_a_deleted_node_and_a_tombstone(zk_server):
    zk = AsyncZooKeeper(zk_server.address)
    await zk.start()
    try:
        store = ZooKeeperMetadataStore(zk, f"/t-{uuid.uuid4().hex[:8]}")
        await store.ensure_layout()
        fired: list[int] = []
        metadata = LedgerMetadata(1, 1, 1, ((0, ("127.0.0.1:1",)),))
        deleted, tombstoned, kept = [(await store.create_ledger(metadata))[0] for _ in range(3)]
        for ledger_id in (deleted, tombstoned, kept):  # `kept` must never fire: it exists throughout
            store.watch_ledger_deleted(ledger_id, lambda ledger_id=ledger_id: fired.append(ledger_id))
        await store.delete_ledger(deleted)
        await eventually(lambda: fired == [deleted])
        path = layout.ledger_path(store.root, tombstoned)
        await zk.set(path, TOMBSTONE, (await zk.get_or_none(path))[1])  # a client without delete rights
        await eventually(lambda: fired == [deleted, tombstoned])
        late: list[int] = []
        store.watch_ledger_deleted(deleted, lambda: late.append(deleted))  # gone already: at once
        await eventually(lambda: late == [deleted])
    finally:
        await zk.close()
