"""A stall of the client process (a long GC, application code holding the event loop) is not a
bookie's timeout: the connection's sweep moves every request deadline by the stall
(bookkeeper/protocol/ticks.py); a bookie that really does not answer still times out after it."""

from __future__ import annotations

import asyncio
import time

import pytest

from bookkeeper.client.connection import BookieConnection
from bookkeeper.errors import RequestTimeoutError
from bookkeeper.protocol.wire import ReadLacRequest


async def test_a_stalled_client_does_not_time_out_a_request_the_bookie_had_time_to_answer():
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)  # takes the request, never answers
        await asyncio.sleep(60)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connection = await BookieConnection.open(f"127.0.0.1:{port}", timeout_s=0.8)
    try:
        asked = asyncio.ensure_future(connection.request(ReadLacRequest(connection.next_request_id(), 1)))
        await asyncio.sleep(0.05)  # the request is out
        time.sleep(2.0)  # the process stalls (this test holds the event loop): 2.5 timeouts pass
        await asyncio.sleep(0.3)  # the sweep runs after the stall
        assert not asked.done(), "the stall was counted against the bookie"
        with pytest.raises(RequestTimeoutError, match="did not answer within 0.8 s"):
            await asyncio.wait_for(asked, timeout=10)  # a silent bookie still times out
    finally:
        await connection.close()
        server.close()
