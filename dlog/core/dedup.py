"""Producer deduplication: which batches of which producers a stream already holds, so that a
producer's resend is answered instead of written twice. One table serves both idempotent Kafka
producers (the serving tier) and named native writers (`open_writer(producer_id=...)`).

Theory of operation.

Producers. A producer is a string key: `kafka_producer(id)` ("kafka:<id>") for a Kafka producer
id from InitProducerId, `native_producer(name)` for a native writer's name (A-Z a-z 0-9 . _ -:
never a ':', so the two never meet). Each has an epoch (Kafka's producer epoch; 0 for native writers) and a
sequence rule chosen by its key (`sequence_rule`):
- CONSECUTIVE (Kafka): each batch starts right after the last one; sequences wrap from
  2**31-1 to 0; a new epoch starts at 0; a lower epoch is fenced.
- INCREASING (native): each batch starts above the last one; gaps are allowed, so an
  application can use its source position as the sequence.
A batch is a run of sequences `first_sequence..last_sequence` and, once durable, the run of
stream offsets that holds it (opaque ints to this table).

Two marks per producer (Pulsar's two maps). `pushed` is the last sequence handed to the stream,
`last_sequence` the last one acknowledged durable. `offer` classifies a batch against them:
- above `pushed` (and, CONSECUTIVE, right after it): Accepted, and recorded as pushed; the
  caller appends it and then reports `on_durable` or `on_failed`;
- at or below `last_sequence`: Duplicate, with its original offsets when it lies in one of the
  last `batches_remembered_max` durable batches, without them when older;
- between the two: InFlight, a resend of a batch not yet durable. The caller parks it and
  offers it again after the producer's next `on_durable` (it is then a Duplicate, or still in
  flight); when `on_failed` comes instead, it answers it with that failure;
- anything else (a skipped sequence under CONSECUTIVE, a batch overlapping `pushed`, a lower
  epoch, a full table) is refused with one line saying what was expected.
An unknown producer's first batch is accepted at any sequence (as Kafka does, so a producer
whose state expired can go on).

Failures. `on_failed` means the batch is certainly NOT in the stream (refused before any bookie
saw it): that batch and every later pushed one of the producer are forgotten, so a retry is
accepted. A failure with an unknown outcome (a fenced or aborted writer) must not be reported
here: the owner drops the table and rebuilds it from the stream, whose recovery decides. After
a failure a producer must send again in order, from its oldest unacknowledged batch (a Kafka
client does; a native writer resumes from `last_sequence`): under INCREASING, or for a producer
whose first batches were lost, a lower sequence arriving after a higher one that landed cannot
be told from a duplicate.

Rebuilding (a new owner, a restarted writer). `snapshot()` encodes the durable part of the table
(JSON, at most `snapshot_bytes_max`); the owner stores it, after the stream position it covers
(`encode_stored`), in a node of the stream that retention never touches (docs/serving.md). A new
owner `rebuild`s: restores the last snapshot, feeds each producer batch of the entries from its
position on (the entries' producer sections) to `on_replayed`, calls `expire`, and only then
accepts writes. The table is kept by time, not by records: retention and compaction of a producer's
records never remove its state (KAFKA-7190); only `producer_idle_ms_max` without activity does.

Bounds. Per producer: `batches_remembered_max` durable batches (Kafka keeps 5) and
`batches_in_flight_max` pushed ones; per table: `producers_max` producers, and as many as a
snapshot of `snapshot_bytes_max` can always name (each producer's smallest snapshot form is
counted when it is added). A producer beyond either cap is refused (Refused), never evicting a
live one: evicting would make its next resend look new and write it twice, silently. When the
full snapshot is too large it keeps fewer remembered batches per producer (older resends are
then answered as duplicates without offsets); producers are dropped, least recently active
first, only when even that does not fit (possible only when the limits were lowered).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from bookkeeper.errors import ConfigError, CorruptMetadataError, InvariantError, invariant
from dlog.core.sequences import (
    ACCEPTED,
    EPOCH_MAX,
    NATIVE_SEQUENCE_MAX,
    Accepted,
    Batch,
    Duplicate,
    Fenced,
    InFlight,
    OutOfOrder,
    PendingBatch,
    ProducerState,
    Refused,
    SequenceRule,
    Verdict,
    classify,
    kafka_producer,
    malformed,
    native_producer,
    position,
    sequence_rule,
)

PRODUCER_CHARS_MAX = 256
SNAPSHOT_VERSION = 1
TIME_MS_MAX = 2**63 - 1
BATCHES_IN_SNAPSHOT_MAX = 64  # per producer: a restored table never holds more than this

__all__ = [  # the verdicts and rules callers need come with the table
    "Accepted", "Batch", "DedupLimits", "DedupTable", "Duplicate", "Fenced", "InFlight", "OutOfOrder",
    "ProducerState", "Refused", "ReplayedBatch", "SequenceRule", "Verdict", "decode_stored", "encode_stored",
    "kafka_producer", "native_producer", "rebuild", "sequence_rule",
]


@dataclass(frozen=True, slots=True)
class DedupLimits:
    producers_max: int = 10_000
    producer_idle_ms_max: int = 86_400_000  # Kafka's producer.id.expiration.ms: one day
    batches_remembered_max: int = 5  # Kafka's NUM_BATCHES_TO_RETAIN
    batches_in_flight_max: int = 100  # per producer; a Kafka producer keeps at most 5
    snapshot_bytes_max: int = 768 << 10  # leaves room in ZooKeeper's 1 MiB request for the list

    def __post_init__(self) -> None:
        for name in ("producers_max", "producer_idle_ms_max", "batches_in_flight_max", "snapshot_bytes_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"bad {name} {getattr(self, name)}: it must be at least 1")
        if not 0 <= self.batches_remembered_max <= BATCHES_IN_SNAPSHOT_MAX:
            raise ConfigError(f"bad batches_remembered_max {self.batches_remembered_max}: "
                              f"it must be 0..{BATCHES_IN_SNAPSHOT_MAX}")


class DedupTable:
    """One stream's producers: offer batches, report their fate, snapshot, restore, replay."""

    def __init__(self, limits: DedupLimits | None = None) -> None:
        self.limits = limits or DedupLimits()
        self._producers: dict[str, ProducerState] = {}
        self._floor_bytes = len(encode_snapshot([]))  # the smallest snapshot naming every producer
        # counters, exported as metrics
        self.accepted_batches = 0
        self.duplicate_batches = 0
        self.in_flight_batches = 0
        self.out_of_order_batches = 0
        self.fenced_batches = 0
        self.refused_batches = 0
        self.expired_producers = 0
        self.snapshot_batches_dropped = 0  # snapshots that kept fewer remembered batches
        self.snapshot_producers_dropped = 0

    @property
    def producer_count(self) -> int:
        return len(self._producers)

    def producer(self, producer: str) -> ProducerState | None:
        return self._producers.get(producer)

    def last_sequence(self, producer: str) -> int | None:
        """The producer's last durable sequence (where a restarted writer resumes), or None."""
        state = self._producers.get(producer)
        return None if state is None else state.last_sequence

    def offer(self, producer: str, first_sequence: int, last_sequence: int, now_ms: int, epoch: int = 0) -> Verdict:
        """The verdict on a batch; Accepted records it as pushed."""
        check_producer(producer)
        rule = sequence_rule(producer)
        verdict = self._judge(rule, producer, epoch, first_sequence, last_sequence)
        if isinstance(verdict, Accepted):
            verdict = self._push(producer, epoch, first_sequence, last_sequence, now_ms)
        self._count(verdict)
        return verdict

    def _judge(self, rule: SequenceRule, producer: str, epoch: int, first_sequence: int,
               last_sequence: int) -> Verdict:
        problem = malformed(rule, epoch, first_sequence, last_sequence)
        if problem is not None:
            return OutOfOrder(None, f"producer {producer}: {problem}")
        state = self._producers.get(producer)
        if state is None:
            return ACCEPTED
        if epoch < state.epoch:
            return Fenced(state.epoch, f"producer {producer}: epoch {epoch} is fenced by epoch {state.epoch}")
        if epoch > state.epoch:
            if rule is SequenceRule.CONSECUTIVE and first_sequence != 0:
                return OutOfOrder(0, f"producer {producer}: a new epoch starts at sequence 0, not {first_sequence}")
            return ACCEPTED
        verdict = classify(rule, state, first_sequence, last_sequence)
        if isinstance(verdict, OutOfOrder):
            return replace(verdict, message=f"producer {producer}: {verdict.message}")
        return verdict

    def _push(self, producer: str, epoch: int, first_sequence: int, last_sequence: int, now_ms: int) -> Verdict:
        state = self._producers.get(producer)
        created = state is None
        if state is None:
            refusal = self._room_for(producer)
            if refusal is not None:
                return refusal
            self._floor_bytes += producer_floor_bytes(producer)
            state = ProducerState(epoch, None, (), (), now_ms)
        elif len(state.pending) >= self.limits.batches_in_flight_max:
            return Refused("batches_in_flight_max", f"producer {producer} has {len(state.pending)} batches "
                                                    f"in flight, the most batches_in_flight_max allows")
        elif epoch > state.epoch:  # as Kafka, forget the old epoch's batches: their resends are fenced
            state = ProducerState(epoch, None, (), state.pending, state.last_active_ms)
        pushed = PendingBatch(epoch, first_sequence, last_sequence, created)
        self._producers[producer] = replace(state, pending=(*state.pending, pushed),
                                            last_active_ms=max(state.last_active_ms, now_ms))
        return ACCEPTED

    def _room_for(self, producer: str) -> Refused | None:
        if len(self._producers) >= self.limits.producers_max:
            return Refused("producers_max", f"the stream has {len(self._producers)} producers, the most "
                                            f"producers_max allows; producer {producer} must wait for idle "
                                            f"ones to expire")
        if self._floor_bytes + producer_floor_bytes(producer) > self.limits.snapshot_bytes_max:
            return Refused("snapshot_bytes_max", f"a snapshot naming one more producer ({producer}) could exceed "
                                                 f"snapshot_bytes_max {self.limits.snapshot_bytes_max}")
        return None

    def _count(self, verdict: Verdict) -> None:
        if isinstance(verdict, Accepted):
            self.accepted_batches += 1
        elif isinstance(verdict, Duplicate):
            self.duplicate_batches += 1
        elif isinstance(verdict, InFlight):
            self.in_flight_batches += 1
        elif isinstance(verdict, OutOfOrder):
            self.out_of_order_batches += 1
        elif isinstance(verdict, Fenced):
            self.fenced_batches += 1
        else:
            self.refused_batches += 1

    def on_durable(self, producer: str, first_sequence: int, last_sequence: int, first_offset: int,
                   last_offset: int, now_ms: int, epoch: int = 0) -> None:
        """The producer's oldest pushed batch is acknowledged at these offsets."""
        state = self._producers.get(producer)
        if state is None or not state.pending:
            raise InvariantError(f"durable batch of producer {producer} with none pushed")
        head = state.pending[0]
        invariant((head.epoch, head.first_sequence, head.last_sequence) == (epoch, first_sequence, last_sequence),
                  f"producer {producer}: durable batch {epoch}/{first_sequence}..{last_sequence} is not "
                  f"the oldest pushed one {head}")
        invariant(last_offset >= first_offset, f"durable batch offsets {first_offset}..{last_offset} run backwards")
        active = max(state.last_active_ms, now_ms)
        if epoch != state.epoch:  # an older epoch's batch: its resends are fenced, nothing to keep
            self._producers[producer] = replace(state, pending=state.pending[1:], last_active_ms=active)
            return
        batches = self._kept(state.batches, Batch(first_sequence, last_sequence, first_offset, last_offset))
        self._producers[producer] = replace(state, last_sequence=last_sequence, batches=batches,
                                            pending=state.pending[1:], last_active_ms=active)

    def _kept(self, batches: tuple[Batch, ...], batch: Batch) -> tuple[Batch, ...]:
        keep = self.limits.batches_remembered_max
        return (*batches, batch)[-keep:] if keep else ()

    def on_failed(self, producer: str, first_sequence: int, epoch: int = 0) -> None:
        """A pushed batch is certainly not in the stream: forget it and every later one of the
        producer, so that a retry is accepted."""
        state = self._producers.get(producer)
        pending = () if state is None else state.pending
        index = next((index for index, batch in enumerate(pending)
                      if (batch.epoch, batch.first_sequence) == (epoch, first_sequence)), None)
        if state is None or index is None:
            raise InvariantError(f"producer {producer}: failed batch {epoch}/{first_sequence} was not pushed")
        if state.pending[index].created_producer:
            del self._producers[producer]
            self._floor_bytes -= producer_floor_bytes(producer)
            return
        self._producers[producer] = replace(state, pending=state.pending[:index])

    def on_replayed(self, producer: str, first_sequence: int, last_sequence: int, first_offset: int,
                    last_offset: int, written_ms: int, epoch: int = 0) -> None:
        """A batch found in an entry written after the snapshot (before any write is accepted).
        The stream is the truth: no limit refuses it, and a lower epoch's batch is skipped."""
        check_producer(producer)
        rule = sequence_rule(producer)
        problem = malformed(rule, epoch, first_sequence, last_sequence)
        if problem is not None or last_offset < first_offset:
            raise CorruptMetadataError(f"an entry of producer {producer} holds a bad batch "
                                       f"{epoch}/{first_sequence}..{last_sequence} at offsets "
                                       f"{first_offset}..{last_offset}: {problem or 'offsets run backwards'}")
        state = self._producers.get(producer)
        invariant(state is None or not state.pending, f"replay for producer {producer} after writes were accepted")
        batch = Batch(first_sequence, last_sequence, first_offset, last_offset)
        if state is None:
            self._floor_bytes += producer_floor_bytes(producer)
            state = ProducerState(epoch, None, (), (), written_ms)
        elif epoch < state.epoch:
            return
        elif epoch > state.epoch:
            state = ProducerState(epoch, None, (), (), state.last_active_ms)
        elif state.last_sequence is not None and position(rule, last_sequence, state.last_sequence) <= 0:
            return  # already counted (replay began before the snapshot's end): replaying is idempotent
        self._producers[producer] = replace(state, last_sequence=last_sequence,
                                            batches=self._kept(state.batches, batch),
                                            last_active_ms=max(state.last_active_ms, written_ms))

    def on_written(self, producer: str, first_sequence: int, last_sequence: int, first_offset: int,
                   last_offset: int, now_ms: int) -> None:
        """A named native writer's batch is durable. Such a writer holds the stream's lock, so it is
        its producer's only source: it checks order itself (sequences above `last_sequence` and
        above what it buffered) and pushes nothing here; its durable batches are recorded as the
        stream's replay records them, so a rebuilt table equals the live one."""
        self.on_replayed(producer, first_sequence, last_sequence, first_offset, last_offset, now_ms)
        self.accepted_batches += 1

    def room_for(self, producer: str) -> Refused | None:
        """Why a producer the table does not know could not be added now (a limit), or None."""
        return None if producer in self._producers else self._room_for(producer)

    def expire(self, now_ms: int) -> tuple[str, ...]:
        """Forget producers idle for `producer_idle_ms_max` with nothing in flight."""
        idle = tuple(sorted(producer for producer, state in self._producers.items()
                            if not state.pending and now_ms - state.last_active_ms >= self.limits.producer_idle_ms_max))
        for producer in idle:
            del self._producers[producer]
            self._floor_bytes -= producer_floor_bytes(producer)
        self.expired_producers += len(idle)
        return idle

    def snapshot(self) -> bytes:
        """The durable part of the table in at most `snapshot_bytes_max` bytes."""
        durable = [(producer, state) for producer, state in sorted(self._producers.items())
                   if not (state.pending and state.pending[0].created_producer)]  # else nothing durable yet
        for keep in range(self.limits.batches_remembered_max, -1, -1):
            data = encode_snapshot(snapshot_rows(durable, keep))
            if len(data) <= self.limits.snapshot_bytes_max:
                if keep < self.limits.batches_remembered_max and any(len(s.batches) > keep for _, s in durable):
                    self.snapshot_batches_dropped += 1
                return data
        return self._snapshot_dropping_producers(durable)

    def _snapshot_dropping_producers(self, durable: list[tuple[str, ProducerState]]) -> bytes:
        by_activity = sorted(durable, key=lambda item: (-item[1].last_active_ms, item[0]))
        budget = self.limits.snapshot_bytes_max - len(encode_snapshot([]))
        kept = []
        for producer, state in by_activity:
            cost = len(json.dumps(snapshot_row(producer, state, 0), separators=(",", ":"))) + 1
            if cost > budget:
                break
            budget -= cost
            kept.append((producer, state))
        self.snapshot_producers_dropped += len(durable) - len(kept)
        return encode_snapshot(snapshot_rows(sorted(kept), 0))

    @classmethod
    def restore(cls, data: bytes, limits: DedupLimits | None = None) -> DedupTable:
        """A table holding what `snapshot` encoded; CorruptMetadataError names what is wrong."""
        table = cls(limits)
        keep = table.limits.batches_remembered_max
        for producer, state in decode_snapshot(data):
            table._producers[producer] = replace(state, batches=state.batches[-keep:] if keep else ())
            table._floor_bytes += producer_floor_bytes(producer)
        return table


