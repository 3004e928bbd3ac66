"""Faults of tiered storage, on a local tier and on S3 (moto's server mode), in real processes
(issue 24, item 6): the offloader SIGKILLed at each step of a segment's offload leaves nothing
visible to readers and a rerun completes; an unreachable, refusing or full tier leaves the ledgers
in place and records the error in the stream's tier status until a run after it is back succeeds;
a damaged tier file is one clear error, or is read from the bookie copy while it exists."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import crc32c
import pytest

from bookkeeper.errors import NoSuchLedgerError
from dlog.offload import Offloader, offload_quietly
from dlog.segments.metadata import SegmentChange, TierPolicy
from dlog.segments.tier import TierDamagedError, stream_table_uri
from tests.harness.s3 import ACCESS_KEY, PART_BYTES, REGION, SECRET_KEY, MotoS3
from tests.helpers import eventually
from tests.tier.conftest import connect
from tests.tier.test_offload import read_all, write_segments

pytestmark = pytest.mark.timeout(240)
PROCESS_TIMEOUT_S = 90.0
CLAIM_TIMEOUT_S = 40.0  # a killed offloader's claim ends with its ZooKeeper session


# ------------------------------------------------------------------------------ helpers


def tier_uri(kind: str, tmp_path: Path, moto: MotoS3, prefix: str) -> str:
    return f"file://{tmp_path}/{prefix}" if kind == "file" else moto.uri(prefix, in_uri=True)


def connect_for(cluster, kind: str, moto: MotoS3, **options):
    return connect(cluster, tier_options=moto.options(), **options) if kind == "s3" else connect(cluster, **options)


def offloader_process(cluster, ns, stream: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.tier.offload_process", "--zk", cluster.zk_address, "--root", cluster.zk_root,
         "--namespace", ns.name, "--stream", stream, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=Path(__file__).parents[2])


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"the offloader process did not end within {PROCESS_TIMEOUT_S}s: {out}\n{err}") from None
    return process.returncode, out, err


async def wait_for_line(process: subprocess.Popen[str], prefix: str) -> str:
    """The first line of the process's output that starts with `prefix` (read in a thread)."""
    assert process.stdout is not None

    def read() -> str:
        for line in process.stdout:  # type: ignore[union-attr]
            if line.startswith(prefix):
                return line
        return ""

    line = await asyncio.wait_for(asyncio.to_thread(read), PROCESS_TIMEOUT_S)
    if not line:
        _, err = process.communicate()
        raise AssertionError(f"the offloader process ended without printing {prefix!r}: {err[-3000:]}")
    return line


async def rerun(ns, stream: str):
    """An offloader run that completes, once the killed one's claim is gone."""
    deadline = time.monotonic() + CLAIM_TIMEOUT_S
    while True:
        report = await Offloader(ns).run(stream, now=True)
        if not any("another offloader" in why for why in report.skipped):
            return report
        assert time.monotonic() < deadline, f"the killed offloader's claim outlived {CLAIM_TIMEOUT_S}s"
        await asyncio.sleep(0.2)


async def assert_completed(ns, stream: str, values: list[bytes]) -> None:
    """Every segment offloaded once: its copy the one file of its segment on the tier, no
    attempt left, its ledger deleted; the stream reads whole."""
    listing = await ns.store.segments(stream)
    assert all(s.tier is not None and not s.tier.on_bookies and not s.offload_attempt for s in listing.segments)
    policy = await ns.tier_policy(stream)
    files = await asyncio.to_thread(ns.reads.tier.list_files, stream_table_uri(policy.uri, ns.name, stream))
    assert sorted(files) == sorted(s.tier.uri for s in listing.segments)  # one file per segment, no leftover
    password = ns.password_of(await ns.config(stream))
    for segment in listing.segments:
        with pytest.raises(NoSuchLedgerError):
            await ns.client.open_ledger(segment.ledger_id, password=password)
    assert await read_all(ns, stream) == values
    assert await read_all(ns, stream, prefer="tier") == values


