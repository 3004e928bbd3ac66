"""Sizes (`64KiB`, `256MiB`, `10GB`, plain bytes) and durations (`500ms`, `30s`, `2h`, `7d`)."""

from __future__ import annotations

import re

from bookkeeper.errors import ConfigError

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
    """Milliseconds from a duration like `500ms`, `30s`, `2h` or `7d` (a unit is required)."""
    match = _NUMBER_UNIT.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _DURATION_UNITS_MS:
        raise ConfigError(f"bad duration {text!r}: write a number with a unit, like 500ms, 30s, "
                          "5m, 2h or 7d")
    return int(float(match.group(1)) * _DURATION_UNITS_MS[unit])


def format_size(size_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size_bytes) < 1024 or unit == "GiB":
            return f"{size_bytes:.0f} {unit}" if unit == "B" else f"{size_bytes:.1f} {unit}"
        size_bytes /= 1024
    return f"{size_bytes:.1f} GiB"
