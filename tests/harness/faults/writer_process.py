"""A stream writer as its own process, for faults that kill or stop the writer: runs one WriterLoop
family, appends its operations to the shared history file, and prints `open <session> <ledger>`
once a session is open and `acked <count>` every ACK_REPORT_EVERY acknowledgements (flushed)."""

from __future__ import annotations

import argparse
import asyncio
import functools
from types import SimpleNamespace

from tests.harness.faults.clients import Settings, WriterLoop
from tests.harness.history import History

ACK_REPORT_EVERY = 25


async def main(arguments: argparse.Namespace) -> None:
    if arguments.session_timeout:
        import dlog.namespace
        from bookkeeper.meta.zk import AsyncZooKeeper

        # a short ZooKeeper session, so a SIGSTOP can outlast it within a test's time
        dlog.namespace.AsyncZooKeeper = functools.partial(  # type: ignore[misc]
            AsyncZooKeeper, session_timeout_s=arguments.session_timeout)
    cluster = SimpleNamespace(zk_address=arguments.zk, zk_root=arguments.root)
    settings = Settings(stream=arguments.stream, namespace=arguments.namespace,
                        write_interval_s=arguments.interval, writes_max=arguments.writes_max)
    history = History(arguments.history, process_tag=f"{arguments.family}-p")
    loop = WriterLoop(cluster, settings, history, arguments.family, takeover=arguments.takeover,
                      reopen_on_fence=False, reopen=not arguments.no_reopen)
    task = asyncio.create_task(loop.run())
    reported_sessions, reported_acks = 0, 0
    while not task.done():
        if loop.opened.is_set() and loop.sessions != reported_sessions and loop.writer is not None:
            reported_sessions = loop.sessions
            segment = loop.writer.segment
            print(f"open {loop.session_name} {segment.ledger_id if segment else -1}", flush=True)
        if len(loop.acked) >= reported_acks + ACK_REPORT_EVERY:
            reported_acks = len(loop.acked)
            print(f"acked {reported_acks}", flush=True)
        await asyncio.sleep(0.01)
    await task
    print("done", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--zk", required=True)
    parser.add_argument("--root", required=True, help="the BookKeeper root; streams live at <root>-dlog")
    parser.add_argument("--namespace", default="faults")
    parser.add_argument("--stream", default="faults")
    parser.add_argument("--history", required=True)
    parser.add_argument("--family", default="p1")
    parser.add_argument("--writes-max", type=int, default=100_000)
    parser.add_argument("--interval", type=float, default=0.002)
    parser.add_argument("--takeover", action="store_true")
    parser.add_argument("--session-timeout", type=float, default=0.0)
    parser.add_argument("--no-reopen", action="store_true", help="exit when the first writer breaks")
    asyncio.run(main(parser.parse_args()))
