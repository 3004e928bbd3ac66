"""The bookie's own measurements that are not simple counters."""

from __future__ import annotations

import gc

from bookkeeper.bookie.metrics import BookieMetrics


def samples(metrics: BookieMetrics) -> dict[tuple[str, str], float]:
    return {(sample.name, sample.labels.get("generation", "")): sample.value
            for family in metrics.gc_pause_seconds.collect() for sample in family.samples}


def test_cycle_collections_are_timed_while_installed_and_only_then():
    metrics = BookieMetrics(service=None)  # type: ignore[arg-type]  # the collector is not scraped
    metrics.time_gc_pauses()
    metrics.time_gc_pauses()  # installing twice must not count twice
    try:
        gc.collect()
        gc.collect(0)
    finally:
        metrics.stop_timing_gc_pauses()
    timed = samples(metrics)
    assert timed[("dlog_bookie_python_gc_pause_seconds_count", "2")] == 1
    assert timed[("dlog_bookie_python_gc_pause_seconds_count", "0")] >= 1
    assert timed[("dlog_bookie_python_gc_pause_seconds_sum", "2")] > 0
    gc.collect()
    assert samples(metrics)[("dlog_bookie_python_gc_pause_seconds_count", "2")] == 1
