"""Positions in a stream as people write them: `--from` texts (offsets, stream positions, times,
times before now), the end of a stream, and the first offset a reader opened somewhere would read."""

from __future__ import annotations

import datetime
import re
from typing import Any

from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError
from dlog_tools.units import parse_duration_ms

_RELATIVE = re.compile(r"^-\s*(.+)$")
_FROM_RULE = ("use earliest, latest, an offset L:E[:S], a stream position (a whole number), a time like "
              "2026-11-20T10:00 (local time unless it names its zone), or a time before now like -15m")


def parse_start(text: str, now_ms: int | None = None, flag: str = "--from") -> str | int | datetime.datetime:
    """'earliest', 'latest', an offset text, a stream position (an int), or a time (an aware
    datetime: the reader starts at the first record at or after it); `flag` names the option in a
    message. What `open_reader` takes as its start."""
    from dlog import Offset
    from dlog.offsets import check_position

    if text in ("earliest", "latest"):
        return text
    if re.match(r"[0-9]+:", text):  # an offset, or a bad one: its own message says what is wrong
        Offset.parse(text)
        return text
    if re.fullmatch(r"[0-9]{1,19}", text, re.ASCII):
        return check_position(int(text), f"{flag} position")
    now_ms = wall_ms() if now_ms is None else now_ms
    relative = _RELATIVE.match(text)
    if relative:
        try:
            moment_ms = max(0, now_ms - parse_duration_ms(relative.group(1)))
        except ConfigError:
            raise ConfigError(f"bad {flag} {text!r}: {_FROM_RULE}") from None
        return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=moment_ms)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"bad {flag} {text!r}: {_FROM_RULE}") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # a time without a zone is local time
    return moment


async def end_of_stream(ns: Any, name: str) -> Any:
    """The offset just past the last record written so far (the last live segment's next entry),
    or None when no live segment holds an entry."""
    from dlog import Offset

    info = await ns.stream_info(name)
    for segment in reversed(info["segments"]):
        if segment["state"] != "truncated" and segment["last_entry"] is not None and segment["last_entry"] >= 0:
            return Offset(segment["ledger"], segment["last_entry"] + 1, 0)
    return None


async def first_offset_from(ns: Any, stream: str, start: str | int | datetime.datetime) -> Any:
    """The offset a reader opened at `start` would read first (for latest: the end of the stream)."""
    from dlog import Offset

    if isinstance(start, str) and start not in ("earliest", "latest"):
        offset = Offset.parse(start)
        listing = await ns.store.segments(stream)
        segment = listing.by_ledger(offset.ledger_id)
        if segment is None or segment.is_truncated:
            live = ", ".join(str(s.ledger_id) for s in listing.live) or "none"
            raise ConfigError(f"offset {offset} is not in stream {stream!r}: no live segment has ledger "
                              f"{offset.ledger_id} (its ledgers: {live})")
        return offset
    end = await end_of_stream(ns, stream)
    if start == "latest":
        if end is None:
            raise ConfigError(f"stream {stream!r} holds no records yet: reset to earliest instead")
        return end
    async with ns.open_reader(stream, start, follow=False) as reader:
        async for record in reader:
            return record.offset
    if end is None:
        raise ConfigError(f"stream {stream!r} holds no records yet: there is no offset to reset to")
    return end  # nothing at or after that time: the end
