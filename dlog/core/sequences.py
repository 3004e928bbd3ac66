"""The sequence rules of producer deduplication (`dlog.core.dedup` holds the table and says how
they are used): the two rules, the ring arithmetic of Kafka's wrapping sequences, a producer's
state, and the verdict on one batch of a producer's current epoch. Pure functions and values.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from bookkeeper.errors import ConfigError, invariant

KAFKA_PREFIX = "kafka:"
KAFKA_SEQUENCE_MAX = 2**31 - 1  # Kafka's sequences are int32 and wrap from here to 0
SEQUENCE_RING = KAFKA_SEQUENCE_MAX + 1
SEQUENCE_WINDOW = SEQUENCE_RING // 2  # on the ring: this far behind is old, ahead is new
NATIVE_SEQUENCE_MAX = 2**63 - 1  # the entry carries a signed 64-bit sequence
EPOCH_MAX = 2**15 - 1  # Kafka's producer epoch is an int16; one range for both kinds
NATIVE_NAME_CHARS_MAX = 200
NATIVE_NAME = re.compile(r"[A-Za-z0-9._\-]{1,200}")


class SequenceRule(enum.Enum):
    CONSECUTIVE = "consecutive"  # Kafka: next batch starts at last + 1 (wrapping), epoch resets to 0
    INCREASING = "increasing"  # native: next batch starts above last; gaps allowed


def kafka_producer(producer_id: int) -> str:
    """The table's key for a Kafka producer id (int64 >= 0, from InitProducerId)."""
    invariant(0 <= producer_id < 2**63, f"a Kafka producer id is an int64 >= 0, not {producer_id}")
    return f"{KAFKA_PREFIX}{producer_id}"


def native_producer(name: str) -> str:
    """The table's key for a native writer's producer id, which must be 1-200 characters from
    A-Z a-z 0-9 . _ - (so never a Kafka key); ConfigError says what is wrong."""
    if not isinstance(name, str) or not NATIVE_NAME.fullmatch(name):
        raise ConfigError(f"bad producer id {name!r}: use 1-{NATIVE_NAME_CHARS_MAX} characters from "
                          f"A-Z a-z 0-9 . _ -, e.g. billing-importer")
    return name


def sequence_rule(producer: str) -> SequenceRule:
    return SequenceRule.CONSECUTIVE if producer.startswith(KAFKA_PREFIX) else SequenceRule.INCREASING


@dataclass(frozen=True, slots=True)
class Batch:
    """A durable batch: its sequences and the stream offsets that hold them."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class PendingBatch:
    """A batch handed to the stream and not yet durable."""

    epoch: int
    first_sequence: int
    last_sequence: int
    created_producer: bool  # its acceptance created the producer's entry


@dataclass(frozen=True, slots=True)
class ProducerState:
    epoch: int
    last_sequence: int | None  # the last durable sequence of `epoch`; None: none yet
    batches: tuple[Batch, ...]  # the last durable batches of `epoch`, oldest first
    pending: tuple[PendingBatch, ...]  # oldest first; the first ones may be of an older epoch
    last_active_ms: int

    @property
    def pushed_sequence(self) -> int | None:
        """The last sequence of `epoch` handed to the stream (durable or not); None: none yet."""
        if self.pending and self.pending[-1].epoch == self.epoch:
            return self.pending[-1].last_sequence
        return self.last_sequence


# ------------------------------------------------------------------------------ verdicts


@dataclass(frozen=True, slots=True)
class Accepted:
    """New: append it, then report `on_durable` or `on_failed`."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Already durable: answer with these offsets (None: older than the batches remembered)."""

    first_offset: int | None
    last_offset: int | None


@dataclass(frozen=True, slots=True)
class InFlight:
    """A resend of sequences pushed but not durable yet: park it and offer it again after the
    producer's next `on_durable`; if `on_failed` comes first, answer it with that failure (offered
    again it could land after a later batch)."""

    pushed_sequence: int


@dataclass(frozen=True, slots=True)
class OutOfOrder:
    """Refused, nothing written: `expected` is the sequence the producer must send next
    (INCREASING: the least one; None when the batch itself is malformed)."""

    expected: int | None
    message: str


@dataclass(frozen=True, slots=True)
class Fenced:
    """Refused: a newer epoch of this producer exists."""

    epoch: int
    message: str


@dataclass(frozen=True, slots=True)
class Refused:
    """Refused for room: `limit` names the limit reached; retry once producers expire."""

    limit: str
    message: str