def random_values(count: int, size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


async def write_values(ns, stream: str, segments: list[list[bytes]]) -> list[bytes]:
    for values in segments:
        async with ns.open_writer(stream) as writer:
            for value in values:
                writer.write_nowait(value)
            await writer.flush()
    return [value for values in segments for value in values]


# ------------------------------------------------------------------------------ killed at each step

STEPS = ["attempt-recorded", "uploaded", "committed", "bookie-copy-marked"]


@pytest.mark.parametrize("kind", ["file", "s3"])
@pytest.mark.parametrize("step", STEPS)
async def test_an_offloader_killed_after_a_step_leaves_nothing_visible_and_a_rerun_completes(
        cluster, moto_s3, tmp_path, kind, step):
    async with connect_for(cluster, kind, moto_s3) as ns:
        uri = tier_uri(kind, tmp_path, moto_s3, f"kill-{step}")
        await ns.create_stream("orders", tier=TierPolicy(uri=uri, delete_lag_ms=0))
        values = await write_segments(ns, "orders", 2, 200, headers=True)
        before = await ns.store.segments("orders")

        code, out, err = finish(offloader_process(cluster, ns, "orders", "--kill-at", step))
        assert code == -signal.SIGKILL, f"{out}\n{err}"
        assert f"step {step}" in out.splitlines()

        listing = await ns.store.segments("orders")
        first = listing.segments[0]
        if step in ("attempt-recorded", "uploaded"):  # not committed: readers see the bookie copy only
            assert first.tier is None and first.offload_attempt
        else:
            assert first.tier is not None
        if step == "bookie-copy-marked":  # marked, but its ledger not deleted yet
            assert not first.tier.on_bookies
            await ns.client.open_ledger(first.ledger_id, password=ns.password_of(await ns.config("orders")))
        assert [s.ledger_id for s in listing.segments] == [s.ledger_id for s in before.segments]
        assert await read_all(ns, "orders") == values
        assert await read_all(ns, "orders", prefer="tier") == values

        await rerun(ns, "orders")
        await assert_completed(ns, "orders", values)


async def kill_mid_upload(cluster, ns, moto: MotoS3, kind: str, hold_after: int) -> None:
    process = offloader_process(cluster, ns, "orders", "--hold-upload-after", str(hold_after),
                                "--upload-chunk-bytes", str(min(hold_after, 2**20)))
    try:
        await wait_for_line(process, "uploading")
        listing = await ns.store.segments("orders")
        attempt = listing.segments[0].offload_attempt
        key = attempt.split("://", 1)[1].split("?", 1)[0]
        if kind == "s3":  # a part of the multipart upload has reached the store
            await eventually(lambda: any(method == "PUT" and f"/{key}?partNumber=" in path
                                         for method, path, _ in moto.requests()), timeout_s=60,
                             message="a part of the upload reached moto")
        else:  # the partial file is there
            await eventually(lambda: os.path.exists(key) and os.path.getsize(key) >= hold_after, timeout_s=30)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        finish(process)


@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_an_offloader_killed_mid_upload_leaves_nothing_visible_and_a_rerun_completes(
        cluster, moto_s3, tmp_path, kind):
    async with connect_for(cluster, kind, moto_s3) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=tier_uri(kind, tmp_path, moto_s3, "mid"),
                                                         delete_lag_ms=0))
        if kind == "s3":  # more than one part: random (incompressible) values, > PART_BYTES in all
            values = await write_values(ns, "orders", [random_values(PART_BYTES // 2**16 + 24, 2**16),
                                                       random_values(50, 100)])
            hold_after = PART_BYTES + 2**20
        else:
            values = await write_values(ns, "orders", [random_values(400, 100), random_values(50, 100)])
            hold_after = 4096
        await kill_mid_upload(cluster, ns, moto_s3, kind, hold_after)

        listing = await ns.store.segments("orders")
        assert listing.segments[0].tier is None and listing.segments[0].offload_attempt
        if kind == "s3":  # an unfinished multipart upload is no object
            assert moto_s3.keys(listing.segments[0].offload_attempt.split("/", 3)[3].split("?")[0]) == []
        assert await read_all(ns, "orders", prefer="tier") == values

        report = await rerun(ns, "orders")
        assert [o.sequence for o in report.offloaded] == [1, 2]
        await assert_completed(ns, "orders", values)
        if kind == "s3":  # the rerun's upload of the large file went in parts too
            uploaded = report.offloaded[0].uri.split("://", 1)[1].split("?")[0]
            parts = {path.split("partNumber=")[1].split("&")[0] for method, path, _ in moto_s3.requests()
                     if method == "PUT" and path.startswith(f"/{uploaded}?partNumber=")}
            assert parts == {"1", "2"}


# ------------------------------------------------------------------------------ tiers away, refusing, full


async def assert_failed_run(ns, stream: str, failures: int, values: list[bytes]) -> None:
    report = await offload_quietly(Offloader(ns), stream, now=True)
    assert report.error and not report.offloaded
    status = await ns.store.tier_status(stream)
    assert status["error"] == report.error and status["failures"] == failures
    listing = await ns.store.segments(stream)
    assert all(s.tier is None and s.on_bookies for s in listing.segments)
    password = ns.password_of(await ns.config(stream))
    for segment in listing.segments:  # the ledgers stay
        await ns.client.open_ledger(segment.ledger_id, password=password)
    assert await read_all(ns, stream) == values


async def assert_recovered(ns, stream: str, values: list[bytes]) -> None:
    report = await offload_quietly(Offloader(ns), stream, now=True)
    assert not report.error and len(report.offloaded) == 2
    status = await ns.store.tier_status(stream)
    assert status["error"] == "" and status["failures"] == 0 and status["last_success_ms"] > 0
    await assert_completed(ns, stream, values)


async def test_an_unreachable_s3_tier_leaves_the_ledgers_and_a_run_after_it_is_back_succeeds(cluster, tmp_path):
    away = MotoS3(tmp_path / "away")  # its port picked, nothing listening on it yet
    async with connect(cluster, tier_options=away.options()) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=away.uri("t"), delete_lag_ms=0))
        values = await write_segments(ns, "orders", 2, 50)
        await assert_failed_run(ns, "orders", 1, values)
        await assert_failed_run(ns, "orders", 2, values)  # the failures count on
        away.start()
        try:
            await assert_recovered(ns, "orders", values)
        finally:
            away.stop()


