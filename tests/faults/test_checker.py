"""The history checker catches each kind of anomaly in a hand-made bad history (records lost with a
ledger deleted under a writer that said nothing among them), and passes a good one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.harness import history as h
from tests.harness.history import History, check, check_file, promises

# Stream order is segment order: ledger 20 is segment 1, ledger 10 is segment 2, so ledger-id
# order would be wrong here on purpose.
FIRST, SECOND = 20, 10


class Builder:
    """A good history: writer w1.1 writes a0..a5 (three per segment), reader r1#1 tails all of it,
    the final read returns all of it, the metadata is sound."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = 0.0
        self.ops = 0

    def event(self, process: str, f: str, type: str = "info", **fields: Any) -> dict[str, Any]:
        self.t += 1.0
        event = {"t": self.t, "process": process, "f": f, "type": type, **fields}
        self.events.append(event)
        return event

    def op(self, process: str, f: str, outcome: str | None, **fields: Any) -> str:
        self.ops += 1
        op = f"op-{self.ops}"
        invoke_fields = {key: value for key, value in fields.items() if key == "value"}
        self.event(process, f, "invoke", op=op, **invoke_fields)
        if outcome is not None:
            self.event(process, f, outcome, op=op, **fields)
        return op

    def write(self, process: str, value: str, offset: list[int] | None, outcome: str = "ok") -> str:
        fields: dict[str, Any] = {"value": value}
        if offset is not None:
            fields["offset"] = offset
        return self.op(process, "write", outcome, **fields)

    def snapshot(self, segments: list[tuple[int, int, str, int]], **extra: Any) -> None:
        self.event("monitor", "metadata", version=len(self.events), max_sequence=max(s for s, *_ in segments),
                   segments=[{"node": f"{s:018d}", "sequence": s, "ledger_id": ledger, "state": state,
                              "last_entry": last} for s, ledger, state, last in segments], **extra)


def good() -> Builder:
    b = Builder()
    b.snapshot([(1, FIRST, "in_progress", -1)])
    b.op("w1.1", "open_writer", "ok")
    b.event("r1#1", "open_reader", start="earliest")
    for index in range(3):
        b.write("w1.1", f"a{index}", [FIRST, index, 0])
        b.event("r1#1", "read", "ok", offset=[FIRST, index, 0], value=f"a{index}")
    b.snapshot([(1, FIRST, "completed", 2), (2, SECOND, "in_progress", -1)])
    for index in range(3, 6):
        b.write("w1.1", f"a{index}", [SECOND, index - 3, 0])
        b.event("r1#1", "read", "ok", offset=[SECOND, index - 3, 0], value=f"a{index}")
    b.write("w1.1", "a6", None, outcome="unknown")  # fenced: maybe written, maybe not
    b.write("w1.1", "a7", None, outcome="fail")
    b.snapshot([(1, FIRST, "completed", 2), (2, SECOND, "completed", 2)])
    b.event("final", "final", "ok", records=final_records())
    return b


def final_records() -> list[list[Any]]:
    return [[[FIRST, i, 0], f"a{i}"] for i in range(3)] + [[[SECOND, i - 3, 0], f"a{i}"] for i in range(3, 6)]


def replace_final(b: Builder, records: list[list[Any]]) -> None:
    final = next(e for e in b.events if e["f"] == "final")
    final["records"] = records


def test_a_good_history_passes() -> None:
    report = check(good().events)
    assert report.ok, report.summary()
    assert report.stats["ok"] == 6 and report.stats["unknown"] == 1 and report.stats["fail"] == 1


def test_an_unknown_write_may_be_present_or_absent() -> None:
    b = good()
    replace_final(b, final_records() + [[[SECOND, 2, 1], "a6"]])
    assert check(b.events).ok
    b = good()  # a write whose process was killed before it answered is unknown too
    b.op("w1.1", "write", None, value="a8")
    assert check(b.events).ok


