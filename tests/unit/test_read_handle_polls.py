"""A tailing ReadHandle's waits after failed long polls (bookkeeper/client/ledger.py,
LONG_POLL_RETRY): a new ledger's bookies answer NO_LEDGER until its first add reaches them, so the
reader asks the next bookie after 1 ms, then 2, 4 ... up to 50 ms, and starts over after an answer.
(A fixed 50 ms wait once cost a reader's first entries 50 ms each.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from bookkeeper.client import ledger as ledger_module
from bookkeeper.client.ledger import LONG_POLL_RETRY, ReadHandle
from bookkeeper.errors import NoSuchLedgerError
from bookkeeper.protocol.entry import Digest, DigestType
from bookkeeper.protocol.metadata import LedgerMetadata

METADATA = LedgerMetadata(3, 2, 2, ((0, ("b0", "b1", "b2")),))


class FakePool:
    """Answers long polls from a script: an exception, or the LAC the bookie knows."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.asked: list[str] = []

    def next_request_id(self) -> int:
        return len(self.asked)

    def send(self, bookie: str, request: Any, *, wait_s: float = 0.0) -> asyncio.Future[Any]:
        self.asked.append(bookie)
        future = asyncio.get_running_loop().create_future()
        outcome = self.script.pop(0)
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(SimpleNamespace(lac=outcome, packed_entry=b""))
        return future


class FakeStore:
    async def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return METADATA, 1


def no_ledger() -> NoSuchLedgerError:
    return NoSuchLedgerError("no ledger 7 on this bookie")


async def _polls(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], list[str], int]:
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded_sleep(delay_s: float) -> None:
        waits.append(delay_s)
        await real_sleep(0)

    monkeypatch.setattr(ledger_module.asyncio, "sleep", recorded_sleep)
    failures = 9
    pool = FakePool([no_ledger() for _ in range(failures)] + [0] + [no_ledger(), no_ledger()])
    context = SimpleNamespace(pool=pool, store=FakeStore(), jitter=lambda: 0.5)  # 0.5: no spread
    handle = ReadHandle(context, 7, METADATA, 1, Digest.for_ledger(DigestType.CRC32C, b"k"), b"k")  # type: ignore[arg-type]
    for _ in range(failures):
        assert await handle.wait_for_entry(0, timeout_ms=1000) is None
    assert await handle.wait_for_entry(0, timeout_ms=1000) is None and handle.last_add_confirmed == 0
    for _ in range(2):
        assert await handle.wait_for_entry(1, timeout_ms=1000) is None
    return waits, pool.asked, failures


def test_failed_long_polls_wait_1_ms_doubling_to_50_and_start_over_after_an_answer(monkeypatch):
    waits, asked, failures = asyncio.run(_polls(monkeypatch))
    expected = [min(LONG_POLL_RETRY.delay_s_max, 0.001 * 2**n) for n in range(failures)]
    assert waits[:failures] == pytest.approx(expected)  # 1, 2, 4 ... 32 ms, then 50 ms for good
    assert waits[failures:] == pytest.approx([0.001, 0.002])  # an answer started the waits over
    # each failure moves on to the ensemble's next bookie
    assert asked[:4] == ["b0", "b1", "b2", "b0"]


async def _first_polls() -> list[str]:
    pool = FakePool([0, 1, 2, 3])
    context = SimpleNamespace(pool=pool, store=FakeStore(), jitter=lambda: 0.5)
    handle = ReadHandle(context, 7, METADATA, 1, Digest.for_ledger(DigestType.CRC32C, b"k"), b"k")  # type: ignore[arg-type]
    for entry_id in range(4):
        await handle.wait_for_entry(entry_id, timeout_ms=1000)
    return pool.asked


def test_a_long_poll_for_an_entry_goes_to_the_first_bookie_of_its_write_set():
    """That bookie holds the entry (the answer carries it: no second round trip to read it), and a
    drained writer sends it the LAC at once (test_writer.py, eager LAC)."""
    assert asyncio.run(_first_polls()) == ["b0", "b1", "b2", "b0"]
