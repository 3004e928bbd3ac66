"""The history of one run and the checker of A2-A10 over it.

Clients record operations Jepsen-style: invoke, then ok, fail or unknown (a fenced or timed-out add
is "unknown": it may or may not be in the ledger). Bookies record what they accepted and when it
became durable; the metadata store records every write. `check` reads all of it after the run and
returns the broken promises, each naming its letter; an empty list means the run was correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState
from bookkeeper.protocol.quorum import write_set

from .bookie import BookieRecorder
from .metastore import transition_problem


@dataclass(slots=True)
class Operation:
    index: int
    client: str
    kind: str  # add | read | recover | close
    invoke_ms: int
    value: Any = None  # add: payload; read: (first entry id, bound, "lac" | "closed")
    outcome: str = "pending"  # ok | fail | unknown | pending
    complete_ms: int = -1
    result: Any = None  # read: [(entry id, payload)] (also of a failed read); recover/close: last entry id
    error: BaseException | None = None
    final: bool = False  # the read or recovery run after every fault healed

    def finish(self, outcome: str, now_ms: int, result: Any = None,
               error: BaseException | None = None) -> None:
        self.outcome, self.complete_ms, self.error = outcome, now_ms, error
        if result is not None:
            self.result = result


@dataclass(slots=True)
class Coverage:
    client: str
    time_ms: int
    metadata: LedgerMetadata


@dataclass(slots=True)
class History(BookieRecorder):
    ops: list[Operation] = field(default_factory=list)
    adds: dict[int, Operation] = field(default_factory=dict)  # entry id -> the add that invoked it
    ack_order: list[int] = field(default_factory=list)
    ack_write_sets: dict[int, tuple[int, tuple[str, ...], int]] = field(default_factory=dict)
    max_acked: int = -1
    accepts: list[tuple[str, int, int]] = field(default_factory=list)  # non-recovery adds
    durable_ms: dict[tuple[str, int], int] = field(default_factory=dict)
    coverages: list[Coverage] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # found while running (metadata writes)
    lac_seen: dict[int, tuple[int, int]] = field(default_factory=dict)  # read op -> (lac, max acked)

    def invoke(self, client: str, kind: str, now_ms: int, value: Any = None, final: bool = False) -> Operation:
        operation = Operation(len(self.ops), client, kind, now_ms, value, final=final)
        self.ops.append(operation)
        return operation

    # ------------------------------------------------------------------ the writer

    def add_invoked(self, client: str, entry_id: int, payload: bytes, now_ms: int) -> None:
        self.adds[entry_id] = self.invoke(client, "add", now_ms, payload)

    def add_acked(self, entry_id: int, now_ms: int, metadata: LedgerMetadata) -> None:
        self.adds[entry_id].finish("ok", now_ms, entry_id)
        self.ack_order.append(entry_id)
        self.max_acked = max(self.max_acked, entry_id)
        members = tuple(metadata.ensemble_for(entry_id)[position] for position in
                        write_set(entry_id, metadata.ensemble_size, metadata.write_quorum))
        self.ack_write_sets[entry_id] = (now_ms, members, metadata.ack_quorum)

    def add_unknown(self, entry_id: int, now_ms: int, error: BaseException) -> None:
        operation = self.adds[entry_id]
        if operation.outcome == "pending":
            operation.finish("unknown", now_ms, error=error)

    # ------------------------------------------------------------------ bookies and metadata

    def add_accepted(self, bookie: str, entry_id: int, recovery: bool, now_ms: int) -> None:
        if not recovery:
            self.accepts.append((bookie, entry_id, now_ms))

    def add_durable(self, bookie: str, entry_id: int, now_ms: int) -> None:
        self.durable_ms.setdefault((bookie, entry_id), now_ms)

    def metadata_written(self, client: str, old: LedgerMetadata, new: LedgerMetadata) -> None:
        problem = transition_problem(old, new)
        if problem is not None:
            self.problems.append(f"metadata: write by {client}: {problem}")
        if old.state is LedgerState.OPEN and new.state is LedgerState.OPEN:
            first = new.last_ensemble[0]
            if first <= self.max_acked:  # A9
                self.problems.append(
                    f"A9: {client} committed a fragment from entry {first}, but entry "
                    f"{self.max_acked} was already acknowledged on the old one")

    def fencing_covered(self, client: str, now_ms: int, metadata: LedgerMetadata) -> None:
        self.coverages.append(Coverage(client, now_ms, metadata))

    def lac_learned(self, operation: Operation, lac: int) -> None:
        self.lac_seen[operation.index] = (lac, self.max_acked)


def check(history: History, final: LedgerMetadata) -> list[str]:
    """Every broken promise of this run (empty: none)."""
    problems = list(history.problems)
    problems += _check_acks(history)
    problems += _check_sealed(history, final)
    problems += _check_reads(history, final)
    problems += _check_fencing(history)
    return problems


def _check_acks(history: History) -> list[str]:
    problems = []
    if history.ack_order != list(range(len(history.ack_order))):
        problems.append(f"A2: acknowledgements out of order or with gaps: {history.ack_order[:20]}...")
    for entry_id, (acked_ms, members, ack_quorum) in sorted(history.ack_write_sets.items()):
        durable = [bookie for bookie in members
                   if history.durable_ms.get((bookie, entry_id), acked_ms + 1) <= acked_ms]
        if len(durable) < ack_quorum:
            problems.append(f"A2: entry {entry_id} acknowledged at {acked_ms} ms while durable only on "
                            f"{durable} of its write set {list(members)} (ack quorum {ack_quorum})")
    return problems


def _check_sealed(history: History, final: LedgerMetadata) -> list[str]:
    if final.state is not LedgerState.CLOSED:
        return [f"liveness: after every fault healed, the ledger is still {final.state.value}"]
    problems = []
    last = final.last_entry_id
    lost = [entry_id for entry_id in history.ack_order if entry_id > last]
    if lost:
        problems.append(f"A3/A6: acknowledged entries {lost[:10]} are past the closed end {last}")
    for operation in history.ops:
        if operation.kind in ("recover", "close") and operation.outcome == "ok" and operation.result != last:
            problems.append(f"A6/A10: {operation.client} {operation.kind} ended at entry "
                            f"{operation.result}, the ledger is closed at {last}")
    unknown = [entry_id for entry_id in range(last + 1) if entry_id not in history.adds]
    if unknown:
        problems.append(f"A6: the closed ledger holds entries {unknown[:10]} nobody appended")
    elif final.length != sum(len(history.adds[entry_id].value) for entry_id in range(last + 1)):
        problems.append(f"A6: closed length {final.length} is not the length of entries 0..{last}")
    return problems


def _check_reads(history: History, final: LedgerMetadata) -> list[str]:
    problems = []
    final_reads = [op for op in history.ops if op.kind == "read" and op.final]
    if not final_reads or final_reads[-1].outcome != "ok":
        problems.append(f"A3: the closed ledger could not be read to its end after every fault healed "
                        f"({final_reads[-1].error if final_reads else 'no final read'})")
    elif final.state is LedgerState.CLOSED:
        got = {entry_id for entry_id, _ in final_reads[-1].result}
        missing = [entry_id for entry_id in history.ack_order if entry_id not in got]
        if missing:
            problems.append(f"A3: acknowledged entries {missing[:10]} were not read back")
    for operation in history.ops:
        if operation.kind != "read" or operation.value is None:
            continue
        first, bound, bound_kind = operation.value
        ids = [entry_id for entry_id, _ in operation.result or []]
        if ids != list(range(first, first + len(ids))):
            problems.append(f"order: {operation.client} read ids {ids[:10]} from {first}")
        for entry_id, payload in operation.result or []:
            add = history.adds.get(entry_id)
            if add is None or add.value != payload:
                problems.append(f"values: {operation.client} read {payload!r} at entry {entry_id}, "
                                f"which was written as {add.value if add else None!r}")
            if entry_id > bound:
                problems.append(f"A4/A5: {operation.client} read entry {entry_id} past its bound {bound}")
        if bound_kind == "closed" and bound != final.last_entry_id:
            problems.append(f"A5: {operation.client} read a closed ledger ending at {bound}, "
                            f"it ends at {final.last_entry_id}")
        if bound_kind == "lac":
            lac, max_acked = history.lac_seen.get(operation.index, (bound, bound))
            if lac > max_acked:
                problems.append(f"A4: {operation.client} was told LAC {lac} when only entries up to "
                                f"{max_acked} were acknowledged")
    return problems


def _check_fencing(history: History) -> list[str]:
    """A7: after coverage fewer than Qa bookies of any write set may still accept the old writer's adds."""
    problems = []
    for coverage in history.coverages:
        metadata = coverage.metadata
        ensemble = metadata.last_ensemble[1]
        unfenced = {bookie for bookie, _, time_ms in history.accepts
                    if time_ms > coverage.time_ms and bookie in ensemble}
        for start in range(metadata.ensemble_size):
            members = [ensemble[p] for p in write_set(start, metadata.ensemble_size, metadata.write_quorum)]
            still = sorted(bookie for bookie in members if bookie in unfenced)
            if len(still) >= metadata.ack_quorum:
                problems.append(f"A7: {coverage.client} counted the ledger fenced at {coverage.time_ms} ms, "
                                f"but {still} of write set {members} accepted adds afterwards")
                break
    return problems