@dataclass(frozen=True, slots=True)
class ReplayedBatch:
    """A producer's batch found in an entry after the snapshot (an entry's producer section), at
    the stream offsets first_offset..last_offset."""

    producer: str
    epoch: int
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


def rebuild(stored: bytes | None, replayed: Iterable[ReplayedBatch], now_ms: int,
            limits: DedupLimits | None = None) -> DedupTable:
    """A new owner's table: the stored snapshot (`encode_stored`; None: the stream never had an
    owner, so no entry names a producer) restored, every batch of the entries from the snapshot's
    position on replayed in stream order (replaying from too early changes nothing), idle
    producers expired. The owner serves the stream only with this table (CorruptMetadataError:
    it does not serve it)."""
    table = DedupTable(limits) if stored is None else DedupTable.restore(decode_stored(stored)[1], limits)
    for batch in replayed:
        table.on_replayed(batch.producer, batch.first_sequence, batch.last_sequence, batch.first_offset,
                          batch.last_offset, now_ms, batch.epoch)
    table.expire(now_ms)
    return table


def encode_stored(position: int, snapshot: bytes) -> bytes:
    """What an owner stores: the stream position its snapshot covers everything below (replay
    starts there) and the snapshot, one line each."""
    invariant(position >= 0, f"a snapshot position is a stream position, not {position}")
    return b"%d\n%s" % (position, snapshot)


