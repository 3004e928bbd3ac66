"""`make demo`: start a local cluster, append entries through the bookie protocol, read them back.

Each step checks its own result; the exit status is 0 only when every check passed.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

from bookkeeper.bookie.registration import list_bookies
from bookkeeper.client.connection import BookieConnection
from bookkeeper.errors import DlogError
from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry, unpack_entry
from tools.cluster import LocalCluster

ENTRY_COUNT = 10_000
IN_FLIGHT = 64
console = Console()


class DemoFailure(DlogError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise DemoFailure(message)


async def append_and_read(addresses: list[str], zk_address: str) -> list[tuple[str, str]]:
    summary: list[tuple[str, str]] = []
    zk = AsyncZooKeeper(zk_address)
    await zk.start()
    try:
        bookies = await list_bookies(zk, "/bookkeeper")
    finally:
        await zk.close()
    check(sorted(b["address"] for b in bookies) == sorted(addresses),
          f"registered bookies {bookies} differ from the started ones {addresses}")
    summary.append(("bookies registered in ZooKeeper", ", ".join(b["id"] for b in bookies)))

    ledger_id, password = 1, b"demo"
    key, digest = master_key(password), Digest.for_ledger(DigestType.CRC32C, password)
    connections = [await BookieConnection.open(address) for address in addresses]
    payloads = [f'{{"event": {i}, "user": "u{i % 97}", "action": "click"}}'.encode()
                for i in range(ENTRY_COUNT)]
    started = time.perf_counter()
    semaphore = asyncio.Semaphore(IN_FLIGHT)
    length = 0

    async def append(entry_id: int, packed: bytes) -> None:
        async with semaphore:
            # every entry to every bookie: a write quorum of 3, acknowledged once all fsynced
            await asyncio.gather(*(c.add(ledger_id, entry_id, key, packed) for c in connections))

    tasks = []
    for entry_id, payload in enumerate(payloads):
        length += len(payload)
        packed = pack_entry(digest, ledger_id, entry_id, entry_id - 1, length, payload)
        tasks.append(asyncio.create_task(append(entry_id, packed)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    summary.append(("entries appended (fsynced on 3 bookies)",
                    f"{ENTRY_COUNT:,} in {elapsed:.2f} s = {ENTRY_COUNT / elapsed:,.0f}/s"))
    await connections[0].write_lac(ledger_id, key, ENTRY_COUNT - 1)

    for connection in connections:
        lac = (await connection.read_lac(ledger_id)).lac
        check(lac >= ENTRY_COUNT - 2, f"bookie {connection.address} reports LAC {lac}")
        responses = await asyncio.gather(*(connection.read(ledger_id, entry_id)
                                           for entry_id in range(ENTRY_COUNT)))
        for entry_id, response in enumerate(responses):
            entry = unpack_entry(digest, response.entry, ledger_id, entry_id)
            check(entry.data == payloads[entry_id], f"entry {entry_id} differs on {connection.address}")
    summary.append(("entries read back and digest-checked", f"{ENTRY_COUNT:,} from each bookie"))
    for connection in connections:
        await connection.close()
    return summary


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dlog-demo-") as directory:
        console.print(f"[bold]dlog demo[/bold]: starting ZooKeeper and 3 bookies in {directory}")
        started = time.perf_counter()
        cluster = LocalCluster(directory, bookies=3)
        try:
            cluster.start()
            summary = [("cluster started", f"zk={cluster.zk_address} in "
                                            f"{time.perf_counter() - started:.1f} s")]
            summary += asyncio.run(append_and_read([b.address for b in cluster.bookies],
                                                   cluster.zk_address))
        except DlogError as exc:
            console.print(f"[red]demo failed:[/red] {exc}")
            return 1
        finally:
            cluster.stop()
        summary.append(("cluster stopped", "cleanly"))
    table = Table("step", "result", title="dlog demo")
    for step, result in summary:
        table.add_row(step, result)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
