"""Producer ids for Kafka's InitProducerId, unique across the servers of a cluster, as Kafka's
brokers make them: a server claims a block of `PRODUCER_ID_BLOCK_SIZE` ids by one compare-and-set
on a shared record of the last block claimed (the caller stores it, e.g. a ZooKeeper node),
then hands them out one by one; an idempotent producer gets a fresh id with epoch 0 each time.
Pure: the caller reads the record, writes `block_after(record)` with compare-and-set (on a lost
race it reads again) and gives the block it won to `ProducerIds.on_block`. Ids of a block a
server did not hand out before it stopped are never used: blocks are never returned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bookkeeper.errors import CorruptMetadataError, invariant

PRODUCER_ID_BLOCK_SIZE = 1_000  # Kafka's PRODUCER_ID_BLOCK_SIZE
PRODUCER_ID_MAX = 2**63 - 1  # an int64; Kafka's -1 means "no producer id"


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    first: int
    last: int

    def to_bytes(self) -> bytes:
        return json.dumps({"version": 1, "first": self.first, "last": self.last}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ProducerIdBlock:
        try:
            document = json.loads(data)
            block = cls(document["first"], document["last"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise CorruptMetadataError(f"the producer id block record is not version 1 JSON with "
                                       f"first and last: {error}") from error
        if document.get("version") != 1 or not (type(block.first) is int and type(block.last) is int
                                                 and 0 <= block.first <= block.last <= PRODUCER_ID_MAX):
            raise CorruptMetadataError(f"the producer id block record holds a bad block {data[:200]!r}")
        return block


def block_after(claimed: ProducerIdBlock | None, size: int = PRODUCER_ID_BLOCK_SIZE) -> ProducerIdBlock:
    """The block to claim after the last one claimed (None: no block was ever claimed)."""
    first = 0 if claimed is None else claimed.last + 1
    invariant(size > 0 and first + size - 1 <= PRODUCER_ID_MAX,  # 2**63 ids: not in this universe's lifetime
              f"no producer id block of {size} is left after {first - 1}")
    return ProducerIdBlock(first, first + size - 1)


class ProducerIds:
    """Hands out the ids of the block this server claimed; `next_id` is None when it needs one."""

    def __init__(self) -> None:
        self._next = 0
        self._last = -1  # no block yet

    @property
    def needs_block(self) -> bool:
        return self._next > self._last

    def on_block(self, block: ProducerIdBlock) -> None:
        self._next, self._last = block.first, block.last

    def next_id(self) -> int | None:
        if self.needs_block:
            return None
        producer_id, self._next = self._next, self._next + 1
        return producer_id