def decode_stored(data: bytes) -> tuple[int, bytes]:
    """(position, snapshot) of `encode_stored`'s form; CorruptMetadataError when it is not one."""
    line, _, snapshot = bytes(data).partition(b"\n")
    if not line.isdigit() or len(line) > 20 or not snapshot:
        raise CorruptMetadataError(f"the stored dedup snapshot does not start with its position: {line[:40]!r}")
    return int(line), snapshot


def check_producer(producer: str) -> None:
    if not isinstance(producer, str) or not 0 < len(producer) <= PRODUCER_CHARS_MAX:
        raise ConfigError(f"bad producer id {producer!r}: it must be 1-{PRODUCER_CHARS_MAX} characters of text")


# ------------------------------------------------------------------------------ snapshot form


def snapshot_row(producer: str, state: ProducerState, keep: int) -> list[Any]:
    batches = state.batches[-keep:] if keep else ()
    return [producer, state.epoch, state.last_sequence, state.last_active_ms,
            [[b.first_sequence, b.last_sequence, b.first_offset, b.last_offset] for b in batches]]


def snapshot_rows(durable: list[tuple[str, ProducerState]], keep: int) -> list[list[Any]]:
    return [snapshot_row(producer, state, keep) for producer, state in durable]


def encode_snapshot(rows: list[list[Any]]) -> bytes:
    return json.dumps({"version": SNAPSHOT_VERSION, "producers": rows}, separators=(",", ":")).encode()


