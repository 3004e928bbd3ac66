"""The eleven stream-layer bugs of issue 11, and the stream-layer bugs found since (issue 20's
writer that kept acknowledging into a deleted ledger among them) or feared (issue 22's positions),
planted on purpose: the checker must catch each one (issue 22's dedup table not rebuilt by a new
owner among them, through the simulator's servers).

Each plant puts one old behaviour back at the seam where the bug lived (a planner, a machine
method, a driver's helper, the GC rule, the store's retries) for the duration of a `with
planted(name)` block, and names the anomaly kind the checker reports for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from bookkeeper.bookie import gc
from dlog import producers as producer_state
from dlog import writer as writer_driver
from dlog.core import changes, reader, snapshot
from dlog.core import settings as settings_core
from dlog.core import writer as writer_core
from dlog.core.dedup import DedupTable
from dlog.core.effects import DeleteLedger, FailChunks, SetTimer, WakeWriters
from dlog.segments import port
from dlog.segments.metadata import SegmentChange, SegmentState


@dataclass(frozen=True, slots=True)
class Plant:
    patches: tuple[tuple[Any, str, Any], ...]
    describe: str
    kind: str  # the anomaly the checker reports


def _old_retention_plan(listing: Any, config: Any, subscriptions: Any, now_ms: int) -> list[Any]:
    """Issue 11 item 6: the last completed segment was fair game while one was in progress."""
    completed = [s for s in listing.segments if s.state is SegmentState.COMPLETED]
    candidates = completed[:-1] if listing.in_progress is None else completed
    plan = []
    if config.retention_age_ms:
        plan = [s for s in candidates if s.last_timestamp_ms < now_ms - config.retention_age_ms]
    if config.retention_bytes:
        total = sum(s.bytes for s in listing.live) - sum(s.bytes for s in plan)
        for segment in candidates:
            if total <= config.retention_bytes:
                break
            if segment not in plan:
                plan.append(segment)
                total -= segment.bytes
    return sorted(plan, key=lambda s: s.sequence)


_fail = writer_core.WriterMachine._fail  # noqa: SLF001 - the seam the plants wrap


def _fail_without_waking(self: Any, error: Any, now_ms: int) -> list[Any]:
    """Issue 11 item 3: a failed writer did not wake callers parked in wait_writable()."""
    return [effect for effect in _fail(self, error, now_ms) if not isinstance(effect, WakeWriters)]


def _fail_in_flight_only(self: Any, error: Any, now_ms: int) -> list[Any]:
    """Issue 11 item 4: records still buffered when the writer failed stayed pending."""
    in_flight = sum(len(entry.waiters) for entry in self.batcher.in_flight)  # failed first, oldest first
    effects = []
    for effect in _fail(self, error, now_ms):
        if isinstance(effect, FailChunks):
            if not in_flight:
                continue
            effect = FailChunks(effect.error, effect.waiters[:in_flight])
        effects.append(effect)
    return effects


_on_segments_changed = reader.ReaderMachine.on_segments_changed
_on_waited = reader.ReaderMachine.on_waited


def _notified_only_while_waiting(self: Any, now_ms: int) -> list[Any]:
    """Issue 11 item 2: a notification that came while the reader was not long-polling was lost."""
    if self.step == "wait":
        return _on_segments_changed(self, now_ms)
    return []


def _closed_ledger_not_noticed(self: Any, ledger_id: int, entry: Any, lac: int, closed: bool, now_ms: int) -> list[Any]:
    return _on_waited(self, ledger_id, entry, lac, False, now_ms)


_purge_queue = reader.ReaderMachine._purge_queue  # noqa: SLF001 - the seam the plant wraps


def _held_queued_without_a_wake(self: Any, listing: Any) -> list[Any]:
    """Found by a clean-clone run (test_2_a_slow_tailing_reader...): a list read's answer moved the
    held entry into the queue without waking a consumer that had emptied the queue meanwhile (it
    took the last entry while the read was in flight), and the reader stalled for good."""
    effects = _purge_queue(self, listing)
    if self.held is not None:
        self.queue.append(self.held)
        self.queued_bytes += self.held[1]
        self.held = None
    return effects


def _linger_always(name: str, **settings: Any) -> Any:
    """Issue 11 item 9: every record waited for the linger timer, even with nothing in flight."""
    return settings_core.WriterSettings(name, **{**settings, "linger_ms": 50.0})


async def _single_attempt(self: Any, what: str, operation: Any) -> Any:
    """Issue 11 item 11: a retryable metadata error (ConnectionLoss) was final."""
    return await operation()


def _timer_appended_to_the_effects(self: Any, effects: Any, now_ms: int) -> Any:
    """Found by a clean-clone run of the fault suite (e480fed): a new ledger that arrived while the
    old one still had an entry in flight returned the shared empty tuple of effects, and when the
    linger deadline had just passed, the machine appended its timer to that tuple and crashed."""
    deadline = self._deadline_ms(now_ms)  # noqa: SLF001 - the seam the plant wraps
    if deadline != self._timer_at_ms:  # noqa: SLF001
        self._timer_at_ms = deadline  # noqa: SLF001
        effects.append(SetTimer(deadline))
    return effects


def _created_after_close_committed(self: Any, ledger_id: int, now_ms: int) -> list[Any]:
    """Found by the simulator once writers lingered: a writer fenced mid-roll and then closed still
    committed the roll when its new ledger arrived (only FAILED counted as ended, not CLOSED)."""
    if self.state is writer_core.WriterState.CLOSED:
        self.state = writer_core.WriterState.OPEN  # as the old check saw it: not failed, so go on
        try:
            return _on_ledger_created(self, ledger_id, now_ms)
        finally:
            self.state = writer_core.WriterState.CLOSED
    return _on_ledger_created(self, ledger_id, now_ms)


_on_ledger_created = writer_core.WriterMachine.on_ledger_created


def _close_error_ignored(self: Any, ledger_id: int, error: Any, now_ms: int) -> list[Any]:
    """Issue 20 item 2: a writer whose ledger was deleted under it (`dlog ledger delete --force`)
    went on: bookies kept acknowledging adds to it, nothing watched its metadata, and a close that
    found the metadata gone counted as closed; `dlog write` exited 0 with every record lost."""
    self._closing_ledgers.discard(ledger_id)  # noqa: SLF001 - the seam the plant wraps
    effects: list[Any] = []
    if self._delete_after_commit == ledger_id:  # noqa: SLF001
        self._delete_after_commit = None  # noqa: SLF001
        effects.append(DeleteLedger(ledger_id))
    return [*effects, *self._maybe_closed(now_ms)]  # noqa: SLF001


def _roll_positioned_by_entries(completed: Any, created: Any) -> Any:
    """Issue 22 item 3, planted: a roll that counts the old segment's entries, not its records,
    when it positions the next segment (the count that is right only with one record per entry)."""
    entries = completed.last_entry - completed.first_entry + 1
    created = replace(created, first_position=completed.first_position + entries)
    return SegmentChange(update=(completed,), create=(created,))


def _empty_table(stored: Any, replayed: Any, now_ms: int, limits: Any = None) -> DedupTable:
    """Issue 22 item 6, planted: a new owner serves with an empty producer dedup table (the table
    lived only in the dead owner's memory), so a resend of a batch it made durable but never
    acknowledged is written again."""
    return DedupTable(limits)


_restore_producers = writer_driver.StreamWriter.restore_producers


def _restore_empty(self: Any, table: DedupTable) -> None:
    """Issue 25 item 1, planted: a named producer's new writer starts with an empty producer table
    (not rebuilt from the stored snapshot and the entries after it), so the resend of a batch the
    killed writer made durable but never acknowledged is written again."""
    _restore_producers(self, DedupTable(table.limits))


PLANTS: dict[str, Plant] = {
    "lost-cas-is-takeover": Plant(
        ((changes, "still_owned", lambda segment, current: None),),
        "a writer takes any lost compare-and-set (truncation, retention) for a takeover (item 1)", "writer_death"),
    "reader-misses-roll": Plant(
        ((reader.ReaderMachine, "on_segments_changed", _notified_only_while_waiting),
         (reader.ReaderMachine, "on_waited", _closed_ledger_not_noticed),
         (reader, "EMPTY_POLLS_BEFORE_LIST_READ", 10**9)),
        "a reader whose queue is full misses a roll and long-polls the closed ledger (item 2)", "reader_behind"),
    "held-entry-not-woken": Plant(
        ((reader.ReaderMachine, "_purge_queue", _held_queued_without_a_wake),),
        "a list read's answer queues the held entry without waking the consumer (clean-clone run)",
        "reader_behind"),
    "waiters-not-woken": Plant(
        ((writer_core.WriterMachine, "_fail", _fail_without_waking),),
        "callers parked in wait_writable() are not woken when the writer fails (item 3)", "liveness"),
    "buffered-left-pending": Plant(
        ((writer_core.WriterMachine, "_fail", _fail_in_flight_only),),
        "records still buffered when the writer fails stay pending (item 4)", "liveness"),
    "reader-ignores-truncation": Plant(
        ((snapshot, "below_truncation", lambda segment, entry_id, slot: segment.is_truncated),
         (snapshot, "readable_slot",
          lambda segment, entry_id, slot: None if segment is None or segment.is_truncated else slot)),
        "a reader goes on returning records below a new truncation point (item 5)", "truncation_ignored"),
    "retention-takes-last-completed": Plant(
        ((changes, "retention_plan", _old_retention_plan),),
        "retention removes the last completed segment while one is in progress (item 6)", "retention"),
    "entries-ignore-roll-size": Plant(
        ((settings_core.WriterSettings, "entry_bytes_limit", property(lambda settings: settings.entry_bytes_max)),),
        "entries are bounded by the entry maximum only, not by the roll size (item 7)", "entry_size"),
    "batch-columns-not-filled": Plant(
        ((writer_driver, "fill_missing_columns", lambda batch, schema, now_ms: batch),),
        "write_batch refuses a batch without its nullable key or timestamp column (item 8)", "refused"),
    "records-wait-for-linger": Plant(
        ((writer_driver, "WriterSettings", _linger_always),),
        "every record waits for the linger timer, even when nothing is in flight (item 9)", "slow_write"),
    "gc-without-sync": Plant(
        ((gc, "SYNC_BEFORE_CHECK", False),
         (gc, "may_collect", lambda *, exists, first_seen_s, now_s, grace_s: not exists)),
        "bookie GC trusts a lagging metadata view and has no grace period (item 10)", "liveness"),
    "metadata-errors-not-retried": Plant(
        ((port.RetryingSegmentStore, "_retry", _single_attempt),),
        "a retryable metadata error (ConnectionLoss) ends a writer (item 11)", "writer_death"),
    "roll-timer-crash": Plant(
        ((writer_core.WriterMachine, "_finish", _timer_appended_to_the_effects),),
        "a ledger created while the old one has an entry in flight crashes the writer machine (e480fed)", "bug"),
    "created-after-close-committed": Plant(
        ((writer_core.WriterMachine, "on_ledger_created", _created_after_close_committed),),
        "a writer fenced mid-roll and closed still commits the roll when its new ledger arrives", "metadata"),
    "deleted-ledger-acknowledged": Plant(
        ((writer_driver.StreamWriter, "_watch", lambda self, ledger_id: None),
         (writer_core.WriterMachine, "on_ledger_closed", _close_error_ignored)),
        "a writer keeps acknowledging after its ledger is deleted, and closes without a word (issue 20)", "lost"),
    "roll-positions-from-entries": Plant(
        ((changes, "roll_change", _roll_positioned_by_entries),),
        "a roll positions the next segment by the old one's entry count, not its records (issue 22)", "position"),
    "dedup-not-rebuilt": Plant(
        ((producer_state, "rebuild", _empty_table),),
        "a server taking a stream over does not rebuild its producer dedup table (issue 22)", "producer_duplicate"),
    "named-dedup-not-rebuilt": Plant(
        ((writer_driver.StreamWriter, "restore_producers", _restore_empty),),
        "a named producer's new writer starts with an empty producer table (issue 25)", "producer_duplicate"),
}
NAMES = tuple(PLANTS)


@contextmanager
def planted(name: str | None) -> Iterator[None]:
    """Apply the plant `name` (None: nothing) for the block."""
    if name is None:
        yield
        return
    with ExitStack() as undo:
        for target, attribute, replacement in PLANTS[name].patches:
            original = target.__dict__[attribute] if isinstance(target, type) else getattr(target, attribute)
            setattr(target, attribute, replacement)
            undo.callback(setattr, target, attribute, original)
        yield


def describe(name: str) -> str:
    return PLANTS[name].describe
