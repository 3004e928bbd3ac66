"""Spark's offset JSON (dlog_spark.offsets) is canonical, round-trips through Offsets, carries a slot only
when a position is inside an entry, and every malformed form is a ConfigError saying what is wanted."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper.errors import ConfigError
from dlog.offsets import ENTRY_ID_MAX, LEDGER_ID_MAX, SLOT_MAX, Offset
from dlog_spark.offsets import offset_document, offsets_of, parse_offsets

OFFSETS = st.builds(Offset, st.integers(0, LEDGER_ID_MAX), st.integers(0, ENTRY_ID_MAX), st.integers(0, SLOT_MAX))


def spark_text(offsets: dict[str, Offset]) -> str:
    """The text Spark writes to its checkpoint: the document as it is, in its own key order."""
    return json.dumps(offset_document(offsets), separators=(",", ":"))


def test_spark_offset_json_is_canonical() -> None:
    text = spark_text({"orders": Offset(12, 5), "a/b": Offset(3, 0)})
    assert text == '{"a/b":{"entry":0,"ledger":3},"orders":{"entry":5,"ledger":12}}'
    assert spark_text({"orders": Offset(12, 5, 2)}) == '{"orders":{"entry":5,"ledger":12,"slot":2}}'
    assert spark_text({}) == "{}"


@given(st.dictionaries(st.text(alphabet="abcXYZ09-", min_size=1, max_size=12).filter(lambda name: name[0] != "-"),
                       OFFSETS, max_size=5))
def test_spark_offsets_round_trip(offsets: dict[str, Offset]) -> None:
    text = spark_text(offsets)
    assert " " not in text and parse_offsets(text) == offsets
    assert offsets_of(json.loads(text)) == offsets  # what Spark hands back: parsed JSON
    assert spark_text(parse_offsets(text)) == text


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "Expecting value"),
        ("not json", "Expecting value"),
        ("[]", "not a JSON object"),
        ('"orders"', "not a JSON object"),
        ('{"orders": 5}', "bad Spark offset for stream 'orders'"),
        ('{"orders": {"ledger": 1}}', "bad Spark offset for stream 'orders'"),
        ('{"orders": {"ledger": 1, "entry": 2, "page": 0}}', "bad Spark offset for stream 'orders'"),
        ('{"orders": {"ledger": -1, "entry": 2}}', "bad Spark offset for stream 'orders'.*ledger id -1"),
        ('{"orders": {"ledger": 1, "entry": 2.0}}', "entry id 2.0"),
        ('{"orders": {"ledger": true, "entry": 2}}', "ledger id True"),
        ('{"orders": {"ledger": 1, "entry": -2}}', "entry id -2"),
        ('{"orders": {"ledger": 1, "entry": 2, "slot": -1}}', "slot -1"),
        ('{"orders": {"ledger": 1, "entry": 2}, "orders": {"ledger": 1, "entry": 3}}',
         "'orders' appears more than once"),
        ('{"../x": {"ledger": 1, "entry": 2}}', "bad stream name"),
        ('{"orders": {"ledger": 1, "entry": 2}} trailing', "Extra data"),
    ],
)
def test_malformed_spark_offsets_are_refused(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        parse_offsets(text)
    if "stream name" not in words:
        assert "expected JSON like" in str(caught.value)


def test_spark_offsets_refuse_huge_or_non_text_input_and_bad_streams_on_write() -> None:
    with pytest.raises(ConfigError, match="at most"):
        parse_offsets(" " * 1_000_001)
    with pytest.raises(ConfigError, match="bad Spark offsets"):
        parse_offsets(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bad Spark offsets.*not a JSON object"):
        offsets_of([1, 2])
    with pytest.raises(ConfigError, match="bad stream name"):
        offset_document({"": Offset(1, 2)})
