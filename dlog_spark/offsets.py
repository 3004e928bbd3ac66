"""Spark's offsets of the dlog source: per stream the next entry to read, as JSON.

    {"orders": {"entry": 5, "ledger": 12}}                 # next: entry 5 of ledger 12
    {"orders": {"entry": 5, "ledger": 12, "slot": 3}}      # a start inside an entry (a timestamp)

Each position is an `Offset` (the one position type of a stream, `dlog.offsets`). Spark writes
the document the source returns as it is, so it is built with sorted stream names and sorted keys:
equal offsets are equal text in the checkpoint. A slot appears only when it is not 0, so
entry-aligned offsets keep their usual text. Spark hands the source its offsets back as parsed
JSON (`offsets_of`); the options `startingOffsets` and `endingOffsets` are text (`parse_offsets`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bookkeeper.errors import ConfigError
from dlog.names import check_stream_name
from dlog.offsets import Offset, shown_input

SPARK_OFFSETS_CHARS_MAX = 1_000_000
_EXPECTED = ('expected JSON like {"orders": {"entry": 0, "ledger": 12}} (stream -> next entry to read, '
             'optionally "slot": the first record to read in it)')


def offset_document(offsets: Mapping[str, Offset]) -> dict[str, dict[str, int]]:
    """What the source hands Spark: stream -> {"entry", "ledger"[, "slot"]}, in sorted order."""
    document = {}
    for stream in sorted(offsets):
        check_stream_name(stream)
        offset = offsets[stream]
        document[stream] = {"entry": offset.entry_id, "ledger": offset.ledger_id,
                            **({"slot": offset.slot} if offset.slot else {})}
    return document


def offsets_of(document: Any) -> dict[str, Offset]:
    """The offsets of a document Spark handed back (parsed JSON); malformed ones are a ConfigError."""
    if not isinstance(document, dict):
        raise ConfigError(f"bad Spark offsets {shown_input(document)}: not a JSON object; {_EXPECTED}")
    result = {}
    for stream, position in document.items():
        check_stream_name(stream)
        if not isinstance(position, dict) or not {"entry", "ledger"} <= set(position) <= {"entry", "ledger", "slot"}:
            raise ConfigError(f"bad Spark offset for stream {stream!r}: {position!r}; {_EXPECTED}")
        try:
            result[stream] = Offset(position["ledger"], position["entry"], position.get("slot", 0))
        except ConfigError as error:
            raise ConfigError(f"bad Spark offset for stream {stream!r}: {error}; {_EXPECTED}") from error
    return result


def parse_offsets(text: str) -> dict[str, Offset]:
    """The offsets written as JSON text (an option's value); malformed text is a ConfigError."""
    if not isinstance(text, str) or len(text) > SPARK_OFFSETS_CHARS_MAX:
        raise ConfigError(f"bad Spark offsets {shown_input(text)}: {_EXPECTED}, in at most "
                          f"{SPARK_OFFSETS_CHARS_MAX} characters")
    try:
        document = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except ValueError as error:  # JSONDecodeError, and our duplicate-key refusal
        raise ConfigError(f"bad Spark offsets {shown_input(text)}: {error}; {_EXPECTED}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"bad Spark offsets {shown_input(text)}: not a JSON object; {_EXPECTED}")
    return offsets_of(document)


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {key!r} appears more than once")
            seen.add(key)
    return document
