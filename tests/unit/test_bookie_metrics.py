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


def test_latency_probes_time_each_journal_record_and_pass_its_callback_through():
    from prometheus_client import CollectorRegistry

    from bookkeeper.bookie.probes import LatencyProbes

    class HeldJournal:  # durable when the test says so, as the journal's writer thread would
        def __init__(self) -> None:
            self.held: list[tuple] = []

        def append(self, record: bytes, callback, argument: object) -> None:
            self.held.append((record, callback, argument))

    registry = CollectorRegistry()
    probes = LatencyProbes(registry)
    journal = HeldJournal()
    timed = probes.timed(journal)
    answered: list[object] = []
    timed.append(b"one", answered.append, "first")
    timed.append(b"two", answered.append, "second")
    assert [record for record, _, _ in journal.held] == [b"one", b"two"] and answered == []
    probes.on_commit(3600.0)  # a group write longer than any wait here: the queue part is 0
    for _, callback, argument in journal.held:
        callback(argument)
    assert answered == ["first", "second"]  # each record's own callback, in order
    value = registry.get_sample_value
    assert value("dlog_bookie_journal_durable_seconds_count") == 2
    assert value("dlog_bookie_journal_durable_seconds_sum") > 0
    assert value("dlog_bookie_journal_queue_seconds_count") == 2
    assert value("dlog_bookie_journal_queue_seconds_sum") == 0


def test_a_bookie_without_latency_probes_appends_to_the_journal_itself(tmp_path):
    from bookkeeper.bookie.config import BookieConfig
    from bookkeeper.bookie.service import BookieService

    for name in ("plain", "probed"):  # the scrape reads the data directory's disk usage
        (tmp_path / name).mkdir()
    plain = BookieService(BookieConfig(data_dir=tmp_path / "plain"))
    assert plain.probes is None and plain.core.journal is plain.journal
    assert plain.metrics.registry.get_sample_value("dlog_bookie_journal_queue_seconds_count") is None
    probed = BookieService(BookieConfig(data_dir=tmp_path / "probed", latency_probes=True))
    assert probed.probes is not None and probed.core.journal is not probed.journal
    assert probed.metrics.registry.get_sample_value("dlog_bookie_journal_queue_seconds_count") == 0