async def test_an_s3_tier_whose_bucket_is_missing_refuses_and_a_run_after_it_exists_succeeds(
        cluster, moto_s3, tmp_path):
    async with connect(cluster, tier_options=moto_s3.options()) as ns:
        bucket = f"later-{ns.name}"
        await ns.create_stream("orders", tier=TierPolicy(uri=f"s3://{bucket}/t", delete_lag_ms=0))
        values = await write_segments(ns, "orders", 2, 50)
        await assert_failed_run(ns, "orders", 1, values)
        moto_s3.filesystem().create_dir(bucket)
        await assert_recovered(ns, "orders", values)


async def test_a_local_tier_that_refuses_writes_leaves_the_ledgers_and_a_run_after_it_is_fixed_succeeds(
        cluster, tmp_path):
    async with connect(cluster) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=0))
        values = await write_segments(ns, "orders", 2, 50)
        (tmp_path / "tier").write_text("a file where the tier's directory should be\n")
        await assert_failed_run(ns, "orders", 1, values)
        (tmp_path / "tier").unlink()
        await assert_recovered(ns, "orders", values)


async def test_an_offloader_whose_disk_is_full_records_the_error_leaves_no_file_and_a_later_run_succeeds(
        cluster, tmp_path):
    """RLIMIT_FSIZE in the offloader's process: every file it writes stops at 1 KiB (EFBIG), as
    on a full disk."""
    async with connect(cluster) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=0))
        values = await write_values(ns, "orders", [random_values(100, 100), random_values(100, 100)])
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.tier.offload_process", "--zk", cluster.zk_address, "--root",
             cluster.zk_root, "--namespace", ns.name, "--stream", "orders", "--quietly", "--temp-dir", str(scratch)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)))
        code, out, err = finish(process)
        assert code == 0, err
        report = json.loads(next(line for line in out.splitlines() if line.startswith("report "))[len("report "):])
        assert "File too large" in report["error"] or "too large" in report["error"].lower(), report
        status = await ns.store.tier_status("orders")
        assert status["error"] == report["error"] and status["failures"] == 1
        assert list(scratch.iterdir()) == []  # the half-built file removed
        listing = await ns.store.segments("orders")
        assert all(s.tier is None and s.on_bookies for s in listing.segments)
        assert await read_all(ns, "orders") == values
        await assert_recovered(ns, "orders", values)


