"""The per-loop list of drivers whose explicit LAC is due a few loop turns after they drained
(bookkeeper/client/driver.py, LacDueSoon): each is served exactly LAC_DUE_TURNS turns after it
asked, once, and all of a turn share one callback."""

from __future__ import annotations

import asyncio
from typing import Any

from bookkeeper.client import driver as driver_module
from bookkeeper.client.driver import LAC_DUE_TURNS


class FakeDriver:
    def __init__(self, ledger_id: int, served: list[tuple[int, int]], clock: list[int]) -> None:
        self.ledger_id = ledger_id
        self._served = served
        self._clock = clock

    def lac_due(self) -> None:
        self._served.append((self.ledger_id, self._clock[0]))
        if self.ledger_id == 666:
            raise RuntimeError("a broken driver")


async def _run() -> tuple[list[tuple[int, int]], int, int, list[int]]:
    loop = asyncio.get_running_loop()
    turn = [0]
    served: list[tuple[int, int]] = []
    due = driver_module._LacDueTurns.of(loop)
    assert driver_module._LacDueTurns.of(loop) is due  # one per loop
    scheduled: list[int] = []
    real_call_soon = loop.call_soon

    def counting_call_soon(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        if getattr(callback, "__func__", None) is driver_module._LacDueTurns._turn:
            scheduled.append(turn[0])
        return real_call_soon(callback, *args, **kwargs)

    loop.call_soon = counting_call_soon  # type: ignore[method-assign,assignment]
    try:
        async def count_turns() -> None:
            for _ in range(3 * LAC_DUE_TURNS + 4):
                await asyncio.sleep(0)
                turn[0] += 1

        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)  # the counter runs first in each turn from now on
        asked_at = turn[0]
        for ledger_id in (1, 666, 2):  # many drivers in one turn; one that fails
            due.add(FakeDriver(ledger_id, served, turn))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        asked_later = turn[0]
        due.add(FakeDriver(3, served, turn))  # type: ignore[arg-type]
        await counter
    finally:
        loop.call_soon = real_call_soon  # type: ignore[method-assign]
    return served, asked_at, asked_later, scheduled


def test_each_driver_is_served_once_its_turns_later_with_one_callback_per_turn():
    served, asked_at, asked_later, scheduled = asyncio.run(_run())
    # each once, in order, LAC_DUE_TURNS turns after the turn it asked in (the counter ran first in
    # each turn, so a callback of turn T+k sees the counter at asked + k); a failing one spoils none
    assert [ledger for ledger, _ in served] == [1, 666, 2, 3]
    assert {at - asked_at for ledger, at in served if ledger != 3} == {LAC_DUE_TURNS}
    assert [at - asked_later for ledger, at in served if ledger == 3] == [LAC_DUE_TURNS]
    # one callback per turn while anything is due, none after
    assert len(scheduled) == len(set(scheduled))
    assert len(scheduled) == asked_later - asked_at + LAC_DUE_TURNS
