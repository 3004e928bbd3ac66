"""Offsets round-trip through "L:E[:S]" and JSON, and every malformed form is a ConfigError.

Also: offsets are not orderable across ledgers. (Spark's offset JSON: tests/spark/test_spark_offsets.py.)
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper.errors import ConfigError
from dlog.offsets import (
    ENTRY_ID_MAX,
    LEDGER_ID_MAX,
    SLOT_MAX,
    Offset,
)

LEDGER_IDS = st.integers(0, LEDGER_ID_MAX)
ENTRY_IDS = st.integers(0, ENTRY_ID_MAX)
SLOTS = st.integers(0, SLOT_MAX)
RULE = "write L:E or L:E:S with non-negative integers, e.g. 12:0:5"


@given(LEDGER_IDS, ENTRY_IDS, SLOTS)
def test_text_and_json_round_trip(ledger_id: int, entry_id: int, slot: int) -> None:
    offset = Offset(ledger_id, entry_id, slot)
    assert str(offset) == f"{ledger_id}:{entry_id}:{slot}"
    assert Offset.parse(str(offset)) == offset
    assert Offset.from_json(json.loads(json.dumps(offset.to_json()))) == offset
    assert Offset.parse(f"{ledger_id}:{entry_id}") == Offset(ledger_id, entry_id, 0)


def test_forms_and_defaults() -> None:
    assert Offset.parse("12:0:5") == Offset(12, 0, 5)
    assert Offset.parse("12:3") == Offset(12, 3) == Offset(12, 3, 0)
    assert str(Offset(12, 3)) == "12:3:0"
    assert Offset(1, 2, 3).to_json() == {"ledger": 1, "entry": 2, "slot": 3}
    assert Offset.from_json({"ledger": 1, "entry": 2}) == Offset(1, 2, 0)
    assert Offset.parse(f"{LEDGER_ID_MAX}:{ENTRY_ID_MAX}:{SLOT_MAX}") == Offset(LEDGER_ID_MAX, ENTRY_ID_MAX, SLOT_MAX)


@pytest.mark.parametrize(
    "text",
    ["", ":", "1", "1:", ":2", "1:2:", "1:2:3:4", "a:b", "1:b", "-1:2", "1:-2", "1:2:-3", "+1:2", "1.0:2",
     " 1:2", "1:2 ", "1 :2", "1:2\n", "\t1:2", "1:2\x00", "1_000:2", "0x10:2", "1e3:2", "١:٢", "1:٢", "１:２",
     "1；2", "L:E", "99999999999999999999:0"],
)
def test_malformed_text_is_refused_with_the_rule(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Offset.parse(text)
    assert str(caught.value) == f"bad offset {text!r}: {RULE}"


@pytest.mark.parametrize(
    ("text", "what"),
    [(f"{LEDGER_ID_MAX + 1}:0", "ledger id"), (f"0:{ENTRY_ID_MAX + 1}", "entry id"),
     (f"0:0:{SLOT_MAX + 1}", "slot"), ("9999999999999999999:0", "ledger id")],
)
def test_overflow_is_refused_naming_the_part(text: str, what: str) -> None:
    with pytest.raises(ConfigError, match=f"bad offset '{text}': {what} \\d+ is over") as caught:
        Offset.parse(text)
    assert RULE in str(caught.value)


@pytest.mark.parametrize("value", [None, 12, b"1:2", ["1", "2"]])
def test_non_text_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="bad offset"):
        Offset.parse(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields", [(-1, 0, 0), (0, -1, 0), (0, 0, -1), (LEDGER_ID_MAX + 1, 0, 0), (0, 0, SLOT_MAX + 1),
               (True, 0, 0), (1.0, 0, 0), ("1", 0, 0), (None, 0, 0)],
)
def test_constructor_refuses_out_of_range_or_non_integer_fields(fields: tuple[object, object, object]) -> None:
    with pytest.raises(ConfigError, match="bad offset (ledger id|entry id|slot)"):
        Offset(*fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data", [None, [1, 2], {"ledger": 1}, {"entry": 1}, {"ledger": 1, "entry": 2, "extra": 0},
             {"ledger": "1", "entry": 2}, {"ledger": 1, "entry": 2, "slot": -1}, {"ledger": 1.5, "entry": 2}],
)
def test_malformed_json_offsets_are_refused(data: object) -> None:
    with pytest.raises(ConfigError, match="bad offset"):
        Offset.from_json(data)


def test_offsets_do_not_order_across_ledgers_but_have_a_key_within_one() -> None:
    with pytest.raises(TypeError):
        _ = Offset(1, 0) < Offset(2, 0)  # stream order needs the segment list
    same_ledger = [Offset(7, 2, 0), Offset(7, 0, 9), Offset(7, 2, 1), Offset(7, 0, 0)]
    assert sorted(same_ledger, key=Offset.key_within_ledger) == [Offset(7, 0, 0), Offset(7, 0, 9), Offset(7, 2, 0),
                                                                  Offset(7, 2, 1)]
    assert len({Offset(1, 2, 3), Offset(1, 2, 3), Offset(1, 2)}) == 2  # hashable, by value