Verdict = Accepted | Duplicate | InFlight | OutOfOrder | Fenced | Refused
ACCEPTED = Accepted()


def position(rule: SequenceRule, sequence: int, anchor: int) -> int:
    """`sequence` as a signed distance from `anchor`; on Kafka's ring, within half of it."""
    if rule is SequenceRule.INCREASING:
        return sequence - anchor
    return (sequence - anchor + SEQUENCE_WINDOW) % SEQUENCE_RING - SEQUENCE_WINDOW


def span(rule: SequenceRule, first_sequence: int, last_sequence: int) -> int:
    """How many sequences after the first a batch covers (0 for a batch of one)."""
    if rule is SequenceRule.INCREASING:
        return last_sequence - first_sequence
    return (last_sequence - first_sequence) % SEQUENCE_RING


def following(rule: SequenceRule, sequence: int) -> int:
    if rule is SequenceRule.CONSECUTIVE and sequence == KAFKA_SEQUENCE_MAX:
        return 0
    return sequence + 1


def malformed(rule: SequenceRule, epoch: int, first_sequence: int, last_sequence: int) -> str | None:
    """What is wrong with a batch's numbers on their own, or None."""
    if not 0 <= epoch <= EPOCH_MAX:
        return f"epoch {epoch} is outside 0..{EPOCH_MAX}"
    top = KAFKA_SEQUENCE_MAX if rule is SequenceRule.CONSECUTIVE else NATIVE_SEQUENCE_MAX
    for sequence in (first_sequence, last_sequence):
        if not 0 <= sequence <= top:
            return f"sequence {sequence} is outside 0..{top}"
    if rule is SequenceRule.INCREASING and last_sequence < first_sequence:
        return f"a batch's last sequence {last_sequence} is below its first {first_sequence}"
    if rule is SequenceRule.CONSECUTIVE and span(rule, first_sequence, last_sequence) >= SEQUENCE_WINDOW:
        return f"a batch from sequence {first_sequence} to {last_sequence} spans half the sequence ring"
    return None


def remembered_offsets(rule: SequenceRule, batches: tuple[Batch, ...], first_sequence: int,
                       last_sequence: int) -> tuple[int | None, int | None]:
    """The offsets of sequences inside one remembered batch: exact for the whole batch, computed
    for part of a batch whose sequences are dense (one per offset), else unknown."""
    length = span(rule, first_sequence, last_sequence)
    for batch in reversed(batches):
        start = position(rule, first_sequence, batch.first_sequence)
        whole = span(rule, batch.first_sequence, batch.last_sequence)
        if start < 0 or start + length > whole:
            continue
        if start == 0 and length == whole:
            return batch.first_offset, batch.last_offset
        if whole == batch.last_offset - batch.first_offset:
            return batch.first_offset + start, batch.first_offset + start + length
        return None, None
    return None, None


def classify(rule: SequenceRule, state: ProducerState, first_sequence: int, last_sequence: int) -> Verdict:
    """The verdict on a batch of the producer's current epoch."""
    pushed = state.pushed_sequence
    if pushed is None:  # a new epoch with nothing written yet
        if rule is SequenceRule.CONSECUTIVE and first_sequence != 0:
            return OutOfOrder(0, f"a new epoch starts at sequence 0, not {first_sequence}")
        return ACCEPTED
    start = position(rule, first_sequence, pushed)
    end = start + span(rule, first_sequence, last_sequence)
    expected = following(rule, pushed)
    wanted = f"the next one is {expected}" + ("" if rule is SequenceRule.CONSECUTIVE else " or more")
    if start > 0:
        if rule is SequenceRule.CONSECUTIVE and start != 1:
            return OutOfOrder(expected, f"sequence {first_sequence} skips ahead: {wanted}")
        return ACCEPTED
    if end > 0:
        return OutOfOrder(expected, f"sequences {first_sequence}..{last_sequence} overlap those written "
                                    f"up to {pushed}: {wanted}")
    durable = state.last_sequence
    if durable is not None and end <= position(rule, durable, pushed):
        return Duplicate(*remembered_offsets(rule, state.batches, first_sequence, last_sequence))
    current = [batch for batch in state.pending if batch.epoch == state.epoch]
    if durable is None and start < position(rule, current[0].first_sequence, pushed):
        return OutOfOrder(expected, f"sequence {first_sequence} comes before this producer's first one "
                                    f"{current[0].first_sequence}: {wanted}")
    return InFlight(pushed)
