"""The offloader: completed segments become Parquet files on the stream's tier, and bookie copies
go after the lag. The rules are `dlog.core.tiering`'s; this drives them.

One offloader at a time per stream (`SegmentStore.claim_offloader`, an ephemeral ZooKeeper node):
`dlog offload`, `dlog tier daemon` and the policy runners of `dlog standalone` and `dlog serve`
may all try; the others skip the stream while it is claimed.

A segment's offload (three steps, `dlog.core.tiering`): record the attempt's file URI in the
segment, read the segment's entries from the bookies and build the Parquet file locally (in a
worker thread, so the event loop keeps serving writers and readers), upload it, then commit its
`TierCopy` if the attempt is still current. The previous attempt's file (an offloader killed
mid-way) is removed once the new attempt is recorded; a file whose attempt lost is removed by its
offloader; a metadata error at the commit leaves the file in place (it may be the committed one).

`on_step(name)` is called after each step ("attempt-recorded", "file-built", "uploaded",
"committed", "bookie-copy-marked", "bookie-copy-deleted"): tests stop a process there (kill -9)
to show that a rerun completes whatever step it died at.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bookkeeper.clock import perf_s
from bookkeeper.errors import DlogError, MetadataContentionError, MetadataVersionError
from dlog.core import backlog, tiering
from dlog.segments.codec import RecordSetCodec
from dlog.segments.metadata import Segment, SegmentList, StreamConfig, TierCopy, TierPolicy
from dlog.segments.schemas import schema_at
from dlog.segments.tier import SegmentFileWriter, TierDamagedError, TierError, segment_file_uri

if TYPE_CHECKING:
    from dlog.namespace import Namespace

log = logging.getLogger(__name__)
READ_CHUNK_ENTRIES = 64  # entries read from the bookies per request while building a file
# a marked bookie copy's ledger is deleted again (no error if gone) by every run this long after
# the mark: a run killed between the mark and the delete leaves no ledger behind for good
BOOKIE_DELETE_RECHECK_MS = 3600 * 1000


@dataclass(slots=True)
class OffloadedSegment:
    sequence: int
    ledger_id: int
    uri: str
    records: int
    size_bytes: int
    segment_bytes: int  # what the segment holds on each bookie (the ledger's length)
    seconds: float


@dataclass(slots=True)
class OffloadReport:
    """What one run did to one stream."""

    stream: str
    tier_uri: str
    planned: list[Segment] = field(default_factory=list)
    offloaded: list[OffloadedSegment] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why a segment or the stream was left
    bookie_copies_deleted: list[int] = field(default_factory=list)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream, "tier": self.tier_uri,
            "planned": [{"sequence": s.sequence, "ledger": s.ledger_id, "records": s.records, "bytes": s.bytes}
                        for s in self.planned],
            "offloaded": [{"sequence": o.sequence, "ledger": o.ledger_id, "uri": o.uri, "records": o.records,
                           "file_bytes": o.size_bytes, "segment_bytes": o.segment_bytes,
                           "seconds": round(o.seconds, 3)} for o in self.offloaded],
            "skipped": self.skipped, "bookie_copies_deleted": self.bookie_copies_deleted, "error": self.error,
        }


def offloader_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Offloader:
    """Offloads the segments of one namespace's streams (see the module doc)."""

    def __init__(self, namespace: Namespace, *, holder: str | None = None, temp_dir: str | None = None,
                 on_step: Callable[[str], None] | None = None, attempt_ids: Callable[[], str] | None = None) -> None:
        """`attempt_ids` names each attempt's file (default: a random UUID; the stream simulator
        draws them from its seed)."""
        self.namespace = namespace
        self.attempt_ids = attempt_ids or (lambda: uuid.uuid4().hex)
        self.holder = holder or offloader_id()
        self.temp_dir = temp_dir
        self.on_step = on_step or (lambda step: None)
        self.tier = namespace.reads.tier
        self.blocking = namespace.reads.blocking  # file work off the event loop (dlog.snapshot)

    # ------------------------------------------------------------------ a stream

    async def run(self, name: str, *, now: bool = False, dry_run: bool = False, delete_copies: bool = True,
                  now_ms: int | None = None) -> OffloadReport:
        """Offload what is due (everything not kept when `now`), then delete the bookie copies
        that are due (`delete_copies`). The outcome is recorded as the stream's tier status."""
        ns = self.namespace
        if not dry_run:
            ns.security.require_role(ns.name, "admin", f"offloading stream {name!r}")
        config = await ns.store.config(name)
        policy = await ns.tier_policy(name, config)
        report = OffloadReport(name, policy.uri or "")
        fixed_ms = now_ms
        now_ms = ns.clock.wall_ms() if fixed_ms is None else fixed_ms
        if not policy.enabled:
            report.skipped.append("the stream has no tier (dlog tier set NAME --tier URI)")
            return report
        listing = await ns.store.segments(name)
        report.planned = tiering.offload_plan(listing, policy, now_ms, now=now)
        if dry_run:
            return report
        holder = await ns.store.claim_offloader(name, self.holder)
        if holder is not None:
            report.skipped.append(f"another offloader ({holder}) is at work on the stream")
            return report
        try:
            for segment in report.planned:
                done = await self.offload_segment(name, config, segment, policy)
                if done is None:
                    report.skipped.append(f"segment {segment.sequence} changed meanwhile (truncated, or "
                                          "offloaded by someone else)")
                else:
                    report.offloaded.append(done)
            if report.offloaded:
                try:
                    await ns.sync_iceberg(name, config=config)
                except DlogError as exc:  # the files are offloaded; the next sync registers them
                    report.skipped.append(f"the Iceberg table was not brought up to date: {exc}")
            if delete_copies:
                later_ms = ns.clock.wall_ms() if fixed_ms is None else fixed_ms  # after the offloads
                report.bookie_copies_deleted = await self.delete_bookie_copies(name, config, policy, later_ms)
        except DlogError as exc:
            report.error = str(exc)
            raise
        finally:
            await ns.store.release_offloader(name, self.holder)
            await self._record_status(name, report, now_ms)
        return report

    async def _record_status(self, name: str, report: OffloadReport, now_ms: int) -> None:
        try:
            previous = await self.namespace.store.tier_status(name) or {}
            idle = not (report.error or report.offloaded or report.bookie_copies_deleted)
            if idle and previous and not previous.get("failures"):
                return  # nothing new to say: no write per stream per round of a daemon
            failures = int(previous.get("failures", 0)) + 1 if report.error else 0
            await self.namespace.store.store_tier_status(name, {
                "at_ms": now_ms, "holder": self.holder, "error": report.error, "failures": failures,
                "offloaded": len(report.offloaded),
                "last_success_ms": previous.get("last_success_ms", 0) if report.error else now_ms})
        except DlogError as exc:  # the status is a courtesy: the run's own outcome stands
            log.warning("stream %s: could not record its tier status: %s", name, exc)

    # ------------------------------------------------------------------ a segment

    async def offload_segment(self, name: str, config: StreamConfig, segment: Segment,
                              policy: TierPolicy) -> OffloadedSegment | None:
        ns = self.namespace
        started = perf_s()
        uri = segment_file_uri(policy.uri or "", ns.name, name, segment.sequence, self.attempt_ids())

        async def record_attempt() -> tuple[bool, str]:
            listing = await ns.store.segments(name)
            current = listing.by_sequence(segment.sequence)
            if current is None or current.is_truncated or current.tier is not None:
                return False, ""
            await self._commit(name, listing, tiering.attempt_change(current, uri))
            return True, current.offload_attempt

        recorded, previous = await ns.replanned(name, "offload attempt", record_attempt)
        if not recorded:
            return None
        self.on_step("attempt-recorded")
        if previous:  # a killed attempt's file: that attempt can never commit now
            await self.blocking(self.tier.delete, previous)
        written = await self._build(name, config, segment)
        try:
            self.on_step("file-built")
            await self.blocking(self.tier.upload, written.local_path, uri)
        finally:
            try:
                os.unlink(written.local_path)
            except FileNotFoundError:
                pass
        self.on_step("uploaded")
        copy = TierCopy(uri, written.size_bytes, written.crc32c, written.rows, ns.clock.wall_ms())

        async def commit() -> bool:
            listing = await ns.store.segments(name)
            change = tiering.offloaded_change(listing, segment.sequence, uri, copy)
            if change is None:
                return False
            await self._commit(name, listing, change)
            return True

        if not await ns.replanned(name, "offload commit", commit):
            await self.blocking(self.tier.delete, uri)  # known not to be the segment's file
            return None
        self.on_step("committed")
        return OffloadedSegment(segment.sequence, segment.ledger_id, uri, written.rows, written.size_bytes,
                                segment.bytes, perf_s() - started)

    async def _commit(self, name: str, listing: SegmentList, change: Any) -> None:
        try:
            await self.namespace.store.commit(name, listing, change)
        except MetadataVersionError as exc:
            raise MetadataContentionError(f"the segment list of stream {name!r} changed meanwhile") from exc

    async def _build(self, name: str, config: StreamConfig, segment: Segment) -> Any:
        """The segment's Parquet file, built locally from its entries on the bookies."""
        ns = self.namespace
        # a typed stream's segment: the schema version its records were written with
        schema = schema_at(config, segment.schema_version) if config.schema else ns.schema_of(config)
        codec = RecordSetCodec(schema, headers=not config.schema)
        handle = await ns.reads.handle(segment.ledger_id, ns.password_of(config), segment.last_entry)
        writer = SegmentFileWriter(ns.name, name, segment, schema, self.temp_dir)
        try:
            first = segment.first_entry
            while first <= segment.last_entry:
                last = min(segment.last_entry, first + READ_CHUNK_ENTRIES - 1)
                entries = await handle.read(first, last)

                def add(entries: list[Any] = entries) -> None:
                    for entry in entries:
                        header, batch = codec.decode(entry.payload)
                        writer.add(entry.entry_id, header, batch)

                await self.blocking(add)
                first = last + 1
            written = await self.blocking(writer.finish)
        except OSError as exc:  # the local disk (full, or refusing): a tier error, tried again later
            writer.discard()
            raise TierError(f"stream {name!r} segment {segment.sequence}: cannot build its file in "
                            f"{os.path.dirname(writer.local_path)}: {exc}") from exc
        except BaseException:
            writer.discard()
            raise
        if written.rows != segment.records:
            writer.discard()
            raise TierDamagedError(f"stream {name!r} segment {segment.sequence}: its entries hold {written.rows} "
                                   f"records, its metadata says {segment.records}; not offloaded")
        return written

    # ------------------------------------------------------------------ bookie copies

    async def delete_bookie_copies(self, name: str, config: StreamConfig, policy: TierPolicy,
                                   now_ms: int) -> list[int]:
        """Delete the ledgers of offloaded segments that are due (marked first, then deleted)."""
        ns = self.namespace
        subscriptions = backlog.retention_holders(  # never an evicted one
            config, await ns.store.subscriptions(name) if backlog.keeps_unconsumed(config) else {})

        async def mark() -> list[Segment]:
            listing = await ns.store.segments(name)
            plan = tiering.bookie_copy_plan(listing, config, policy, now_ms, subscriptions)
            if plan:
                await self._commit(name, listing, tiering.bookie_deleted_change(plan, now_ms))
            return plan

        plan = await ns.replanned(name, "bookie copy deletion", mark)
        if plan:
            self.on_step("bookie-copy-marked")
        # a run killed between marking and deleting left ledgers behind: delete those again too
        listing = await ns.store.segments(name)
        marked = [s for s in listing.segments if s.tier is not None and not s.tier.on_bookies
                  and now_ms - s.tier.bookie_deleted_ms < BOOKIE_DELETE_RECHECK_MS]
        deleted = []
        for segment in marked:
            if await ns.delete_ledger_quietly(segment.ledger_id):
                deleted.append(segment.ledger_id)
        if plan:
            self.on_step("bookie-copy-deleted")
        return deleted


async def offload_quietly(offloader: Offloader, name: str, **options: Any) -> OffloadReport:
    """One run whose tier errors are reported in the report (and the stream's tier status), not
    raised: the policy runners' and the daemon's way, which try again at their next round."""
    try:
        return await offloader.run(name, **options)
    except (TierError, TierDamagedError) as exc:
        report = OffloadReport(name, "")
        report.error = str(exc)
        return report