def producer_floor_bytes(producer: str) -> int:
    """The most bytes a producer's smallest snapshot row can take (largest numbers, a comma)."""
    row = [producer, EPOCH_MAX, NATIVE_SEQUENCE_MAX, TIME_MS_MAX, []]
    return len(json.dumps(row, separators=(",", ":"))) + 1


def decode_snapshot(data: bytes) -> Iterator[tuple[str, ProducerState]]:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptMetadataError(f"the dedup snapshot is not JSON: {error}") from error
    if not isinstance(document, dict) or document.get("version") != SNAPSHOT_VERSION \
            or not isinstance(document.get("producers"), list):
        raise CorruptMetadataError(f"the dedup snapshot is not version {SNAPSHOT_VERSION} with a producer list")
    seen: set[str] = set()
    for row in document["producers"]:
        producer, state = decode_row(row)
        if producer in seen:
            raise CorruptMetadataError(f"the dedup snapshot names producer {producer} twice")
        seen.add(producer)
        yield producer, state


def decode_row(row: Any) -> tuple[str, ProducerState]:
    def whole(value: Any) -> bool:
        return type(value) is int and value >= 0

    shape_ok = isinstance(row, list) and len(row) == 5 and isinstance(row[0], str) and isinstance(row[4], list)
    if not shape_ok or not 0 < len(row[0]) <= PRODUCER_CHARS_MAX:
        raise CorruptMetadataError(f"the dedup snapshot holds a malformed producer row {str(row)[:200]}")
    producer, epoch, last_sequence, last_active_ms, batches = row
    rule = sequence_rule(producer)
    sequence_ok = last_sequence is None or (whole(last_sequence)
                                            and malformed(rule, 0, last_sequence, last_sequence) is None)
    numbers_ok = whole(epoch) and epoch <= EPOCH_MAX and whole(last_active_ms) and sequence_ok
    batches_ok = len(batches) <= BATCHES_IN_SNAPSHOT_MAX and all(
        isinstance(b, list) and len(b) == 4 and all(whole(n) for n in b) and b[3] >= b[2]
        and malformed(rule, 0, b[0], b[1]) is None for b in batches)
    consistent = not batches or (last_sequence is not None and batches[-1][1] == last_sequence)
    if not (numbers_ok and batches_ok and consistent):
        raise CorruptMetadataError(f"the dedup snapshot holds bad numbers for producer {producer}: {str(row)[:200]}")
    return producer, ProducerState(epoch, last_sequence, tuple(Batch(*b) for b in batches), (), last_active_ms)
