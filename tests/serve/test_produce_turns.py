"""A connection's Produce requests buffer their batches for a partition in request order, however
long each one's routing takes (Kafka processes a connection's requests in order; librdkafka's
ordering without idempotence relies on it)."""

from __future__ import annotations

import asyncio
import random

import pytest

from dlog.server.api import ConnectionState


async def _request(state: ConnectionState, index: int, delay_s: float, fails: bool, buffered: list[int]) -> None:
    previous, mine = state.produce_turn("t", 0)  # taken as the request starts, in request order
    await asyncio.sleep(delay_s)  # routing: metadata reads, a takeover
    try:
        if previous is not None:
            await asyncio.shield(previous)
        if fails:
            raise ConnectionError("routing failed")
        buffered.append(index)
        state.end_turn("t", 0, mine)
        await asyncio.sleep(delay_s)  # waiting for durability does not hold the next request back
    finally:
        state.end_turn("t", 0, mine)


@pytest.mark.parametrize("seed", range(5))
def test_batches_are_buffered_in_request_order_whatever_the_routing_delays(seed: int) -> None:
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, 0.01) for _ in range(40)]
    failing = {rng.randrange(40) for _ in range(5)}

    async def main() -> list[int]:
        state = ConnectionState(readers_max=1)
        buffered: list[int] = []
        tasks = [asyncio.create_task(_request(state, i, delays[i], i in failing, buffered)) for i in range(40)]
        await asyncio.gather(*tasks, return_exceptions=True)
        assert state.produce_turn("t", 0)[0] is None  # every turn ended: nothing waits on a finished request
        return buffered

    assert asyncio.run(main()) == [i for i in range(40) if i not in failing]


def test_partitions_do_not_wait_for_each_other() -> None:
    async def main() -> None:
        state = ConnectionState(readers_max=1)
        first, mine = state.produce_turn("t", 0)
        other_previous, other = state.produce_turn("t", 1)
        assert first is None and other_previous is None
        later, _ = state.produce_turn("t", 0)
        assert later is mine and not later.done()
        state.end_turn("t", 0, mine)
        assert later.done()

    asyncio.run(main())
