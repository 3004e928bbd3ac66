"""Sizes (`64KiB`, `256MiB`, `10GB`, plain bytes) and durations (`500ms`, `30s`, `2h`, `7d`): their
parsers, their click types (`SIZE`, `DURATION`: a bad value gets the parser's one line), and how
they are written back."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

import click

from bookkeeper.errors import ConfigError, DlogError

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                      "d": 86_400_000}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes from a size like `64KiB`; refuse anything else with a message saying what works."""
    match = _NUMBER_UNIT.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ConfigError(f"bad size {text!r}: write a whole number of bytes or a number with a "
                          "unit, like 65536, 64KiB, 256MiB or 10GB")
    size = float(match.group(1)) * _SIZE_UNITS[unit]
    if size != int(size):
        raise ConfigError(f"bad size {text!r}: it is not a whole number of bytes")
    return int(size)


def parse_duration_ms(text: str) -> int:
    """Milliseconds from a duration like `500ms`, `30s`, `2h` or `7d` (a unit is required, except
    for a plain 0, which settings use for "off")."""
    if str(text).strip() == "0":
        return 0
    match = _NUMBER_UNIT.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _DURATION_UNITS_MS:
        raise ConfigError(f"bad duration {text!r}: write a number with a unit, like 500ms, 30s, "
                          "5m, 2h or 7d")
    return int(float(match.group(1)) * _DURATION_UNITS_MS[unit])


def parse_duration_or_never_ms(text: str) -> int:
    """A duration as `parse_duration_ms` reads it, or `-1` for "never" (the tier's offload age and
    bookie-copy delete lag)."""
    if str(text).strip() in ("-1", "never"):
        return -1
    return parse_duration_ms(text)


def format_duration_ms(duration_ms: int) -> str:
    """The largest unit that shows the duration exactly: 7200000 -> '2h', 90000 -> '90s'."""
    for unit, size_ms in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if duration_ms and duration_ms % size_ms == 0:
            return f"{duration_ms // size_ms}{unit}"
    return f"{duration_ms}ms"


class ParsedType(click.ParamType):
    """A click type from one of the parsers above, so a bad value gets its one-line message."""

    def __init__(self, name: str, parse: Callable[[str], int]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            return self.parse(value)
        except DlogError as exc:
            self.fail(str(exc), param, ctx)


SIZE = ParsedType("size", parse_size)
DURATION = ParsedType("duration", parse_duration_ms)
DURATION_OR_NEVER = ParsedType("duration", parse_duration_or_never_ms)  # -1 (or "never"): never


def format_in_unit(amount: int, unit: str) -> str:
    """A size in bytes or a duration in milliseconds written in `unit` (`KiB`, `MiB`, `s`, `h`,
    `d`...), as the parsers above read it back: 524288, "KiB" -> '512KiB'; 86400000, "h" -> '24h'.
    An amount the unit does not divide is written in bytes or milliseconds."""
    durations = unit.lower() in _DURATION_UNITS_MS
    size = _DURATION_UNITS_MS[unit.lower()] if durations else _SIZE_UNITS[unit.lower()]
    if amount % size:
        return f"{amount}ms" if durations else str(amount)
    return f"{amount // size}{unit}"


def format_size(size_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size_bytes) < 1024 or unit == "GiB":
            return f"{size_bytes:.0f} {unit}" if unit == "B" else f"{size_bytes:.1f} {unit}"
        size_bytes /= 1024
    return f"{size_bytes:.1f} GiB"


def format_time_ms(time_ms: int | None, timespec: str = "milliseconds") -> str:
    """A record or segment time for people: local time with its UTC offset ('-' for none: 0 means
    unknown in segment metadata). `timespec` as datetime.isoformat's ("seconds" for tables)."""
    if not time_ms:
        return "-"
    moment = datetime.datetime.fromtimestamp(time_ms / 1000, tz=datetime.UTC).astimezone()
    return moment.isoformat(sep=" ", timespec=timespec)


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """'1 record', '2 records', '1,000 records'."""
    return f"{count:,} {noun if count == 1 else (plural_noun or noun + 's')}"