def test_lost_acknowledged_write() -> None:
    b = good()
    replace_final(b, final_records()[:-1])
    report = check(b.events)
    assert report.kinds() == {h.LOST, h.READER_DIVERGED}, report.summary()  # r1 had read a5
    assert "a5" in report.anomalies[0].message


def test_a_record_read_that_was_never_written() -> None:
    b = good()
    b.event("r1#1", "read", "ok", offset=[SECOND, 2, 1], value="zz")
    replace_final(b, final_records() + [[[SECOND, 2, 1], "zz"]])
    assert h.NEVER_WRITTEN in check(b.events).kinds()


def test_duplicate_in_the_final_read() -> None:
    b = good()
    replace_final(b, final_records() + [[[SECOND, 2, 1], "a1"]])
    report = check(b.events)
    assert h.DUPLICATE in report.kinds(), report.summary()


def test_duplicate_within_one_reader() -> None:
    b = good()
    b.event("r2#1", "open_reader", start="latest")
    b.event("r2#1", "read", "ok", offset=[SECOND, 2, 0], value="a5")
    b.event("r2#1", "read", "ok", offset=[SECOND, 2, 0], value="a5")
    assert h.DUPLICATE in check(b.events).kinds()


def test_two_values_at_one_offset() -> None:
    b = good()
    b.write("w2.1", "b0", [SECOND, 1, 0])  # acknowledged at an offset that holds a4
    report = check(b.events)
    assert h.OFFSET_CONFLICT in report.kinds(), report.summary()


def test_reader_that_skipped_a_record() -> None:
    b = good()
    b.events = [e for e in b.events if not (e["f"] == "read" and e["value"] == "a4")]
    report = check(b.events)
    assert report.kinds() == {h.READER_DIVERGED}, report.summary()


def test_reader_that_started_at_earliest_but_missed_the_start() -> None:
    b = good()
    b.events = [e for e in b.events if not (e["f"] == "read" and e["value"] == "a0")]
    assert check(b.events).kinds() == {h.READER_DIVERGED}


def test_reader_that_read_a_record_the_final_stream_does_not_have() -> None:
    b = good()
    b.event("r1#1", "read", "ok", offset=[SECOND, 2, 1], value="a6")  # then recovery dropped it
    assert check(b.events).kinds() == {h.READER_DIVERGED}


def test_a_reader_starting_later_is_a_contiguous_run() -> None:
    b = good()
    b.event("r2#1", "open_reader", start="latest")
    for index, value in ((1, "a4"), (2, "a5")):
        b.event("r2#1", "read", "ok", offset=[SECOND, index, 0], value=value)
    assert check(b.events).ok


def test_non_monotonic_reader_offsets_in_segment_order() -> None:
    b = good()
    b.event("r2#1", "open_reader", start="latest")
    # ledger 10 < ledger 20, but segment 2 comes after segment 1: this goes backwards
    b.event("r2#1", "read", "ok", offset=[SECOND, 0, 0], value="a3")
    b.event("r2#1", "read", "ok", offset=[FIRST, 2, 0], value="a2")
    report = check(b.events)
    assert h.NON_MONOTONIC in report.kinds(), report.summary()


def test_ledger_id_order_is_not_taken_for_stream_order() -> None:
    b = good()  # the good history reads ledger 20 and then ledger 10
    assert h.NON_MONOTONIC not in check(b.events).kinds()


def test_a_record_of_a_ledger_no_segment_names() -> None:
    b = good()
    b.event("r2#1", "open_reader", start="latest")
    b.event("r2#1", "read", "ok", offset=[99, 0, 0], value="a5")
    assert h.UNKNOWN_SEGMENT in check(b.events).kinds()


