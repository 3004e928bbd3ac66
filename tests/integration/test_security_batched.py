"""The batched requests of protocol version 2 pass the same authorization as the single ones on a
secure cluster: an ADD_BATCH is checked once per ledger of the frame (a forbidden or unknown
ledger's entries are refused in its one answer, the others are written, nothing is created), and a
READ_RANGE is a READ (or, with FENCE, a fencing READ)."""

from __future__ import annotations

import pytest

from bookkeeper.client.connection import BookieConnection
from bookkeeper.errors import ForbiddenError
from bookkeeper.protocol.batch import AddBatchRequest, AddBatchResponse, AddGroup, ReadRangeRequest
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import Status
from tests.integration.test_security import connect_security, namespace


@pytest.fixture(scope="module")
def orders_ledger(secure_cluster):  # type: ignore[no-untyped-def]
    """A stream's ledger in namespace `orders` (3 records in one entry each), and its password."""
    import asyncio

    async def write() -> tuple[int, bytes]:
        async with namespace(secure_cluster, "orders", ["produce:orders", "consume:orders"]) as ns:
            await ns.create_stream("batched", ensemble=2, write_quorum=2, ack_quorum=2, exist_ok=True)
            async with ns.open_writer("batched") as writer:
                offsets = [await writer.write(value) for value in (b"a", b"b", b"c")]
            return offsets[0].ledger_id, (await ns.config("batched")).password.encode()

    return asyncio.run(write())


async def test_an_add_batch_is_authorized_once_per_ledger_of_the_frame(secure_cluster, orders_ledger):
    ledger_id, password = orders_ledger
    secure = secure_cluster.secure_dir
    key, digest = master_key(password), Digest.for_ledger(DigestType.CRC32C, password)
    squatted = 9_000_000_123
    intruder = await BookieConnection.open(secure_cluster.bookies[0].address, security=connect_security(
        secure_cluster, secure.token("intruder", ["produce:billing"])))
    try:
        answer = await intruder.request(AddBatchRequest(intruder.next_request_id(), (
            AddGroup(ledger_id, key, (pack_entry(digest, ledger_id, 100, -1, 1, b"x"),
                                      pack_entry(digest, ledger_id, 101, -1, 2, b"y"))),
            AddGroup(squatted, key, (pack_entry(digest, squatted, 0, -1, 1, b"z"),)))))
    finally:
        await intruder.close()
    assert isinstance(answer, AddBatchResponse) and answer.entry_count == 3
    assert [(failure.index, failure.status) for failure in answer.failures] == [
        (0, Status.FORBIDDEN), (1, Status.FORBIDDEN), (2, Status.NO_LEDGER)]
    assert "orders" in answer.failures[0].message and "no metadata" in answer.failures[2].message


async def test_a_read_range_is_a_read_and_a_fencing_one_a_fence(secure_cluster, orders_ledger):
    ledger_id, password = orders_ledger
    secure = secure_cluster.secure_dir
    address = secure_cluster.bookies[0].address
    intruder = await BookieConnection.open(address, security=connect_security(
        secure_cluster, secure.token("intruder", ["produce:billing", "consume:billing"])))
    reader = await BookieConnection.open(address, security=connect_security(
        secure_cluster, secure.token("reader", ["consume:orders"])))
    try:
        with pytest.raises(ForbiddenError, match="orders"):
            await intruder.request(ReadRangeRequest(intruder.next_request_id(), ledger_id, 0, 2))
        with pytest.raises(ForbiddenError):  # a consumer may not fence (take over) the writer
            await reader.request(ReadRangeRequest(reader.next_request_id(), ledger_id, 0, 2, fence=True,
                                                  master_key=master_key(password)))
        answer = await reader.request(ReadRangeRequest(reader.next_request_id(), ledger_id, 0, 2))
        assert [entry_id for entry_id, _ in answer.entries] == [0, 1, 2]  # E2/Qw2: all here
    finally:
        await intruder.close()
        await reader.close()
