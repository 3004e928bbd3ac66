"""`dlog bench tail --explain`: where the write-to-tail latency goes.

Per sampled record, from the bench client's own timestamps: the writer's call to its write being
acknowledged (the write future done: the client's batching and send, the bookies' journal and
fdatasync, the answers back), and the acknowledgement to the tailing reader seeing the record (the
long-poll wake-up and the read). Beside them, from probes that run only with --explain: the client's
event-loop lag (a callback every LAG_PERIOD_S measuring how late it runs) and its cycle-collector
pauses (gc.callbacks); and from the bookies' /metrics, scraped before and after the run (the bench
starts them with --latency-probes, bookkeeper/bookie/probes.py): each journal record's append to
durable and the part of it outside its group's write + fdatasync (the queue), the groups' write +
fdatasync, the bookies' event-loop lag and collector pauses. Those are histograms, so their
percentiles are interpolated within buckets, as Prometheus's histogram_quantile does. The client's
batching and send is what remains of the acknowledgement once the bookie's part is taken out: a
difference of medians, not a distribution of its own.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bookkeeper.clock import perf_s
from dlog_tools.cluster import LocalCluster

LAG_PERIOD_S = 0.001  # the loop-lag probe's interval: 1,000 wake-ups a second
LAG_SAMPLES_MAX = 600_000  # the probe's samples kept at most (10 minutes at LAG_PERIOD_S)
SCRAPE_TIMEOUT_S = 10.0
FSYNC_HISTOGRAM = "dlog_bookie_journal_fsync_seconds"
GC_HISTOGRAM = "dlog_bookie_python_gc_pause_seconds"
DURABLE_HISTOGRAM = "dlog_bookie_journal_durable_seconds"  # these three with --latency-probes only
QUEUE_HISTOGRAM = "dlog_bookie_journal_queue_seconds"
LOOP_LAG_HISTOGRAM = "dlog_bookie_event_loop_lag_seconds"
HISTOGRAMS = (FSYNC_HISTOGRAM, GC_HISTOGRAM, DURABLE_HISTOGRAM, QUEUE_HISTOGRAM, LOOP_LAG_HISTOGRAM)


def quantile_ms(samples_s: list[float], fraction: float) -> float | None:
    if not samples_s:
        return None
    ordered = sorted(samples_s)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 3)


def stage(name: str, samples_s: list[float], source: str) -> dict[str, Any]:
    return {"stage": name, "p50_ms": quantile_ms(samples_s, 0.50), "p99_ms": quantile_ms(samples_s, 0.99),
            "max_ms": quantile_ms(samples_s, 1.0), "samples": len(samples_s), "source": source}


class ClientProbes:
    """The client's event-loop lag and cycle-collector pauses while running (`start`/`stop`)."""

    def __init__(self) -> None:
        self.lags_s: list[float] = []
        self.gc_pauses_s: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._gc_started = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._measure_lag())
        gc.callbacks.append(self._on_gc)

    async def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _measure_lag(self) -> None:
        while len(self.lags_s) < LAG_SAMPLES_MAX:
            due = perf_s() + LAG_PERIOD_S
            await asyncio.sleep(LAG_PERIOD_S)
            self.lags_s.append(max(0.0, perf_s() - due))

    def _on_gc(self, phase: str, _: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = perf_s()
        elif self._gc_started:
            self.gc_pauses_s.append(perf_s() - self._gc_started)


class TailExplainer:
    """One tail run's stages: `start()` before the first write, `time_ack(future, index)` for each
    write, `seen(index, now)` as the reader gets each record, `rows(...)` after the last."""

    def __init__(self, cluster: LocalCluster, count: int) -> None:
        self.cluster = cluster
        self.count = count
        self.acked_at = [0.0] * count
        self.seen_at = [0.0] * count
        self.probes = ClientProbes()
        self._before: Buckets = {}

    async def start(self) -> None:
        self._before = await asyncio.to_thread(scrape, self.cluster)
        self.probes.start()

    def time_ack(self, future: asyncio.Future[Any], index: int) -> None:
        future.add_done_callback(functools.partial(self._acked, index))

    def _acked(self, index: int, _: object) -> None:
        self.acked_at[index] = perf_s()

    def seen(self, index: int, now: float) -> None:
        self.seen_at[index] = now

    async def rows(self, rate_per_s: int, sent_at: Sequence[float] | Mapping[int, float],
                   latencies: list[float], call: str) -> list[dict[str, Any]]:
        await self.probes.stop()
        after = await asyncio.to_thread(scrape, self.cluster)
        indexes = range(self.count)
        return explain_rows(rate_per_s, latencies, [self.acked_at[index] - sent_at[index] for index in indexes],
                            [self.seen_at[index] - self.acked_at[index] for index in indexes], self.probes,
                            self._before, after, call)


Buckets = dict[str, dict[float, float]]  # histogram name -> upper bound -> cumulative count


def scrape(cluster: LocalCluster) -> Buckets:
    """The bookies' histogram buckets of HISTOGRAMS, summed over the bookies that serve HTTP
    (blocking: run it in a thread)."""
    totals: Buckets = {name: {} for name in HISTOGRAMS}
    for bookie in cluster.bookies:
        if bookie.http is None:
            continue
        with urllib.request.urlopen(f"{bookie.http}/metrics", timeout=SCRAPE_TIMEOUT_S) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name not in totals:
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    totals[family.name][bound] = totals[family.name].get(bound, 0.0) + sample.value
    return totals


def bucket_quantile_ms(bounds: dict[float, float], fraction: float) -> float | None:
    """Prometheus's histogram_quantile: linear within the bucket the rank falls in (the last
    finite bound when it falls in +Inf)."""
    ordered = sorted(bounds.items())
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    rank = fraction * total
    lower, below = 0.0, 0.0
    for bound, cumulative in ordered:
        if cumulative >= rank:
            if bound == float("inf"):
                return round(lower * 1000, 3)
            inside = cumulative - below
            share = (rank - below) / inside if inside else 1.0
            return round((lower + (bound - lower) * share) * 1000, 3)
        lower, below = bound, cumulative
    return round(lower * 1000, 3)


def histogram_stage(name: str, before: Buckets, after: Buckets, histogram: str) -> dict[str, Any]:
    """A stage from the difference of two scrapes of one histogram."""
    delta = {bound: count - before[histogram].get(bound, 0.0) for bound, count in after[histogram].items()}
    count = int(max(delta.values(), default=0))
    finite = [bound for bound, cumulative in sorted(delta.items()) if cumulative >= count and bound != float("inf")]
    return {"stage": name, "p50_ms": bucket_quantile_ms(delta, 0.50), "p99_ms": bucket_quantile_ms(delta, 0.99),
            "max_ms": round(finite[0] * 1000, 3) if finite and count else None, "samples": count,
            "source": f"bookies' {histogram} (bucketed)"}


def explain_rows(rate_per_s: int, end_to_end_s: list[float], write_ack_s: Iterable[float],
                 ack_seen_s: Iterable[float], probes: ClientProbes, before: Buckets,
                 after: Buckets, call: str = "write()") -> list[dict[str, Any]]:
    """The stages of one tail run, end to end first (`call`: what the bench called to write)."""
    acknowledged = stage(f"{call} call -> acknowledged (its future done)", list(write_ack_s),
                         "client timestamps")
    durable = histogram_stage("  bookie: journal append -> durable, per record", before, after, DURABLE_HISTOGRAM)
    rest = None
    if acknowledged["p50_ms"] is not None and durable["p50_ms"] is not None:
        rest = round(acknowledged["p50_ms"] - durable["p50_ms"], 3)
    rows = [stage(f"end to end: {call} call -> tailing reader has it", end_to_end_s, "client timestamps"),
            acknowledged,
            durable,
            histogram_stage("    of it: its group's write + fdatasync, per group", before, after, FSYNC_HISTOGRAM),
            histogram_stage("    of it: queue (waiting for the group's write, the loop's callback)", before,
                            after, QUEUE_HISTOGRAM),
            {"stage": "  the rest: client batching, send, loopback, bookie dispatch, answer", "p50_ms": rest,
             "p99_ms": None, "max_ms": None, "samples": None,
             "source": "difference of the two medians above (not a distribution)"},
            stage("acknowledged -> tailing reader has it (long-poll wake-up)", list(ack_seen_s),
                  "client timestamps"),
            stage("client event-loop lag", probes.lags_s, f"a callback every {LAG_PERIOD_S * 1000:g} ms"),
            histogram_stage("bookie event-loop lag", before, after, LOOP_LAG_HISTOGRAM),
            stage("client cycle-collector pauses", probes.gc_pauses_s, "gc.callbacks"),
            histogram_stage("bookie cycle-collector pauses", before, after, GC_HISTOGRAM)]
    return [{"rate_per_s": rate_per_s, **row} for row in rows]
