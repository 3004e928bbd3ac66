"""Offsets of records in a stream, and their text and JSON forms: the one position type.

An `Offset` is (ledger id, entry id, slot); the slot is the record's index inside its entry's
batch. Text form ``L:E`` or ``L:E:S`` (the slot defaults to 0).

A record also has a stream *position* (V4): a 64-bit integer counted from the stream's first
record, dense (0, 1, 2...), never reused and unchanged by truncation, as Kafka's offsets. An
`Offset` carries it as `position` when the one who made it knew it (a writer's acknowledgement, a
reader's record; None otherwise: a parsed text, a stream written before positions existed until
its next writer opens it). `position` takes no part in equality or hashing (the same record is
the same offset, known position or not) nor in the text and JSON forms, which stay as they were
(subscriptions and Spark checkpoints store them).

Offsets are deliberately NOT orderable. Stream order is segment order, then entry, then slot,
and segment order need not follow ledger-id order: the Spark sink appends ledgers written by its
tasks as segments in commit order, whatever ids they got. A ``(ledger, entry, slot)`` comparison
would therefore silently misorder offsets of different segments. Inside one ledger the order is
`key_within_ledger()`; across ledgers, the stream layer orders through its segment list (a
`dlog.core.snapshot.Cursor` is an offset resolved against one). Spark's offset JSON is the Spark
source's (`dlog_spark.offsets`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bookkeeper.errors import ConfigError

LEDGER_ID_MAX = 2**63 - 1
ENTRY_ID_MAX = 2**63 - 1
SLOT_MAX = 2**31 - 1  # Spark's read schema has `slot int`
POSITION_MAX = 2**63 - 1  # a signed 64-bit integer, as Kafka's offsets

# ASCII digits only (str.isdigit and \d would accept "١"), at most 19 of them per number, which
# also keeps int() away from huge strings.
_OFFSET_TEXT = re.compile(r"([0-9]{1,19}):([0-9]{1,19})(?::([0-9]{1,10}))?", re.ASCII)
_OFFSET_RULE = "write L:E or L:E:S with non-negative integers, e.g. 12:0:5"
_FIELD_LIMITS = (("ledger id", LEDGER_ID_MAX), ("entry id", ENTRY_ID_MAX), ("slot", SLOT_MAX))


@dataclass(frozen=True, slots=True)
class Offset:
    ledger_id: int
    entry_id: int
    slot: int = 0
    position: int | None = field(default=None, compare=False)  # the record's stream position, if known

    def __post_init__(self) -> None:
        # One flat condition: readers build an Offset per record, so the happy path stays cheap.
        ledger_id, entry_id, slot, position = self.ledger_id, self.entry_id, self.slot, self.position
        if not (
            type(ledger_id) is int and type(entry_id) is int and type(slot) is int
            and 0 <= ledger_id <= LEDGER_ID_MAX and 0 <= entry_id <= ENTRY_ID_MAX and 0 <= slot <= SLOT_MAX
            and (position is None or (type(position) is int and 0 <= position <= POSITION_MAX))
        ):  # fmt: skip
            for (what, largest), value in zip(_FIELD_LIMITS, (ledger_id, entry_id, slot), strict=True):
                if type(value) is not int or not 0 <= value <= largest:
                    raise ConfigError(f"bad offset {what} {value!r}: use an integer in 0..{largest}")
            check_position(position, "offset position")

    @classmethod
    def parse(cls, text: str) -> Offset:
        """The offset written as ``L:E`` or ``L:E:S``; anything else is a ConfigError."""
        matched = _OFFSET_TEXT.fullmatch(text) if isinstance(text, str) else None
        if matched is None:
            raise ConfigError(f"bad offset {shown_input(text)}: {_OFFSET_RULE}")
        numbers = [int(group) if group else 0 for group in matched.groups()]
        for (what, largest), value in zip(_FIELD_LIMITS, numbers, strict=True):
            if value > largest:
                raise ConfigError(f"bad offset {shown_input(text)}: {what} {value} is over {largest}; {_OFFSET_RULE}")
        return cls(*numbers)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.slot}"

    def key_within_ledger(self) -> tuple[int, int]:
        """Sort key among offsets of the SAME ledger; meaningless across ledgers (see module doc)."""
        return (self.entry_id, self.slot)

    def to_json(self) -> dict[str, int]:
        return {"ledger": self.ledger_id, "entry": self.entry_id, "slot": self.slot}

    @classmethod
    def from_json(cls, data: Any) -> Offset:
        """Inverse of `to_json`; ``slot`` may be left out (it is then 0)."""
        expected = 'expected {"ledger": L, "entry": E, "slot": S} with non-negative integers'
        if not isinstance(data, Mapping):
            raise ConfigError(f"bad offset {data!r}: {expected}")
        unknown = set(data) - {"ledger", "entry", "slot"}
        if unknown or "ledger" not in data or "entry" not in data:
            raise ConfigError(f"bad offset {data!r}: {expected}")
        return cls(data["ledger"], data["entry"], data.get("slot", 0))


_new = object.__new__
_set = object.__setattr__


def record_offset(ledger_id: int, entry_id: int, slot: int, position: int | None) -> Offset:
    """The Offset of a record the stream layer itself acknowledged or read, from parts it already
    holds as checked integers (ids from the ledger client and the segment list, a slot and a
    position it counted): built without the checks of `Offset(...)`, which a writer's
    acknowledgements and a reader's records would otherwise pay once per record (about 350 ns
    instead of 640 here)."""
    offset = _new(Offset)
    _set(offset, "ledger_id", ledger_id)
    _set(offset, "entry_id", entry_id)
    _set(offset, "slot", slot)
    _set(offset, "position", position)
    return offset


def check_position(position: Any, what: str = "position") -> int:
    """A stream position as given (an int in 0..POSITION_MAX), or one clear ConfigError."""
    if type(position) is not int or not 0 <= position <= POSITION_MAX:
        raise ConfigError(f"bad {what} {shown_input(position)}: use an integer in 0..{POSITION_MAX} (a record's "
                          "position in its stream, counted from the stream's first record)")
    return position


def shown_input(text: Any) -> str:
    """The input quoted for a message, cut short so junk cannot flood a log line."""
    shown = repr(text)
    return shown if len(shown) <= 80 else f"{shown[:60]}... ({len(shown)} characters)"
