"""The Spark sink's routed commit on a real ZooKeeper: the segment store's `commit_many` appends
to several streams in one multi, each guarded by its own segment-list version, so when one list
changed meanwhile nothing lands in any stream; retried on fresh lists, everything lands at once."""

from __future__ import annotations

import pytest

from bookkeeper.errors import MetadataVersionError
from dlog.segments.metadata import Segment, SegmentChange, SegmentState, SinkCommit, StreamConfig
from dlog.segments.store import StreamStore


def completed(sequence: int, ledger_id: int) -> Segment:
    return Segment(sequence, ledger_id, state=SegmentState.COMPLETED, last_entry=0, records=1, bytes=10)


async def test_a_routed_commit_lands_in_every_stream_or_in_none(zk, zk_root):
    store = StreamStore(zk, f"{zk_root}/dlog/ns")
    for name in ("eu", "us"):
        await store.create_stream(StreamConfig(name, password="p"))
    eu, us = await store.segments("eu"), await store.segments("us")
    await store.commit("us", us, SegmentChange(create=(completed(1, 7),)))  # a writer changed "us" meanwhile
    sink = SinkCommit("job", 0, (10,), None)
    # the stale "us" change fails (its list version moved): all of it fails, the sink record too
    with pytest.raises(MetadataVersionError, match="'us'"):
        await store.commit_many([("eu", eu, SegmentChange(create=(completed(1, 10),), sink=sink)),
                                 ("us", us, SegmentChange(create=(completed(1, 11),)))])
    assert (await store.segments("eu")).segments == () and await store.sink_batch("eu", "job") is None

    us = await store.segments("us")
    await store.commit_many([("eu", eu, SegmentChange(create=(completed(1, 10),), sink=sink)),
                             ("us", us, SegmentChange(create=(completed(2, 11),)))])
    assert [s.ledger_id for s in (await store.segments("eu")).segments] == [10]
    assert [s.ledger_id for s in (await store.segments("us")).segments] == [7, 11]
    recorded = await store.sink_batch("eu", "job")
    assert recorded is not None and recorded.batch_id == 0
