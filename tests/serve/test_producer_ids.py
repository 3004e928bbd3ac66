"""Producer ids come from blocks claimed by compare-and-set on one shared record, so servers that
race for blocks never hand out one id twice, and a corrupt record is refused with one line."""

from __future__ import annotations

import random

import pytest

from bookkeeper.errors import CorruptMetadataError
from dlog.serve.producer_ids import PRODUCER_ID_BLOCK_SIZE, ProducerIdBlock, ProducerIds, block_after


class SharedRecord:
    """The stored last block, written only by compare-and-set on its version."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.version = 0

    def claim(self, read: tuple[bytes | None, int]) -> ProducerIdBlock | None:
        data, version = read
        block = block_after(None if data is None else ProducerIdBlock.from_bytes(data))
        if version != self.version:
            return None  # lost the race: read again
        self.data, self.version = block.to_bytes(), self.version + 1
        return block


def test_servers_racing_for_blocks_never_hand_out_an_id_twice():
    rng = random.Random(7)
    record = SharedRecord()
    servers = [ProducerIds() for _ in range(3)]
    reads: dict[int, tuple[bytes | None, int]] = {}
    handed: list[int] = []
    for _ in range(5_000):
        index = rng.randrange(len(servers))
        server = servers[index]
        if not server.needs_block:
            handed.append(server.next_id())
        elif index not in reads:
            reads[index] = (record.data, record.version)  # a read, answered later
        else:
            block = record.claim(reads.pop(index))
            if block is not None:
                server.on_block(block)
    assert len(handed) == len(set(handed)) > PRODUCER_ID_BLOCK_SIZE
    assert all(producer_id >= 0 for producer_id in handed)


def test_a_server_asks_for_a_block_when_its_own_runs_out():
    ids = ProducerIds()
    assert ids.needs_block and ids.next_id() is None
    ids.on_block(ProducerIdBlock(2_000, 2_001))
    assert [ids.next_id(), ids.next_id(), ids.next_id()] == [2_000, 2_001, None]
    assert block_after(ProducerIdBlock(2_000, 2_999)) == ProducerIdBlock(3_000, 3_999)
    assert block_after(None) == ProducerIdBlock(0, PRODUCER_ID_BLOCK_SIZE - 1)


@pytest.mark.parametrize("data", [b"", b"[]", b'{"version": 1, "first": 5}', b'{"version": 2, "first": 0, "last": 1}',
                                  b'{"version": 1, "first": 9, "last": 1}', b'{"version": 1, "first": -1, "last": 1}'])
def test_a_corrupt_block_record_is_refused_with_one_line(data):
    with pytest.raises(CorruptMetadataError) as caught:
        ProducerIdBlock.from_bytes(data)
    assert "\n" not in str(caught.value)
