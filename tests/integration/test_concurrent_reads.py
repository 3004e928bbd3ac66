"""Reads of one shared ledger handle may run at the same time: each gets exactly its own range."""

from __future__ import annotations

import asyncio

from bookkeeper.client import BookKeeper


async def test_concurrent_reads_of_one_handle_do_not_mix(cluster_factory):
    cluster = cluster_factory(bookies=3)
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as client:
        writer = await client.create_ledger(3, 2, 2, password=b"pw")
        await asyncio.gather(*(writer.append_async(b"entry-%d" % i) for i in range(300)))
        await writer.close()
        handle = await client.open_ledger(writer.ledger_id, password=b"pw", recovery=False)
        ranges = [(0, 99), (100, 199), (200, 299), (50, 250), (7, 7)]
        # bounded: reads that trample each other's state hang rather than fail
        results = await asyncio.wait_for(
            asyncio.gather(*(handle.read(first, last) for first, last in ranges)), 60)
        for (first, last), entries in zip(ranges, results):
            assert [e.entry_id for e in entries] == list(range(first, last + 1))
            assert [e.payload for e in entries] == [b"entry-%d" % i for i in range(first, last + 1)]
