"""The ledger checks (A2-A10) over a history the ledger simulator recorded, and the recording helpers
it records through.

The simulator's clients record operations through `LedgerRecorder` into the one `History`:
invoke, then ok, fail or unknown (a fenced or timed-out add is "unknown": it may or may not be in
the ledger). Bookies record what they accepted and when it became durable; the metadata store
records every write; recoveries record when they counted the ledger fenced. `check_ledger` reads
those events in the order they were recorded and returns the broken promises, each naming its
letter; an empty list means the run was correct. Event names start with ``ledger_`` so one
history can hold ledger and stream events side by side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState
from bookkeeper.protocol.quorum import write_set
from tests.harness.sim.metastore import transition_problem

from .recorder import History

PREFIX = "ledger_"


class Operation:
    """A handle on one recorded operation: it records its completion, once."""

    __slots__ = ("recorder", "op", "client", "kind", "value", "result", "outcome")

    def __init__(self, recorder: LedgerRecorder, op: str, client: str, kind: str, value: Any) -> None:
        self.recorder, self.op, self.client, self.kind = recorder, op, client, kind
        self.value: Any = value  # add: payload; read: (first entry id, bound, "lac" | "closed")
        self.result: Any = None  # read: [(entry id, payload)] (also of a failed read); recover/close: entry
        self.outcome = "pending"

    def finish(self, outcome: str, now_ms: int, result: Any = None, error: BaseException | None = None) -> None:
        self.outcome = outcome
        if result is not None:
            self.result = result
        self.recorder.history.complete(self.op, self.client, PREFIX + self.kind, outcome, value=self.value,
                                       result=self.result, error=error)


class LedgerRecorder:
    """What the ledger simulator's clients, bookies and metadata store record."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.adds: dict[int, Operation] = {}  # entry id -> the add that invoked it
        self.ack_order: list[int] = []
        self._operations: list[Operation] = []

    def invoke(self, client: str, kind: str, now_ms: int, value: Any = None, final: bool = False,
               **fields: Any) -> Operation:
        op = self.history.invoke(client, PREFIX + kind, value=value, final=final, **fields)
        operation = Operation(self, op, client, kind, value)
        self._operations.append(operation)
        return operation

    def finish_pending(self, now_ms: int) -> None:
        """End of the run: an operation that never completed has an unknown outcome (and a read
        keeps what it had read, which the checks still judge)."""
        for operation in self._operations:
            if operation.outcome == "pending":
                operation.finish("unknown", now_ms)

    def add_invoked(self, client: str, entry_id: int, payload: bytes, now_ms: int) -> None:
        self.adds[entry_id] = self.invoke(client, "add", now_ms, payload, entry=entry_id)

    def add_acked(self, entry_id: int, now_ms: int, metadata: LedgerMetadata) -> None:
        self.adds[entry_id].finish("ok", now_ms, entry_id)
        self.ack_order.append(entry_id)
        members = tuple(metadata.ensemble_for(entry_id)[position] for position in
                        write_set(entry_id, metadata.ensemble_size, metadata.write_quorum))
        self.history.record("writer", PREFIX + "ack_set", entry=entry_id, members=members,
                            ack_quorum=metadata.ack_quorum)

    def add_unknown(self, entry_id: int, now_ms: int, error: BaseException) -> None:
        operation = self.adds[entry_id]
        if operation.outcome == "pending":
            operation.finish("unknown", now_ms, error=error)

    def add_accepted(self, bookie: str, entry_id: int, recovery: bool, now_ms: int) -> None:
        if not recovery:
            self.history.record(bookie, PREFIX + "accepted", entry=entry_id)

    def add_durable(self, bookie: str, entry_id: int, now_ms: int) -> None:
        self.history.record(bookie, PREFIX + "durable", entry=entry_id)

    def metadata_written(self, client: str, old: LedgerMetadata, new: LedgerMetadata) -> None:
        self.history.record(client, PREFIX + "metadata", old=old, new=new)

    def fencing_covered(self, client: str, now_ms: int, metadata: LedgerMetadata) -> None:
        self.history.record(client, PREFIX + "coverage", metadata=metadata)

    def lac_learned(self, operation: Operation, lac: int) -> None:
        self.history.record(operation.client, PREFIX + "lac", op=operation.op, lac=lac)


