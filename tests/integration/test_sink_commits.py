"""The Spark sink's routed commit on a real ZooKeeper: `StreamStore.commit_many` appends to several
streams in one multi, each guarded by its own segment-list version, so when one list changed
meanwhile nothing lands in any stream; retried on fresh lists, everything lands at once."""

from __future__ import annotations

import pytest

from bookkeeper.errors import MetadataExistsError, MetadataVersionError
from bookkeeper.meta.zk import CreateOp
from dlog.segments.metadata import Segment, SegmentState, StreamConfig
from dlog.segments.store import StreamStore


def completed(sequence: int, ledger_id: int) -> Segment:
    return Segment(sequence, ledger_id, state=SegmentState.COMPLETED, last_entry=0, records=1, bytes=10)


async def test_a_routed_commit_lands_in_every_stream_or_in_none(zk, zk_root):
    store = StreamStore(zk, f"{zk_root}/dlog/ns")
    for name in ("eu", "us"):
        await store.create_stream(StreamConfig(name, password="p"))
    eu, us = await store.segments("eu"), await store.segments("us")
    await store.commit("us", us, create=[completed(1, 7)])  # a writer changed "us" meanwhile
    sink_op = CreateOp(store.sink_path("eu", "job"), b'{"batch": 0}')
    # the stale "us" change fails (its segment number is taken, its list version moved): all of it fails
    with pytest.raises((MetadataExistsError, MetadataVersionError)):
        await store.commit_many([("eu", eu, [completed(1, 10)], [sink_op]), ("us", us, [completed(1, 11)], [])])
    assert (await store.segments("eu")).segments == [] and await zk.get_or_none(store.sink_path("eu", "job")) is None

    us = await store.segments("us")
    await store.commit_many([("eu", eu, [completed(1, 10)], [sink_op]), ("us", us, [completed(2, 11)], [])])
    assert [s.ledger_id for s in (await store.segments("eu")).segments] == [10]
    assert [s.ledger_id for s in (await store.segments("us")).segments] == [7, 11]
    assert await zk.get_or_none(store.sink_path("eu", "job")) is not None