# ------------------------------------------------------------------------------ damaged files


def damage(kind: str, moto: MotoS3, uri: str, how: str) -> None:
    if kind == "file":
        path = uri.split("://", 1)[1]
        data = Path(path).read_bytes()
        Path(path).write_bytes(flip(data) if how == "flip" else data[: len(data) // 2])
        return
    filesystem, path = moto.filesystem(), uri.split("://", 1)[1].split("?")[0]
    with filesystem.open_input_stream(path) as source:
        data = source.read()
    with filesystem.open_output_stream(path) as target:
        target.write(flip(data) if how == "flip" else data[: len(data) // 2])


def flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 8]) + data[middle + 8:]


@pytest.mark.parametrize("kind", ["file", "s3"])
@pytest.mark.parametrize("how", ["flip", "truncate"])
async def test_a_damaged_tier_file_falls_back_to_the_bookie_copy_then_is_one_clear_error(
        cluster, moto_s3, tmp_path, kind, how):
    async with connect_for(cluster, kind, moto_s3) as ns:
        uri = tier_uri(kind, tmp_path, moto_s3, f"damaged-{how}")
        await ns.create_stream("orders", tier=TierPolicy(uri=uri, delete_lag_ms=-1))  # bookie copies kept
        values = await write_segments(ns, "orders", 2, 100)
        await Offloader(ns).run("orders", now=True)
        listing = await ns.store.segments("orders")
        assert await read_all(ns, "orders", prefer="tier") == values  # read (and cached) while whole
        damaged = listing.segments[0]
        damage(kind, moto_s3, damaged.tier.uri, how)

        async with connect_for(cluster, kind, moto_s3, namespace=ns.name) as fresh:  # a reader that never saw it whole
            assert await read_all(fresh, "orders", prefer="tier") == values
            assert fresh.reads.tier_fallbacks >= 1

            await fresh.set_tier("orders", TierPolicy(delete_lag_ms=0))
            report = await Offloader(fresh).run("orders")
            assert damaged.ledger_id in report.bookie_copies_deleted
            with pytest.raises(TierDamagedError) as caught:
                await read_all(fresh, "orders")
            assert damaged.tier.uri in str(caught.value) and "\n" not in str(caught.value)
            assert ("crc32c" in str(caught.value)) if how == "flip" else ("bytes" in str(caught.value))


async def test_a_tier_file_damaged_before_its_checksum_was_taken_is_read_from_the_bookie_copy_and_not_kept(
        cluster, tmp_path):
    """The file matches the size and crc32c its segment recorded, but a data page is damaged (as
    by a bit flip on the offloader's disk before it measured the file): the page checksum finds
    it only when the row group is read; the reader then reads the bookie copy, and the read cache
    does not keep the file as good."""
    async with connect(cluster) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=-1))
        values = await write_values(ns, "orders", [random_values(300, 100)])
        await Offloader(ns).run("orders", now=True)
        listing = await ns.store.segments("orders")
        segment = listing.segments[0]
        path = Path(segment.tier.uri.split("://", 1)[1])
        data = flip(path.read_bytes()[:4096]) + path.read_bytes()[4096:]  # within the first data page
        path.write_bytes(data)
        recorded = replace(segment.tier, crc32c=crc32c.crc32c(data))
        await ns.store.commit("orders", listing, SegmentChange(update=(replace(segment, tier=recorded),)))

        async with connect(cluster, ns.name) as fresh:
            assert await read_all(fresh, "orders", prefer="tier") == values
            assert fresh.reads.tier_fallbacks == 1
            assert await read_all(fresh, "orders", prefer="tier") == values  # fetched again, not kept as good
            assert fresh.reads.tier_fallbacks == 2