# ---------------------------------------------------------------------------------- checking


@dataclass(slots=True)
class _Op:
    index: int
    op: str
    client: str
    kind: str
    time_ms: float
    final: bool
    value: Any = None
    outcome: str = "pending"
    result: Any = None
    error: Any = None


@dataclass(slots=True)
class _Facts:
    ops: list[_Op] = field(default_factory=list)
    adds: dict[int, _Op] = field(default_factory=dict)
    ack_order: list[int] = field(default_factory=list)
    ack_write_sets: dict[int, tuple[float, tuple[str, ...], int]] = field(default_factory=dict)
    accepts: list[tuple[str, int, float]] = field(default_factory=list)
    durable_ms: dict[tuple[str, int], float] = field(default_factory=dict)
    coverages: list[tuple[str, float, LedgerMetadata]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lac_seen: dict[str, tuple[int, int]] = field(default_factory=dict)  # read op -> (lac, max acked)


def has_ledger_events(events: Iterable[dict[str, Any]]) -> bool:
    return any(str(event.get("f", "")).startswith(PREFIX) for event in events)


def _facts(events: Iterable[dict[str, Any]]) -> _Facts:
    """Everything the checks need, in record order (so "acknowledged before" means what it says)."""
    facts, by_op, max_acked = _Facts(), {}, -1
    for event in events:
        f, t = event.get("f", ""), event["t"]
        if not f.startswith(PREFIX):
            continue
        kind = f[len(PREFIX):]
        if event["type"] == "invoke":
            operation = _Op(len(facts.ops), event["op"], event["process"], kind, t, event.get("final", False),
                            event.get("value"))
            facts.ops.append(operation)
            by_op[operation.op] = operation
            if kind == "add":
                facts.adds[event["entry"]] = operation
        elif "op" in event and event["type"] in ("ok", "fail", "unknown"):
            operation = by_op[event["op"]]
            operation.outcome, operation.value = event["type"], event.get("value", operation.value)
            operation.result, operation.error = event.get("result"), event.get("error")
            if kind == "add" and event["type"] == "ok":
                facts.ack_order.append(operation.result)
                max_acked = max(max_acked, operation.result)
        elif kind == "ack_set":
            facts.ack_write_sets[event["entry"]] = (t, event["members"], event["ack_quorum"])
        elif kind == "accepted":
            facts.accepts.append((event["process"], event["entry"], t))
        elif kind == "durable":
            facts.durable_ms.setdefault((event["process"], event["entry"]), t)
        elif kind == "coverage":
            facts.coverages.append((event["process"], t, event["metadata"]))
        elif kind == "lac":
            facts.lac_seen[event["op"]] = (event["lac"], max_acked)
        elif kind == "metadata":
            facts.problems += _metadata_problems(event["process"], event["old"], event["new"], max_acked)
    return facts


def _metadata_problems(client: str, old: LedgerMetadata, new: LedgerMetadata, max_acked: int) -> list[str]:
    problems = []
    problem = transition_problem(old, new)
    if problem is not None:
        problems.append(f"metadata: write by {client}: {problem}")
    if old.state is LedgerState.OPEN and new.state is LedgerState.OPEN:
        first = new.last_ensemble[0]
        if first <= max_acked:  # A9
            problems.append(f"A9: {client} committed a fragment from entry {first}, but entry "
                            f"{max_acked} was already acknowledged on the old one")
    return problems


def check_ledger(events: Iterable[dict[str, Any]], final: LedgerMetadata) -> list[str]:
    """Every broken ledger promise of this run (empty: none)."""
    facts = _facts(events)
    problems = list(facts.problems)
    problems += _check_acks(facts)
    problems += _check_sealed(facts, final)
    problems += _check_reads(facts, final)
    problems += _check_fencing(facts)
    return problems


def _check_acks(facts: _Facts) -> list[str]:
    problems = []
    if facts.ack_order != list(range(len(facts.ack_order))):
        problems.append(f"A2: acknowledgements out of order or with gaps: {facts.ack_order[:20]}...")
    for entry_id, (acked_ms, members, ack_quorum) in sorted(facts.ack_write_sets.items()):
        durable = [bookie for bookie in members
                   if facts.durable_ms.get((bookie, entry_id), acked_ms + 1) <= acked_ms]
        if len(durable) < ack_quorum:
            problems.append(f"A2: entry {entry_id} acknowledged at {acked_ms} ms while durable only on "
                            f"{durable} of its write set {list(members)} (ack quorum {ack_quorum})")
    return problems


def _check_sealed(facts: _Facts, final: LedgerMetadata) -> list[str]:
    if final.state is not LedgerState.CLOSED:
        return [f"liveness: after every fault healed, the ledger is still {final.state.value}"]
    problems = []
    last = final.last_entry_id
    lost = [entry_id for entry_id in facts.ack_order if entry_id > last]
    if lost:
        problems.append(f"A3/A6: acknowledged entries {lost[:10]} are past the closed end {last}")
    for operation in facts.ops:
        if operation.kind in ("recover", "close") and operation.outcome == "ok" and operation.result != last:
            problems.append(f"A6/A10: {operation.client} {operation.kind} ended at entry "
                            f"{operation.result}, the ledger is closed at {last}")
    unknown = [entry_id for entry_id in range(last + 1) if entry_id not in facts.adds]
    if unknown:
        problems.append(f"A6: the closed ledger holds entries {unknown[:10]} nobody appended")
    elif final.length != sum(len(facts.adds[entry_id].value) for entry_id in range(last + 1)):
        problems.append(f"A6: closed length {final.length} is not the length of entries 0..{last}")
    return problems


def _check_reads(facts: _Facts, final: LedgerMetadata) -> list[str]:
    problems = []
    final_reads = [op for op in facts.ops if op.kind == "read" and op.final]
    if not final_reads or final_reads[-1].outcome != "ok":
        problems.append(f"A3: the closed ledger could not be read to its end after every fault healed "
                        f"({final_reads[-1].error if final_reads else 'no final read'})")
    elif final.state is LedgerState.CLOSED:
        got = {entry_id for entry_id, _ in final_reads[-1].result}
        missing = [entry_id for entry_id in facts.ack_order if entry_id not in got]
        if missing:
            problems.append(f"A3: acknowledged entries {missing[:10]} were not read back")
    for operation in facts.ops:
        if operation.kind != "read" or operation.value is None:
            continue
        first, bound, bound_kind = operation.value
        ids = [entry_id for entry_id, _ in operation.result or []]
        if ids != list(range(first, first + len(ids))):
            problems.append(f"order: {operation.client} read ids {ids[:10]} from {first}")
        for entry_id, payload in operation.result or []:
            add = facts.adds.get(entry_id)
            if add is None or add.value != payload:
                problems.append(f"values: {operation.client} read {payload!r} at entry {entry_id}, "
                                f"which was written as {add.value if add else None!r}")
            if entry_id > bound:
                problems.append(f"A4/A5: {operation.client} read entry {entry_id} past its bound {bound}")
        if bound_kind == "closed" and bound != final.last_entry_id:
            problems.append(f"A5: {operation.client} read a closed ledger ending at {bound}, "
                            f"it ends at {final.last_entry_id}")
        if bound_kind == "lac":
            lac, max_acked = facts.lac_seen.get(operation.op, (bound, bound))
            if lac > max_acked:
                problems.append(f"A4: {operation.client} was told LAC {lac} when only entries up to "
                                f"{max_acked} were acknowledged")
    return problems


def _check_fencing(facts: _Facts) -> list[str]:
    """A7: after coverage fewer than Qa bookies of any write set may still accept the old writer's adds."""
    problems = []
    for client, covered_ms, metadata in facts.coverages:
        ensemble = metadata.last_ensemble[1]
        unfenced = {bookie for bookie, _, time_ms in facts.accepts if time_ms > covered_ms and bookie in ensemble}
        for start in range(metadata.ensemble_size):
            members = [ensemble[p] for p in write_set(start, metadata.ensemble_size, metadata.write_quorum)]
            still = sorted(bookie for bookie in members if bookie in unfenced)
            if len(still) >= metadata.ack_quorum:
                problems.append(f"A7: {client} counted the ledger fenced at {covered_ms} ms, "
                                f"but {still} of write set {members} accepted adds afterwards")
                break
    return problems