def test_write_of_a_replaced_writer_that_succeeded_after_the_takeover() -> None:
    b = good()
    b.op("w2.1", "open_writer", "ok")
    b.write("w1.1", "a9", [SECOND, 2, 1])
    replace_final(b, final_records() + [[[SECOND, 2, 1], "a9"]])
    report = check(b.events)
    assert report.kinds() == {h.STALE_WRITE}, report.summary()


def test_old_writer_writes_invoked_before_the_takeover_may_still_succeed() -> None:
    b = good()
    op = "late"
    b.event("w1.1", "write", "invoke", op=op, value="a9")
    b.op("w2.1", "open_writer", "ok")
    b.event("w1.1", "write", "ok", op=op, value="a9", offset=[SECOND, 2, 1])
    replace_final(b, final_records() + [[[SECOND, 2, 1], "a9"]])
    assert check(b.events).ok


@pytest.mark.parametrize("segments, problem", [
    ([(1, FIRST, "in_progress", -1), (2, SECOND, "in_progress", -1)], "all in progress"),
    ([(1, FIRST, "in_progress", -1), (2, SECOND, "completed", 2)], "not the last"),
    ([(2, FIRST, "completed", 2), (1, SECOND, "completed", 2)], "strictly increase"),
    ([(1, FIRST, "completed", 1), (2, SECOND, "completed", 2)], "was acknowledged"),
    ([(1, FIRST, "completed", 2), (2, FIRST, "completed", 2)], "two segments"),
])
def test_metadata_invariants(segments, problem) -> None:
    b = good()
    b.snapshot(segments)
    report = check(b.events)
    assert h.METADATA in report.kinds(), report.summary()
    assert any(problem in anomaly.message for anomaly in report.anomalies), report.summary()


def test_a_sealed_segment_that_changed_and_a_ledger_closed_elsewhere() -> None:
    b = good()
    b.snapshot([(1, FIRST, "completed", 3), (2, SECOND, "completed", 2)])
    assert any("ended at entry 2, later at 3" in a.message for a in check(b.events).anomalies)
    b = good()
    b.snapshot([(1, FIRST, "completed", 2), (2, SECOND, "completed", 2)],
               ledgers={str(FIRST): {"state": "CLOSED", "last_entry": 4}})
    assert any("closed at entry 4" in a.message for a in check(b.events).anomalies)


def test_truncated_and_deleted_data_is_no_loss_but_data_above_the_truncation_point_is() -> None:
    b = good()
    b.event("tester", "truncated", before=[SECOND, 1, 0])
    replace_final(b, final_records()[4:])
    assert check(b.events).ok
    b = good()
    b.event("tester", "truncated", before=[SECOND, 1, 0])
    replace_final(b, final_records()[5:])
    assert check(b.events).kinds() == {h.LOST}
    b = good()
    b.event("tester", "removed", ledgers=[FIRST])
    replace_final(b, final_records()[3:])
    assert check(b.events).ok


def test_records_of_a_ledger_deleted_under_its_writer_are_lost_unless_the_writer_said_so_at_once() -> None:
    died = "LedgerDeletedError: ledger 20 of the in-progress segment 1 of stream 's' was deleted under its writer"
    b = good()
    b.event("nemesis", "fault", kind="delete_ledger", ledger=FIRST)
    b.event("w1.1", "writer_died", error=died)
    replace_final(b, final_records()[3:])
    assert check(b.events).ok  # gone, and the writer failed loudly naming the ledger
    b = good()
    b.event("nemesis", "fault", kind="delete_ledger", ledger=FIRST)
    replace_final(b, final_records()[3:])
    report = check(b.events)
    assert report.kinds() == {h.LOST} and "never failed after that" in report.anomalies[0].message
    b = good()
    b.event("nemesis", "fault", kind="delete_ledger", ledger=FIRST)
    b.write("w1.1", "late", [FIRST, 2, 1])  # acknowledged 2 s after the deletion
    b.event("w1.1", "writer_died", error=died)
    replace_final(b, final_records()[3:])
    report = check(b.events)
    assert report.kinds() == {h.LOST} and "after ledger 20 was deleted" in report.anomalies[0].message


