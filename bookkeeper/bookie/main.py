"""Run one bookie as the whole process: uvloop when installed, signals, exit status."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys

from bookkeeper.bookie.config import BookieConfig
from bookkeeper.bookie.service import BookieService
from bookkeeper.errors import DlogError
from bookkeeper.runtime import tune_garbage_collector

log = logging.getLogger("bookkeeper.bookie")


def install_event_loop_policy() -> None:
    try:
        import uvloop
    except ImportError:  # uvloop is optional (not on every platform)
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


SWITCH_INTERVAL_S = 0.0005


def share_the_interpreter_promptly() -> None:
    """A checkpoint's worker thread runs Python for a long while (entry log records and index
    keys for every entry); at the default 5 ms switch interval the event loop then waits up to
    5 ms for every step of an add or a read. Switching at 0.5 ms keeps the add path moving."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


PRIVATE_UMASK = 0o077


def keep_data_private() -> None:
    """What the bookie writes (journal, entry logs, index, cookie) is readable by its own user only:
    files 0600, directories 0700. rocksdict creates the index's files itself, so the process's mask
    is the one way to reach them all."""
    os.umask(PRIVATE_UMASK)


def take_the_open_files_limit() -> None:
    """Every client connection is an open file: raise the soft limit (often 1024) to the hard one.
    The server admits connections only up to that limit minus `reserved_open_files`, so the
    journal, entry logs and index still open when clients hold the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # an unlimited hard limit may be above the kernel's maximum
        log.info("keeping the open-file limit at %d (cannot raise it to %s: %s)", soft, hard, exc)


async def serve(config: BookieConfig, ready_line: bool = True) -> int:
    service = BookieService(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: loop.create_task(service.stop()))
    try:
        await service.start()
    except DlogError as exc:
        print(f"dlog bookie: {exc}", file=sys.stderr)
        await service.stop()
        return 2
    tune_garbage_collector()
    share_the_interpreter_promptly()
    if ready_line:
        # one parseable line for supervisors (dlog standalone, tests)
        print(f"bookie ready id={service.bookie_id} port={service.port} "
              f"http={service.http_url or '-'}", flush=True)
    await service.wait_stopped()
    return 1 if service.fatal_error is not None else 0


def run(config: BookieConfig) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # the CLI silences it for one-line errors
    keep_data_private()
    take_the_open_files_limit()
    install_event_loop_policy()
    return asyncio.run(serve(config))
