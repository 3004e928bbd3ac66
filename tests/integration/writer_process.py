"""A ledger writer as its own process, for tests that kill it: prints `ledger <id>`, then one
`acked <entry id>` line per acknowledged append (flushed), until killed or --count is reached."""

from __future__ import annotations

import argparse
import asyncio
import sys

from bookkeeper.client import BookKeeper


async def main(zk: str, root: str, count: int, in_flight: int) -> None:
    async with BookKeeper(zk=zk, root=root) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"pw")
        print(f"ledger {handle.ledger_id}", flush=True)
        semaphore = asyncio.Semaphore(in_flight)

        def report(future: asyncio.Future[int]) -> None:
            semaphore.release()
            if not future.cancelled() and future.exception() is None:
                sys.stdout.write(f"acked {future.result()}\n")
                sys.stdout.flush()

        for index in range(count):  # bounded: at most in_flight appends wait at once
            await semaphore.acquire()
            handle.append_async(f"entry-{index}".encode()).add_done_callback(report)
        await asyncio.sleep(3600)  # stay alive, ledger open, until killed


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--in-flight", type=int, default=16)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.zk, arguments.root, arguments.count, arguments.in_flight))
