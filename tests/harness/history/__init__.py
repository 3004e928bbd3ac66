"""The one history and the one checker of every fault test and simulator.

`History` (recorder.py) records operations Jepsen-style (invoke, then ok / fail / unknown) and
facts, with an injected clock: `time.monotonic()` on real processes, simulated time in the
simulators. `check` runs the checks that apply to the events present: the ledger checks A2-A10
(ledger.py) for what the ledger simulator recorded, the stream checks L1-L7 and liveness
(stream.py) for what stream clients recorded, on real processes (tests/faults, the soak) and in
the stream simulator alike, and the producer checks (producers.py: duplicates and losses per
idempotent producer of the serving tier) for what the simulator's producers recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .ledger import LedgerRecorder, check_ledger, has_ledger_events
from .producers import check_producers, has_producer_events
from .recorder import Anomaly, History, Report, load, offset_list
from .stream import (
    ANOMALY_KINDS,
    DUPLICATE,
    LIVENESS,
    LOST,
    METADATA,
    NEVER_WRITTEN,
    NON_MONOTONIC,
    OFFSET_CONFLICT,
    READER_DIVERGED,
    STALE_WRITE,
    UNKNOWN_SEGMENT,
    check_stream,
    has_stream_events,
    snapshot_stream_metadata,
)

__all__ = ["ANOMALY_KINDS", "Anomaly", "DUPLICATE", "History", "LIVENESS", "LOST", "LedgerRecorder", "METADATA",
           "NEVER_WRITTEN", "NON_MONOTONIC", "OFFSET_CONFLICT", "READER_DIVERGED", "Report", "STALE_WRITE",
           "UNKNOWN_SEGMENT", "check", "check_file", "load", "offset_list", "snapshot_stream_metadata"]


def check(events: Iterable[dict[str, Any]], *, resume_bound_s: float | None = None,
          final_ledger: Any = None) -> Report:
    """Every anomaly in a history: ledger promises when the ledger simulator recorded it (its final
    metadata in `final_ledger`), stream promises when stream clients did; empty means it passed."""
    events = list(events)
    report = Report()
    if has_ledger_events(events) or final_ledger is not None:
        for problem in check_ledger(events, final_ledger):
            kind, _, message = problem.partition(": ")
            report.anomalies.append(Anomaly(kind, message))
    if has_stream_events(events):
        stream = check_stream(events, resume_bound_s=resume_bound_s)
        report.anomalies += stream.anomalies
        report.stats.update(stream.stats)
    if has_producer_events(events):
        anomalies, stats = check_producers(events)
        report.anomalies += anomalies
        report.stats.update(stats)
    return report


def check_file(path: Path | str, *, resume_bound_s: float | None = None) -> Report:
    return check(load(path), resume_bound_s=resume_bound_s)
