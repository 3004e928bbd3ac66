"""The stream checks: what a history of stream operations must never show (L1-L7).

Every client operation is recorded Jepsen-style as an *invoke* event, then one completion: ``ok``,
``fail`` (certainly not done) or ``unknown`` (maybe done: a fenced or timed-out write). A write that
never completes (its process was killed) counts as unknown. Readers record every record they hand
out. After the run, a fresh reader's full read (``final``) and snapshots of the segment list read
straight from ZooKeeper (``metadata``) join the history, and `check` looks for:

    lost             an acknowledged write missing from the final read (unless its data was removed
                     on purpose: truncated, retention, a ledger deleted by the test); for a ledger
                     deleted under a live writer (fault `delete_ledger`), a write acknowledged into it
                     more than DELETION_NOTICE_S after the deletion, or by a writer session that did
                     not fail after the deletion (it kept acknowledging into a ledger that no longer
                     existed and ended as if nothing happened): it fails with a LedgerDeletedError
                     naming the ledger, unless another error ended it first
    never_written    a value read that no write ever invoked
    duplicate        a value twice in the final read (or twice in one reader)
    offset_conflict  two values at one offset, or a write acknowledged at an offset that holds
                     another value
    reader_diverged  a reader's records are not a contiguous run of the final stream (a prefix of
                     it for readers that started at the earliest record)
    non_monotonic    offsets that do not increase in stream order (segment sequence, entry, slot)
    unknown_segment  a record in a ledger that no segment list ever named (L3)
    stale_write      a write of a replaced writer that was invoked after another writer opened the
                     stream and still succeeded (L1)
    metadata         a broken segment-list invariant (L3, L4): sequences not strictly increasing,
                     more than one in-progress segment or one that is not last, a completed
                     segment whose last entry is below an acknowledged entry, a sealed segment
                     that changed, a closed ledger that disagrees with its segment
    liveness         after the last heal, writes or tailing reads did not resume within the bound,
                     or the stream could not be sealed and read back, or a client recorded that it
                     hung (a write future or a wait_writable caller never answered)
    under_replicated the replication check (tests/harness/replication.py) found an entry of a
                     completed segment missing from, or different on, a live member of its write set

and the L5/L7 promises of promises.py: writer_death, reader_behind, truncation_ignored,
retention, segment_size, refused, slow_write; and V4 (positions.py): `position`, stream positions
that are not dense, not unique or that change, where the clients recorded them.

Offsets are stored as ``[ledger_id, entry_id, slot]``. Ledger-id order is NOT stream order: the
checker orders offsets by the sequence of the ledger's segment, taken from the metadata snapshots.

Events come from the one recorder (`recorder.History`): real processes share a JSON-lines file,
the stream simulator records in memory on simulated time; both are checked by `check_stream`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import positions, promises
from .recorder import Anomaly, Report

LOST = "lost"
NEVER_WRITTEN = "never_written"
DUPLICATE = "duplicate"
OFFSET_CONFLICT = "offset_conflict"
READER_DIVERGED = "reader_diverged"
NON_MONOTONIC = "non_monotonic"
UNKNOWN_SEGMENT = "unknown_segment"
STALE_WRITE = "stale_write"
METADATA = "metadata"
LIVENESS = "liveness"
UNDER_REPLICATED = "under_replicated"
ANOMALY_KINDS = (LOST, NEVER_WRITTEN, DUPLICATE, OFFSET_CONFLICT, READER_DIVERGED, NON_MONOTONIC,
                 UNKNOWN_SEGMENT, STALE_WRITE, METADATA, LIVENESS, UNDER_REPLICATED, *promises.PROMISE_KINDS,
                 positions.POSITION)

METADATA_SNAPSHOT_TRIES_MAX = 20
DELETION_NOTICE_S = 1.0  # a writer learns of its ledger's deletion (a ZooKeeper watch) within this

OffsetKey = tuple[int, int, int]


# ---------------------------------------------------------------------------------- metadata


async def snapshot_stream_metadata(zk: Any, segments_path: str, client: Any = None) -> dict[str, Any]:
    """The segment list of one stream as ZooKeeper holds it, read raw (no validation), consistent:
    read the list node's version before and after the segments and retry if it moved (every
    segment-list change sets that node). With a BookKeeper `client`, each segment's ledger
    metadata is added (state and last entry, or "missing")."""
    for _ in range(METADATA_SNAPSHOT_TRIES_MAX):
        data, version = await zk.get(segments_path)
        children = await zk.children(segments_path)
        nodes = await asyncio.gather(*(zk.get_or_none(f"{segments_path}/{child}") for child in children))
        if (await zk.get(segments_path))[1] != version:
            continue
        segments = []
        for child, node in zip(children, nodes):
            if node is None:
                continue
            try:
                segment = json.loads(node[0])
            except ValueError:
                segment = {"unparsable": node[0][:200].decode("utf-8", "replace")}
            segments.append({"node": child, **segment})
        try:
            max_sequence = int(json.loads(data)["max_sequence"])
        except (ValueError, KeyError, TypeError):
            max_sequence = None
        snapshot: dict[str, Any] = {"version": version, "max_sequence": max_sequence, "segments": segments}
        if client is not None:
            snapshot["ledgers"] = await _ledger_states(client, segments)
        return snapshot
    raise RuntimeError(f"the segment list at {segments_path} kept changing while it was read")


async def _ledger_states(client: Any, segments: list[dict[str, Any]]) -> dict[str, Any]:
    from bookkeeper.errors import MetadataNotFoundError, NoSuchLedgerError

    states: dict[str, Any] = {}
    for segment in segments:
        ledger_id = segment.get("ledger_id")
        if not isinstance(ledger_id, int):
            continue
        try:
            metadata, _ = await client.ledger_metadata(ledger_id)
        except (NoSuchLedgerError, MetadataNotFoundError):
            states[str(ledger_id)] = {"state": "missing"}
            continue
        states[str(ledger_id)] = {"state": metadata.state.value, "last_entry": metadata.last_entry_id}
    return states


# ---------------------------------------------------------------------------------- checking


@dataclass(slots=True)
class _Op:
    op: str
    process: str
    f: str
    invoke_t: float
    value: Any = None
    type: str = "unknown"  # until a completion says otherwise (a killed process never answers)
    complete_t: float | None = None
    offset: OffsetKey | None = None
    error: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


class _Checker:
    def __init__(self, events: Iterable[dict[str, Any]], resume_bound_s: float | None) -> None:
        self.events = sorted(events, key=lambda event: event["t"])
        self.resume_bound_s = resume_bound_s
        self.anomalies: list[Anomaly] = []
        self.ops: dict[str, _Op] = {}
        self.reads: dict[str, list[tuple[OffsetKey, str, float]]] = defaultdict(list)
        self.reader_starts: dict[str, str] = {}
        self.lagging: set[str] = set()  # reader families that read slowly on purpose
        self.snapshots: list[dict[str, Any]] = []
        self.final: list[tuple[OffsetKey, str]] | None = None
        self.final_error: str | None = None
        self.removed_ledgers: set[int] = set()
        self.deleted_under_writer: dict[int, float] = {}  # ledger -> when the test deleted it
        self.writer_failures: list[tuple[str, float]] = []  # (writer session, when) of deaths and failed closes
        self.truncations: list[OffsetKey] = []
        self.heals: list[float] = []
        self.liveness_failures: list[str] = []
        self.renewed: Counter[str] = Counter()  # readers that reopened their namespace (reported)
        self.sequence_of: dict[int, int] = {}
        self._truncated: set[int] | None = None
        # stream positions (V4), where the clients recorded them: (reader, offset, value, position)
        self.read_positions: list[tuple[str, OffsetKey, str, int | None]] = []
        self.final_positions: list[int | None] | None = None  # aligned with `final`
        self._parse()

    def add(self, kind: str, message: str) -> None:
        self.anomalies.append(Anomaly(kind, message))

    # ------------------------------------------------------------------ parsing

    def _parse(self) -> None:
        for event in self.events:
            kind, type_ = event.get("f"), event.get("type")
            if "op" in event and type_ == "invoke":
                self.ops[event["op"]] = _Op(event["op"], event["process"], kind, event["t"],
                                            event.get("value"), fields=event)
            elif "op" in event and type_ in ("ok", "fail", "unknown"):
                op = self.ops.get(event["op"])
                if op is None:
                    self.add(METADATA if kind != "write" else NEVER_WRITTEN,
                             f"{event['process']} completed op {event['op']} that was never invoked")
                    continue
                op.type, op.complete_t, op.error = type_, event["t"], event.get("error")
                if kind == "close_writer" and type_ == "fail":
                    self.writer_failures.append((event["process"], event["t"]))
                if event.get("offset") is not None:
                    op.offset = tuple(event["offset"])  # type: ignore[assignment]
                op.fields = {**op.fields, **event}
            elif kind == "read":
                self.reads[event["process"]].append((tuple(event["offset"]), event["value"], event["t"]))
                if "position" in event:
                    self.read_positions.append((event["process"], tuple(event["offset"]), event["value"],
                                                event["position"]))
            elif kind == "open_reader":
                self.reader_starts.setdefault(event["process"], str(event.get("start", "earliest")))
                if event.get("lagging"):
                    self.lagging.add(_family(event["process"]))
            elif kind == "metadata":
                self.snapshots.append(event)
            elif kind == "final":
                if type_ == "ok":
                    self.final = [(tuple(record[0]), record[1]) for record in event["records"]]  # type: ignore[misc]
                    if all(len(record) > 2 for record in event["records"]):
                        self.final_positions = [record[2] for record in event["records"]]
                else:
                    self.final, self.final_error = None, event.get("error", "failed")
            elif kind == "removed":
                self.removed_ledgers.update(int(ledger_id) for ledger_id in event["ledgers"])
            elif kind == "fault" and event.get("kind") == "delete_ledger":
                self.deleted_under_writer.setdefault(int(event["ledger"]), event["t"])
            elif kind == "writer_died":
                self.writer_failures.append((event["process"], event["t"]))
            elif kind == "truncated":
                self.truncations.append(tuple(event["before"]))  # type: ignore[arg-type]
            elif kind == "heal":
                self.heals.append(event["t"])
            elif kind == "liveness" and type_ == "fail":
                self.liveness_failures.append(event.get("what", "?"))
            elif kind == "renewed":
                self.renewed[event.get("what", "?")] += 1
            elif kind == "check" and event.get("process") == "replication" and type_ == "fail":
                for problem in event.get("problems", []):
                    self.add(UNDER_REPLICATED, problem)
        for snapshot in self.snapshots:
            for segment in snapshot.get("segments", []):
                ledger_id, sequence = segment.get("ledger_id"), segment.get("sequence")
                if not isinstance(ledger_id, int) or not isinstance(sequence, int):
                    continue
                known = self.sequence_of.setdefault(ledger_id, sequence)
                if known != sequence:
                    self.add(METADATA, f"ledger {ledger_id} is segment {known} in one snapshot and "
                                       f"segment {sequence} in another")

    # ------------------------------------------------------------------ helpers

    def key(self, offset: OffsetKey) -> tuple[int, int, int] | None:
        sequence = self.sequence_of.get(offset[0])
        return None if sequence is None else (sequence, offset[1], offset[2])

    def _truncated_ledgers(self) -> set[int]:
        if self._truncated is None:
            last = self.snapshots[-1].get("segments", []) if self.snapshots else []
            self._truncated = {segment["ledger_id"] for segment in last
                               if segment.get("state") == "truncated" and isinstance(segment.get("ledger_id"), int)}
        return self._truncated

    def removed(self, offset: OffsetKey) -> bool:
        """Whether the record at `offset` was removed on purpose (so its absence is no loss)."""
        if (offset[0] in self.removed_ledgers or offset[0] in self._truncated_ledgers()
                or offset[0] in self.deleted_under_writer):
            return True
        key = self.key(offset)
        if key is None:
            return False
        for before in self.truncations:
            floor = self.key(before)
            if floor is not None and key < floor:
                return True
        return False

    def _writes(self) -> list[_Op]:
        return [op for op in self.ops.values() if op.f == "write"]

    # ------------------------------------------------------------------ checks

    def run(self) -> Report:
        writes = self._writes()
        self._check_final_read(writes)
        self._check_never_written(writes)
        self._check_offsets(writes)
        self._check_readers()
        self._check_monotonic()
        self._check_stale_writes(writes)
        self._check_metadata(writes)
        self._check_liveness(writes)
        promises.check_all(self, self.resume_bound_s)
        positions.check_positions(self, writes)
        return Report(self.anomalies, self._stats(writes))

    def _check_final_read(self, writes: list[_Op]) -> None:
        if self.final is None:
            self.add(LIVENESS, f"no full read of the stream after the faults healed ({self.final_error or 'none recorded'})")
            return
        final_values = Counter(value for _, value in self.final)
        for value, count in final_values.items():
            if count > 1:
                self.add(DUPLICATE, f"value {value!r} is {count} times in the final read")
        for op in writes:
            if op.type != "ok" or op.value in final_values:
                continue
            if op.offset is not None and op.offset[0] in self.deleted_under_writer:
                self._check_deleted_under_writer(op)
                continue
            if op.offset is not None and self.removed(op.offset):
                continue
            self.add(LOST, f"{op.process} write {op.value!r} was acknowledged at {_show(op.offset)} "
                           "but is not in the final read")

    def _check_deleted_under_writer(self, op: _Op) -> None:
        """A record acknowledged into a ledger the test deleted under its live writer is gone; that
        is no loss only if the writer stopped acknowledging at once and failed rather than ending as
        if all it acknowledged were still there (its error names the deletion, unless an unrelated
        one, a bookie failure, ended it first)."""
        assert op.offset is not None
        ledger_id = op.offset[0]
        deleted_at = self.deleted_under_writer[ledger_id]
        if op.complete_t is not None and op.complete_t > deleted_at + DELETION_NOTICE_S:
            self.add(LOST, f"{op.process} write {op.value!r} was acknowledged at {_show(op.offset)} "
                           f"{op.complete_t - deleted_at:.3f} s after ledger {ledger_id} was deleted under "
                           "its writer: into a ledger that no longer existed")
            return
        if not any(process == op.process and failed_at >= deleted_at for process, failed_at in self.writer_failures):
            self.add(LOST, f"{op.process} write {op.value!r} was acknowledged at {_show(op.offset)} in ledger "
                           f"{ledger_id}, which was deleted under its writer, and the writer never failed "
                           "after that: the loss went unreported")

    def _check_never_written(self, writes: list[_Op]) -> None:
        invoked = {op.value for op in writes}
        seen: set[str] = set()
        sources = [("final read", [(o, v) for o, v in self.final or []])]
        sources += [(process, [(o, v) for o, v, _ in records]) for process, records in self.reads.items()]
        for source, records in sources:
            for offset, value in records:
                if value not in invoked and value not in seen:
                    seen.add(value)
                    self.add(NEVER_WRITTEN, f"{source} returned {value!r} at {_show(offset)}, which no "
                                            "write ever invoked")

    def _check_offsets(self, writes: list[_Op]) -> None:
        values_at: dict[OffsetKey, set[str]] = defaultdict(set)
        where: dict[OffsetKey, list[str]] = defaultdict(list)
        observations = [(op.offset, op.value, f"{op.process} ack") for op in writes
                        if op.type == "ok" and op.offset is not None]
        observations += [(offset, value, "final read") for offset, value in self.final or []]
        observations += [(offset, value, process) for process, records in self.reads.items()
                         for offset, value, _ in records]
        for offset, value, source in observations:
            if value not in values_at[offset]:
                values_at[offset].add(value)
                where[offset].append(f"{value!r} ({source})")
        for offset, values in values_at.items():
            if len(values) > 1:
                self.add(OFFSET_CONFLICT, f"offset {_show(offset)} holds {len(values)} values: "
                                          f"{', '.join(where[offset][:4])}")

    def _check_readers(self) -> None:
        if self.final is None:
            return
        index_of = {offset: index for index, (offset, _) in enumerate(self.final)}
        for process, records in self.reads.items():
            values = Counter(value for _, value, _ in records)
            repeated = [value for value, count in values.items() if count > 1]
            if repeated:
                self.add(DUPLICATE, f"reader {process} returned {repeated[0]!r} {values[repeated[0]]} times "
                                    f"({len(repeated)} values repeated)")
            expected: int | None = None
            from_earliest = self.reader_starts.get(process, "earliest") == "earliest"
            for offset, value, _ in records:
                index = index_of.get(offset)
                if index is None:
                    if not self.removed(offset) and not self._below_final_start(offset):
                        self.add(READER_DIVERGED, f"reader {process} returned {value!r} at {_show(offset)}, "
                                                  "which is not in the final stream")
                        break
                    continue
                if expected is None and from_earliest and index != 0:
                    self.add(READER_DIVERGED, f"reader {process} started at the earliest record but its "
                                              f"first record of the final stream is #{index} {_show(offset)}: "
                                              f"it skipped {index} records")
                    break
                if expected is not None and index != expected:
                    gap = "skipped" if index > expected else "went back over"
                    self.add(READER_DIVERGED, f"reader {process} {gap} records: after final #{expected - 1} "
                                              f"it returned final #{index} {_show(offset)}")
                    break
                expected = index + 1

    def _below_final_start(self, offset: OffsetKey) -> bool:
        if not self.final:
            return False
        key, first = self.key(offset), self.key(self.final[0][0])
        return key is not None and first is not None and key < first

    def _check_monotonic(self) -> None:
        sources = [(process, [o for o, _, _ in records]) for process, records in self.reads.items()]
        sources.append(("final read", [o for o, _ in self.final or []]))
        unknown_ledgers: set[int] = set()
        for source, offsets in sources:
            previous: tuple[tuple[int, int, int], OffsetKey] | None = None
            for offset in offsets:
                key = self.key(offset)
                if key is None:
                    if (offset[0] not in unknown_ledgers and offset[0] not in self.removed_ledgers
                            and offset[0] not in self.deleted_under_writer):
                        unknown_ledgers.add(offset[0])
                        self.add(UNKNOWN_SEGMENT, f"{source} returned a record of ledger {offset[0]}, which "
                                                  "no segment list named")
                    continue
                if previous is not None and key <= previous[0]:
                    self.add(NON_MONOTONIC, f"{source} returned {_show(offset)} after {_show(previous[1])}")
                    break
                previous = (key, offset)

    def _check_stale_writes(self, writes: list[_Op]) -> None:
        opened = sorted((op.complete_t, op.process) for op in self.ops.values()
                         if op.f == "open_writer" and op.type == "ok" and op.complete_t is not None)
        if not opened:
            return
        opened_at = {process: t for t, process in opened}
        for op in writes:
            if op.type != "ok" or op.process not in opened_at:
                continue  # a write of no writer session (a sink commit) has no takeover to miss
            own_open = opened_at.get(op.process, float("-inf"))
            takeover = next(((t, process) for t, process in opened
                             if process != op.process and own_open < t < op.invoke_t), None)
            if takeover is not None:
                self.add(STALE_WRITE, f"{op.process} write {op.value!r} was invoked "
                                      f"{op.invoke_t - takeover[0]:.3f} s after {takeover[1]} took the "
                                      f"stream over, and still succeeded at {_show(op.offset)}")

    def _check_metadata(self, writes: list[_Op]) -> None:
        acked_max: dict[int, int] = {}
        for op in writes:
            if op.type == "ok" and op.offset is not None:
                acked_max[op.offset[0]] = max(acked_max.get(op.offset[0], -1), op.offset[1])
        sealed: dict[int, int] = {}  # sequence -> last entry once completed
        reported: set[str] = set()

        def report(message: str) -> None:
            if message not in reported:
                reported.add(message)
                self.add(METADATA, message)

        for snapshot in self.snapshots:
            for message in _snapshot_problems(snapshot, acked_max, sealed):
                report(message)

    def _check_liveness(self, writes: list[_Op]) -> None:
        for what in self.liveness_failures:
            self.add(LIVENESS, what)
        if not self.heals or self.resume_bound_s is None:
            return
        healed = self.heals[-1]
        bound = self.resume_bound_s
        after = [op for op in writes if op.invoke_t >= healed]
        if not after:
            return  # nobody wrote after the heal: nothing to resume
        resumed = [op for op in after if op.type == "ok" and op.complete_t is not None
                   and op.complete_t <= healed + bound]
        if not resumed:
            self.add(LIVENESS, f"no write invoked after the heal was acknowledged within {bound} s")
            return
        probe = min(resumed, key=lambda op: op.complete_t or 0.0)
        for family in sorted({_family(process) for process in self.reads} - self.lagging):
            times = [t for process, records in self.reads.items() if _family(process) == family
                     for _, value, t in records if value == probe.value]
            if not times or min(times) > (probe.complete_t or 0.0) + bound:
                self.add(LIVENESS, f"tailing reader {family} did not return {probe.value!r} (the first write "
                                   f"acknowledged after the heal) within {bound} s of its acknowledgement")

    def _stats(self, writes: list[_Op]) -> dict[str, Any]:
        outcomes = Counter(op.type for op in writes)
        return {"writes": len(writes), "ok": outcomes["ok"], "fail": outcomes["fail"],
                "unknown": outcomes["unknown"], "reads": sum(len(r) for r in self.reads.values()),
                "readers": len(self.reads), "final": len(self.final or []),
                "writers": len({op.process for op in self.ops.values() if op.f == "open_writer"}),
                "segments": len(self.sequence_of), "heals": len(self.heals),
                "renewed_readers": sum(self.renewed.values())}


def _snapshot_problems(snapshot: dict[str, Any], acked_max: dict[int, int],
                       sealed: dict[int, int]) -> list[str]:
    """L3/L4 on one consistent snapshot; `sealed` carries completed segments' ends across snapshots."""
    problems = []
    segments = snapshot.get("segments", [])
    ledgers = snapshot.get("ledgers", {})
    sequences = [segment.get("sequence") for segment in segments]
    if any(not isinstance(sequence, int) for sequence in sequences):
        return [f"a segment without a sequence number: {segments}"]
    if any(b <= a for a, b in zip(sequences, sequences[1:])):
        problems.append(f"segment sequence numbers {sequences} do not strictly increase")
    for segment in segments:
        node = segment.get("node")
        if node is not None and node.isdigit() and int(node) != segment["sequence"]:
            problems.append(f"segment node {node} holds sequence {segment['sequence']}")
    max_sequence = snapshot.get("max_sequence")
    if isinstance(max_sequence, int) and sequences and max(sequences) > max_sequence:
        problems.append(f"segment {max(sequences)} is above the list's max_sequence {max_sequence}")
    states = [segment.get("state") for segment in segments]
    in_progress = [segment["sequence"] for segment in segments if segment.get("state") == "in_progress"]
    if len(in_progress) > 1:
        problems.append(f"segments {in_progress} are all in progress; at most one may be")
    if in_progress and in_progress[-1] != sequences[-1]:
        problems.append(f"in-progress segment {in_progress[-1]} is not the last one (last is {sequences[-1]})")
    ledger_ids = [segment.get("ledger_id") for segment in segments]
    if len(set(ledger_ids)) != len(ledger_ids):
        problems.append(f"a ledger is in two segments: {ledger_ids}")
    for segment, state in zip(segments, states):
        if state not in ("completed", "truncated"):
            continue
        sequence, ledger_id, last_entry = segment["sequence"], segment.get("ledger_id"), segment.get("last_entry")
        if acked_max.get(ledger_id, -1) > last_entry:
            problems.append(f"segment {sequence} (ledger {ledger_id}) is {state} at entry {last_entry}, "
                            f"but entry {acked_max[ledger_id]} of it was acknowledged")
        before = sealed.setdefault(sequence, last_entry)
        if before != last_entry:
            problems.append(f"sealed segment {sequence} (ledger {ledger_id}) ended at entry {before}, "
                            f"later at {last_entry}")
        ledger = ledgers.get(str(ledger_id))
        if ledger and ledger.get("state") == "CLOSED" and ledger.get("last_entry") != last_entry:
            problems.append(f"segment {sequence} is {state} at entry {last_entry} but its ledger "
                            f"{ledger_id} is closed at entry {ledger.get('last_entry')}")
    return problems


def _family(process: str) -> str:
    """Reader sessions are named `<family>#<n>`; liveness is asked of each family."""
    return process.split("#", 1)[0]


def _show(offset: Any) -> str:
    return "?" if offset is None else ":".join(str(part) for part in offset)


def has_stream_events(events: Iterable[dict[str, Any]]) -> bool:
    return any(not str(event.get("f", "")).startswith("ledger_") for event in events)


def check_stream(events: Iterable[dict[str, Any]], *, resume_bound_s: float | None = None) -> Report:
    """Every stream anomaly in a history (see the module docstring); an empty report means it passed."""
    return _Checker(events, resume_bound_s).run()
