"""The linger flusher: writers due in one round share one timer and one Arrow build, each gets its
own slice; a writer that flushed meanwhile is skipped; one writer's unbuildable records fail that
writer alone."""

from __future__ import annotations

import asyncio

from bookkeeper.errors import ConfigError
from dlog.linger import LingerFlusher
from dlog.segments.codec import DEFAULT_SCHEMA


class FakeWriter:
    class codec:  # noqa: N801  (the writer's codec, as the flusher reads it)
        schema = DEFAULT_SCHEMA

    def __init__(self, values: list[bytes], timestamps: list[object] | None = None) -> None:
        self.values = values
        self.timestamps = timestamps or [1000 + index for index in range(len(values))]
        self.round: int | None = None
        self.sent: list[tuple[list[bytes], tuple[int, int]]] = []
        self.rejected: list[Exception] = []

    def take_lingering(self, round_id: int):  # type: ignore[no-untyped-def]
        if self.round != round_id:
            return None
        return self.values, [None] * len(self.values), self.timestamps, [None] * len(self.values), 100

    def send_taken(self, batch, timestamps, futures, taken_bytes) -> None:  # type: ignore[no-untyped-def]
        self.sent.append((batch.column("value").to_pylist(), (min(timestamps), max(timestamps))))

    def reject_taken(self, futures, error) -> None:  # type: ignore[no-untyped-def]
        self.rejected.append(error)


async def test_writers_due_together_share_a_round_and_get_their_own_records():
    flusher = LingerFlusher(asyncio.get_running_loop())
    first, second, flushed = FakeWriter([b"a", b"b"]), FakeWriter([b"c"]), FakeWriter([b"x"])
    for writer in (first, second, flushed):
        writer.round = flusher.schedule(writer, 0.001)
    flushed.round = None  # it flushed on its own meanwhile
    while flusher.rounds_fired == 0:
        await asyncio.sleep(0.001)
    assert flusher.rounds_fired == 1 and flusher.entries_flushed == 2
    assert first.sent == [([b"a", b"b"], (1000, 1001))] and second.sent == [([b"c"], (1000, 1000))]
    assert flushed.sent == []


async def test_a_writer_whose_records_cannot_be_built_is_failed_alone():
    flusher = LingerFlusher(asyncio.get_running_loop())
    good, bad = FakeWriter([b"a"]), FakeWriter([b"b"], timestamps=["soon"])
    for writer in (good, bad):
        writer.round = flusher.schedule(writer, 0.001)
    while flusher.rounds_fired == 0:
        await asyncio.sleep(0.001)
    assert good.sent == [([b"a"], (1000, 1000))] and good.rejected == []
    assert bad.sent == [] and isinstance(bad.rejected[0], ConfigError)
