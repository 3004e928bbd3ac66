"""A bookie's latency probes, on only with `--latency-probes` (what `dlog bench tail --explain`
starts its bookies with): where an add's time goes inside the bookie.

- `dlog_bookie_event_loop_lag_seconds`: how late a callback scheduled every LOOP_LAG_PERIOD_S runs
  (everything else the loop does delays it: reads, adds, answers, collector pauses).
- `dlog_bookie_journal_durable_seconds`: a journal record's append to the callback that says it is
  durable (`fdatasync` returned), per record.
- `dlog_bookie_journal_queue_seconds`: the same less the write + fdatasync of the group that made it
  durable (`dlog_bookie_journal_fsync_seconds`, always kept): the wait for its group's write to
  start (the previous group's fsync) plus the hop back to the loop and the callbacks before its own.

Without the option none of this exists: the core is handed the journal itself, and the journal its
usual commit hook. With it, the core is handed `TimedJournal`, which wraps each append's callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

from bookkeeper.bookie.ports import JournalPort
from bookkeeper.clock import perf_s

LOOP_LAG_PERIOD_S = 0.001
LATENCY_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class LatencyProbes:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.loop_lag_seconds = Histogram(
            "dlog_bookie_event_loop_lag_seconds", "How late a callback due every millisecond ran "
            "(--latency-probes)", buckets=LATENCY_BUCKETS_S, registry=registry)
        self.journal_durable_seconds = Histogram(
            "dlog_bookie_journal_durable_seconds", "A journal record's append to its durable callback "
            "(--latency-probes)", buckets=LATENCY_BUCKETS_S, registry=registry)
        self.journal_queue_seconds = Histogram(
            "dlog_bookie_journal_queue_seconds", "A journal record's append to durable callback less its "
            "group's write + fdatasync: the wait for the group to start and for the loop to call back "
            "(--latency-probes)", buckets=LATENCY_BUCKETS_S, registry=registry)
        self.group_write_s = 0.0  # the last committed group's write + fdatasync

    def timed(self, journal: JournalPort) -> TimedJournal:
        return TimedJournal(journal, self)

    def on_commit(self, seconds: float) -> None:
        """The journal's commit hook: runs before the group's callbacks."""
        self.group_write_s = seconds

    async def measure_loop_lag(self) -> None:
        """Until cancelled (the bookie's periodic tasks are, at stop)."""
        observe = self.loop_lag_seconds.observe
        while True:
            due = perf_s() + LOOP_LAG_PERIOD_S
            await asyncio.sleep(LOOP_LAG_PERIOD_S)
            observe(max(0.0, perf_s() - due))


class TimedJournal:
    """The journal as the core sees it (JournalPort), each record's wait observed."""

    def __init__(self, journal: JournalPort, probes: LatencyProbes) -> None:
        self._journal = journal
        self._probes = probes

    def append(self, record: bytes, callback: Callable[[object], None], argument: object) -> None:
        self._journal.append(record, self._durable, (perf_s(), callback, argument))

    def append_lazy(self, record: bytes) -> None:
        self._journal.append_lazy(record)

    def _durable(self, timed: object) -> None:
        appended_s: float
        callback: Callable[[object], None]
        argument: object
        appended_s, callback, argument = timed  # type: ignore[misc]  # what append() handed the journal
        waited_s = perf_s() - appended_s
        probes = self._probes
        probes.journal_durable_seconds.observe(waited_s)
        probes.journal_queue_seconds.observe(max(0.0, waited_s - probes.group_write_s))
        callback(argument)
