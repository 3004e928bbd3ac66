"""Policies run by themselves: the driver of a namespace's policy schedule (`dlog.core.policies`).

A `PolicyRunner` belongs to a process that runs anyway (`dlog standalone` runs one per namespace;
a serving-tier server runs one for the streams it owns, passing `streams=`). Each round it
refreshes the stream list, asks the schedule which streams are due, and for each: reads the
stream's settings, claims the running of its policies (`SegmentStore.claim_runner`: one runner per
stream, for as long as its ZooKeeper session lives; a stream another runner holds is left to it),
and applies retention through `Namespace.apply_retention`, the very path `dlog retention apply`
takes, which is safe beside live writers and readers (L7). A failure is logged once per stream per
failure streak and retried with back-off; it never stops the runner or touches other streams.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bookkeeper.errors import DlogError
from dlog.core.policies import PolicyLimits, PolicySchedule, has_policy
from dlog.segments.port import StreamNotFoundError

if TYPE_CHECKING:
    from dlog.namespace import Namespace

log = logging.getLogger(__name__)


@dataclass
class PolicyStats:
    """What a runner did, for metrics and the status page."""

    rounds: int = 0
    runs: int = 0  # streams whose policy was applied
    segments_removed: int = 0
    held_elsewhere: int = 0  # streams skipped because another runner holds them
    failures: int = 0
    last_removed: dict[str, int] = field(default_factory=dict)  # stream -> segments removed at its last run


class PolicyRunner:
    """Applies the policies of one namespace's streams on their schedule."""

    def __init__(self, namespace: Namespace, *, limits: PolicyLimits | None = None, runner_id: str | None = None,
                 streams: Callable[[], Iterable[str]] | None = None) -> None:
        """`streams`: the streams this runner looks after (a server: those it owns); by default
        every stream of the namespace, listed again every `limits.list_interval_ms`."""
        self.namespace = namespace
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
            if has_policy(config):
                holder = await namespace.store.claim_runner(stream, self.runner_id)
                if holder is not None:
                    self.stats.held_elsewhere += 1
                else:
                    removed = await namespace.apply_retention(stream)
                    self.stats.runs += 1
                    self.stats.segments_removed += len(removed)
                    self.stats.last_removed[stream] = len(removed)
                    if removed:
                        log.info("retention of stream %r removed %d segment(s) up to sequence %d",
                                 stream, len(removed), removed[-1].sequence)
            self.schedule.ran(stream, config, namespace.clock.wall_ms())
            self._failing.discard(stream)
        except StreamNotFoundError:
            self.schedule.forget(stream)
            self._failing.discard(stream)
        except DlogError as exc:  # retried later; other streams go on
            self.stats.failures += 1
            wait_ms = self.schedule.failed(stream, namespace.clock.wall_ms())
            if stream not in self._failing:
                self._failing.add(stream)
                log.warning("policies of stream %r failed (retrying in %.1f s, then backing off): %s",
                            stream, wait_ms / 1000, exc)

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
