"""Policies run by themselves: the driver of a namespace's policy schedule (`dlog.core.policies`).

A `PolicyRunner` belongs to a process that runs anyway (`dlog standalone` runs one per namespace;
a serving-tier server runs one for the streams it owns, passing `streams=`). Each round it
refreshes the stream list, asks the schedule which streams are due, and for each: reads the
stream's settings, claims the running of its policies (`SegmentStore.claim_runner`: one runner per
stream, for as long as its ZooKeeper session lives; a stream another runner holds is left to it),
and applies retention through `Namespace.apply_retention` (then key compaction on a stream with
`--compaction on`: `dlog.compaction`, as `dlog compact` would), the very path `dlog retention apply`
takes, which is safe beside live writers and readers (L7); on a stream with a tier it then runs
the offloader (`dlog.offload`: offloads the due segments, deletes the due bookie copies), as
`dlog offload` would, unless the runner was made with `offload=False`. A failure (a tier error
too: the offloader reports it rather than raising) is logged once per stream per failure streak
and retried with back-off; it never stops the runner or touches other streams.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bookkeeper.errors import DlogError
from dlog.compaction import Compactor
from dlog.core import backlog
from dlog.core.policies import PolicyLimits, PolicySchedule, has_policy, runs_offloader
from dlog.offload import Offloader, OffloadReport, offload_quietly
from dlog.segments.port import StreamNotFoundError

if TYPE_CHECKING:
    from dlog.namespace import Namespace

log = logging.getLogger(__name__)
TIER_STREAMS_LABELLED_MAX = 100  # streams counted by name in `TierStats.streams`; the rest under OTHER_STREAMS
OTHER_STREAMS = "_other"
BACKLOGS_LABELLED_MAX = 1000  # (stream, subscription) backlog fractions kept for the metric; the rest not shown


@dataclass
class TierCounts:
    offloaded_segments: int = 0
    offloaded_bytes: int = 0  # bytes of Parquet files written to the tier
    offload_failures: int = 0  # runs that ended with an error
    bookie_copies_deleted: int = 0


@dataclass
class TierStats:
    """What a runner's offloads did: in total, and per stream for the first
    TIER_STREAMS_LABELLED_MAX streams (a metric label's values stay bounded)."""

    total: TierCounts = field(default_factory=TierCounts)
    streams: dict[str, TierCounts] = field(default_factory=dict)

    def add(self, report: OffloadReport) -> None:
        stream = report.stream if (report.stream in self.streams
                                   or len(self.streams) < TIER_STREAMS_LABELLED_MAX) else OTHER_STREAMS
        for counts in (self.total, self.streams.setdefault(stream, TierCounts())):
            counts.offloaded_segments += len(report.offloaded)
            counts.offloaded_bytes += sum(done.size_bytes for done in report.offloaded)
            counts.offload_failures += 1 if report.error else 0
            counts.bookie_copies_deleted += len(report.bookie_copies_deleted)


@dataclass
class PolicyStats:
    """What a runner did, for metrics and the status page."""

    rounds: int = 0
    runs: int = 0  # streams whose policy was applied
    segments_removed: int = 0
    held_elsewhere: int = 0  # streams skipped because another runner holds them
    failures: int = 0
    last_removed: dict[str, int] = field(default_factory=dict)  # stream -> segments removed at its last run
    tier: TierStats = field(default_factory=TierStats)
    compactions: int = 0  # compactions swapped in (`--compaction on` streams)
    # (stream, subscription) -> its backlog over the nearest limit at the stream's last run (streams
    # with backlog limits only; at most BACKLOGS_LABELLED_MAX pairs: a metric label's values stay bounded)
    backlogs: dict[tuple[str, str], float] = field(default_factory=dict)
    backlogs_unlabelled: int = 0  # pairs left out at the last runs for the bound

    def set_backlogs(self, stream: str, found: list[backlog.Backlog]) -> None:
        for key in [key for key in self.backlogs if key[0] == stream]:
            del self.backlogs[key]
        for item in found:
            if len(self.backlogs) >= BACKLOGS_LABELLED_MAX:
                self.backlogs_unlabelled += 1
                continue
            self.backlogs[(stream, item.subscription)] = item.fraction


class PolicyRunner:
    """Applies the policies of one namespace's streams on their schedule."""

    def __init__(self, namespace: Namespace, *, limits: PolicyLimits | None = None, runner_id: str | None = None,
                 streams: Callable[[], Iterable[str]] | None = None, retention: bool = True,
                 offload: bool = True) -> None:
        """`streams`: the streams this runner looks after (a server: those it owns); by default
        every stream of the namespace, listed again every `limits.list_interval_ms`. `retention`,
        `offload`: which policies it applies (`dlog tier daemon` only offloads; `--no-offload`
        leaves offloading to others)."""
        self.namespace = namespace
        self.retention = retention
        self.offloader = Offloader(namespace) if offload else None
        self.schedule = PolicySchedule(limits)
        self.limits = self.schedule.limits
        self.runner_id = runner_id or f"policy-runner-{uuid.uuid4().hex[:12]}"
        self._streams = streams
        self._listed_ms: int | None = None
        self._failing: set[str] = set()
        self.stats = PolicyStats()

    async def run_round(self) -> None:
        """One round: refresh the stream list when due, then look at every due stream (bounded)."""
        clock = self.namespace.clock
        now_ms = clock.wall_ms()
        if self._streams is not None:
            self.schedule.known(self._streams(), now_ms)
        elif self._listed_ms is None or now_ms - self._listed_ms >= self.limits.list_interval_ms:
            self.schedule.known(await self.namespace.list_streams(), now_ms)
            self._listed_ms = now_ms
        for stream in self.schedule.due(now_ms):
            await self._look_at(stream)
        self.stats.rounds += 1

    async def _look_at(self, stream: str) -> None:
        namespace = self.namespace
        try:
            config = await namespace.config(stream)
            tier = await namespace.tier_policy(stream, config)
            offloader = self.offloader if runs_offloader(config, tier) else None
            if (self.retention and has_policy(config, tier)) or offloader is not None:
                holder = await namespace.store.claim_runner(stream, self.runner_id)
                if holder is not None:
                    self.stats.held_elsewhere += 1
                else:
                    if self.retention:
                        await self._retention(stream)
                        if backlog.has_limits(config):
                            self.stats.set_backlogs(stream, await namespace.backlogs(stream))
                    if self.retention and config.compaction:
                        await self._compact(stream)
                    self.stats.runs += 1
                    if offloader is not None and (error := await self._offload(offloader, stream)):
                        self._failed(stream, error)
                        return
            self.schedule.ran(stream, config, namespace.clock.wall_ms(), tier)
            self._failing.discard(stream)
        except StreamNotFoundError:
            self.schedule.forget(stream)
            self._failing.discard(stream)
        except DlogError as exc:  # retried later; other streams go on
            self._failed(stream, str(exc))

    def _failed(self, stream: str, error: str) -> None:
        self.stats.failures += 1
        wait_ms = self.schedule.failed(stream, self.namespace.clock.wall_ms())
        if stream not in self._failing:
            self._failing.add(stream)
            log.warning("policies of stream %r failed (retrying in %.1f s, then backing off): %s",
                        stream, wait_ms / 1000, error)

    async def _retention(self, stream: str) -> None:
        removed = await self.namespace.apply_retention(stream)
        self.stats.segments_removed += len(removed)
        self.stats.last_removed[stream] = len(removed)
        if removed:
            log.info("retention of stream %r removed %d segment(s) up to sequence %d",
                     stream, len(removed), removed[-1].sequence)

    async def _compact(self, stream: str) -> None:
        report = await Compactor(self.namespace).run(stream)
        if report.ledger_id is not None:
            self.stats.compactions += 1
            log.info("stream %r: compacted segments %s: %d of %d records kept", stream, report.segments,
                     report.records_kept, report.records_read)

    async def _offload(self, offloader: Offloader, stream: str) -> str:
        """Offload what is due and delete the due bookie copies; a tier error is a failure of the
        stream's run (backed off), reported in its tier status by the offloader."""
        try:
            report = await offload_quietly(offloader, stream)
        except StreamNotFoundError:
            raise
        except DlogError as exc:  # a metadata error: the run failed as a tier error's would
            report = OffloadReport(stream, "", error=str(exc))
        self.stats.tier.add(report)
        if report.offloaded or report.bookie_copies_deleted:
            log.info("stream %r: offloaded %d segment(s) to %s, deleted %d bookie cop%s", stream,
                     len(report.offloaded), report.tier_uri, len(report.bookie_copies_deleted),
                     "y" if len(report.bookie_copies_deleted) == 1 else "ies")
        return f"offloading failed: {report.error}" if report.error else ""

    def wait_s(self) -> float:
        """How long to sleep before the next round: until the earliest due stream or the next
        reading of the stream list, whichever comes first."""
        now_ms = self.namespace.clock.wall_ms()
        next_ms = self.schedule.next_due_ms()
        wait_ms = self.limits.list_interval_ms if next_ms is None else next_ms - now_ms
        return min(max(wait_ms, self.limits.interval_min_ms // 4), self.limits.list_interval_ms) / 1000

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until `stop` is set."""
        while not stop.is_set():
            try:
                await self.run_round()
            except DlogError as exc:  # the stream list could not be read: try again next round
                log.warning("policy runner of namespace %r: %s", self.namespace.name, exc)
            try:
                async with asyncio.timeout(self.wait_s()):
                    await stop.wait()
            except TimeoutError:
                pass
