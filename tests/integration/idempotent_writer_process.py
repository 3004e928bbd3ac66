"""Named producers' writers as processes, for the test that kills them. This process imports dlog
once and then forks one writer process per stdin line `go <producer> <start> <die after>` (one at
a time: a process start costs seconds on a busy machine, a fork milliseconds), printing
`pid <pid>` and, once the writer process ended (finished or killed), `exit <status>` on a line
of its own (a kill may cut the writer's last line: only lines ending in `ok` count).

A writer process opens the stream's writer as <producer>, prints `resume <last sequence or -1>`,
and writes the records `<producer>:<sequence>` from sequence <start> to --count - 1 in batches of
--batch (a batch's sequences start at a multiple of --batch, so a resend is whole batches),
printing `acked <first> <last> ok` as each is acknowledged (a resend answered as a duplicate too),
then `done`. <die after> N > 0: after the N-th acknowledgement it SIGKILLs itself before
printing it (killed between the entry's acknowledgement and the application's)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from dlog import Namespace
from dlog.segments.codec import records_to_batch


async def write(arguments: argparse.Namespace, producer: str, start: int, die_after: int) -> None:
    async with Namespace(arguments.zk, arguments.namespace, bookkeeper_root=arguments.root) as ns:
        # takeover after a short wait: the killed writer's lock node lives on until its session expires
        writer = await ns.open_writer(arguments.stream, producer_id=producer, takeover=True, lock_timeout_s=0.2)
        last = writer.last_sequence
        print(f"resume {-1 if last is None else last}", flush=True)
        for acks, first in enumerate(range(start, arguments.count, arguments.batch), 1):  # bounded by --count
            last_in_batch = min(first + arguments.batch, arguments.count) - 1
            values = [f"{producer}:{sequence}".encode() for sequence in range(first, last_in_batch + 1)]
            await writer.write_batch(values, sequence=first)
            if acks == die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            print(f"acked {first} {last_in_batch} ok", flush=True)
        await writer.close()
    print("done", flush=True)


def main(arguments: argparse.Namespace) -> None:
    records_to_batch([b"warm"])  # a process's first Arrow batch costs seconds (lazy imports): done once here
    print("ready", flush=True)
    for line in sys.stdin:  # bounded by the test's lines
        _, producer, start, die_after = line.split()
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(write(arguments, producer, int(start), int(die_after)))
            finally:
                os._exit(0)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"\nexit {status}", flush=True)  # after a line the kill may have cut


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for option in ("--zk", "--root", "--namespace", "--stream"):
        parser.add_argument(option, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    main(parser.parse_args())