def test_no_final_read_and_liveness_failures() -> None:
    b = good()
    b.events = [e for e in b.events if e["f"] != "final"]
    assert check(b.events).kinds() == {h.LIVENESS}
    b = good()
    b.event("final", "final", "fail", error="NoSuchLedgerError")
    assert h.LIVENESS in check(b.events).kinds()


def test_writes_and_reads_must_resume_after_the_heal() -> None:
    b = good()
    b.event("nemesis", "heal")
    b.write("w1.1", "a8", [SECOND, 2, 1])
    replace_final(b, final_records() + [[[SECOND, 2, 1], "a8"]])
    report = check(b.events, resume_bound_s=5.0)
    assert report.kinds() == {h.LIVENESS}  # reader r1 never returned a8
    assert "r1" in report.anomalies[0].message
    b.event("r1#1", "read", "ok", offset=[SECOND, 2, 1], value="a8")
    assert check(b.events, resume_bound_s=5.0).ok
    stalled = copy.deepcopy(b)
    for event in stalled.events:  # the first write after the heal took 100 s
        if event.get("value") == "a8" and event["type"] == "ok" and event["f"] == "write":
            event["t"] += 100
    stalled.events.sort(key=lambda e: e["t"])
    assert h.LIVENESS in check(stalled.events, resume_bound_s=5.0).kinds()


def test_history_file_round_trip_skips_a_torn_line(tmp_path: Path) -> None:
    recorded = History(tmp_path / "h.jsonl")
    op = recorded.invoke("w1.1", "write", value="a0")
    recorded.complete(op, "w1.1", "write", "ok", value="a0", offset=[FIRST, 0, 0])
    recorded.record("monitor", "metadata", version=1, max_sequence=1,
                    segments=[{"sequence": 1, "ledger_id": FIRST, "state": "completed", "last_entry": 0}])
    recorded.record("final", "final", "ok", records=[[[FIRST, 0, 0], "a0"]])
    recorded.close()
    with open(tmp_path / "h.jsonl", "ab") as file:
        file.write(b'{"t": 1e9, "process": "w1.1", "f": "wri')  # killed in the middle of a line
    report = check_file(tmp_path / "h.jsonl")
    assert report.ok and report.stats["ok"] == 1, report.summary()


def test_a_writer_death_needs_a_fault_or_a_takeover_to_explain_it() -> None:
    b = good()
    b.event("w1.1", "writer_died", error="WriterFencedError: taken over")
    report = check(b.events)
    assert report.kinds() == {promises.WRITER_DEATH}, report.summary()
    truncated = good()  # a routine operation explains nothing (L7)
    truncated.event("nemesis", "fault", kind="truncate")
    truncated.event("w1.1", "writer_died", error="WriterFencedError: taken over")
    assert check(truncated.events).kinds() == {promises.WRITER_DEATH}
    faulted = good()
    faulted.event("nemesis", "fault", kind="kill_bookie")
    faulted.event("w1.1", "writer_died", error="NotEnoughBookiesError")
    assert check(faulted.events).ok
    taken = good()
    taken.op("w2.1", "open_writer", "ok")  # another writer opened meanwhile: a takeover
    taken.event("w1.1", "writer_died", error="WriterFencedError: taken over")
    assert check(taken.events).ok


def test_a_tailing_reader_left_behind_when_it_stopped() -> None:
    b = good()
    b.t += 100.0
    b.event("r1#stop", "reader_stop", family="r1")
    assert check(b.events, resume_bound_s=10).ok  # r1 read a5, the last acknowledged record
    b.events = [e for e in b.events if not (e["f"] == "read" and e["value"] == "a5")]
    replace_final(b, final_records())
    report = check(b.events, resume_bound_s=10)
    assert promises.READER_BEHIND in report.kinds(), report.summary()
