"""The journal replays exactly what was durably appended, calls back only after fdatasync, and group-commits."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

from bookkeeper.bookie import journal as journal_module
from bookkeeper.bookie.journal import HEADER_BYTES, Journal, JournalMark, journal_file_name, list_journal_file_ids
from bookkeeper.errors import BookieIOError


def record(index: int) -> bytes:
    return f"record-{index:06d}-".encode() + bytes([index % 251]) * (index % 50 + 1)


def replay_all(directory: Path, start: JournalMark | None = None) -> list[bytes]:
    seen: list[bytes] = []
    Journal(directory).replay(start, seen.append)
    return seen


async def write_records(directory: Path, count: int, **options: object) -> list[JournalMark]:
    """Append ``count`` records, close; returns the mark after each record."""
    journal = Journal(directory, **options)
    await journal.open_for_append()
    marks = []
    for index in range(count):
        journal.append(record(index), lambda _: None, None)
        marks.append(journal.mark())
    await journal.close()
    return marks


class SyscallLog:
    """Wraps os.pwrite / os.fdatasync to record what reached the disk, and when."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []  # (kind, fd, end offset written so far)
        self.written_end: dict[int, int] = {}
        self.pwrites = 0
        self.fdatasyncs = 0
        self.lock = threading.Lock()
        self.fail_fdatasync = False
        self.fdatasync_delay = 0.0
        self.threads: list[str] = []  # where each fdatasync ran
        self.really_sync = True  # False: a disk as quick as fdatasync_delay says, however busy this machine is

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

        def pwrite(fd: int, data: bytes, offset: int) -> int:
            count = real_pwrite(fd, data, offset)
            with self.lock:
                self.pwrites += 1
                self.written_end[fd] = max(self.written_end.get(fd, 0), offset + count)
            return count

        def fdatasync(fd: int) -> None:
            if self.fdatasync_delay:
                threading.Event().wait(self.fdatasync_delay)
            if self.fail_fdatasync:
                raise OSError(errno.EIO, "injected fdatasync failure")
            if self.really_sync:
                real_fdatasync(fd)
            with self.lock:
                self.fdatasyncs += 1
                self.threads.append(threading.current_thread().name)
                self.events.append(("fdatasync", fd, self.written_end.get(fd, 0)))

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fdatasync", fdatasync)


async def test_records_come_back_in_order_after_reopen(tmp_path: Path) -> None:
    called: list[int] = []
    journal = Journal(tmp_path)
    assert journal.replay(None, lambda _: None) == 0
    await journal.open_for_append()
    for index in range(2000):
        journal.append(record(index), called.append, index)
        if index % 300 == 0:
            await asyncio.sleep(0)  # let several groups form
    await journal.close()
    assert called == list(range(2000))
    assert replay_all(tmp_path) == [record(index) for index in range(2000)]
    # A second run starts a new file and replay sees both runs in order.
    await write_records(tmp_path, 10)
    assert len(list_journal_file_ids(tmp_path)) == 2
    assert replay_all(tmp_path) == [record(index) for index in range(2000)] + [record(index) for index in range(10)]


async def test_callback_never_runs_before_the_fdatasync_covering_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syscalls = SyscallLog()
    syscalls.install(monkeypatch)
    syscalls.fdatasync_delay = 0.002
    journal = Journal(tmp_path)
    await journal.open_for_append()
    record_end: dict[int, int] = {}

    def on_durable(index: int) -> None:
        with syscalls.lock:
            synced = max((end for kind, _, end in syscalls.events if kind == "fdatasync"), default=0)
        assert synced >= record_end[index], f"record {index} acknowledged before its fdatasync"
        syscalls.events.append(("callback", index, record_end[index]))

    for index in range(500):
        journal.append(record(index), on_durable, index)
        record_end[index] = journal.mark().offset
        if index % 37 == 0:
            await asyncio.sleep(0)
    await journal.close()
    callbacks = [event[1] for event in syscalls.events if event[0] == "callback"]
    assert callbacks == list(range(500))
    assert syscalls.fdatasyncs >= 2  # several groups really formed


async def test_many_appends_in_one_loop_iteration_make_one_write_and_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits: list[tuple[int, int, float]] = []
    journal = Journal(tmp_path, on_commit=lambda records, size, seconds: commits.append((records, size, seconds)))
    await journal.open_for_append()
    syscalls = SyscallLog()
    syscalls.fdatasync_delay = 0.05  # a slow disk: the time the commit hook reports must include it
    syscalls.install(monkeypatch)
    called: list[int] = []
    for index in range(1000):
        journal.append(b"x" * 100, called.append, index)
    assert journal.buffered_bytes == 1000 * 108
    assert journal.durable_mark() < journal.mark()
    await journal.wait_durable(journal.mark())
    assert (syscalls.pwrites, syscalls.fdatasyncs) == (1, 1)
    assert called == list(range(1000))
    # the hook is told the group's records, bytes and the seconds its write and fdatasync took
    assert len(commits) == 1 and commits[0][:2] == (1000, 1000 * 108) and commits[0][2] >= 0.05
    assert journal.durable_mark() == journal.mark() and journal.buffered_bytes == 0
    await journal.close()


async def test_records_arriving_during_an_fsync_form_the_next_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, inline_bytes_max=0)  # every group on the writer thread
    await journal.open_for_append()
    syscalls = SyscallLog()
    syscalls.install(monkeypatch)
    syscalls.fdatasync_delay = 0.05
    journal.append(b"first", lambda _: None, None)
    await asyncio.sleep(0.01)  # the first group is now inside its slow fdatasync
    for _ in range(20):
        for _ in range(10):
            journal.append(b"later", lambda _: None, None)
        await asyncio.sleep(0)
    await journal.wait_durable(journal.mark())
    assert syscalls.fdatasyncs == 2
    await journal.close()


async def test_an_idle_journal_writes_a_lone_record_on_the_loop_thread_and_a_busy_one_on_its_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle path: one awaited record at a time costs no hop to the writer thread and back; a group
    of several records, or one while the disk is slow, still goes to the writer thread (the loop keeps
    serving while it syncs)."""
    journal = Journal(tmp_path)
    await journal.open_for_append()
    syscalls = SyscallLog()
    syscalls.install(monkeypatch)
    syscalls.really_sync = False
    loop_thread = threading.current_thread().name
    called: list[int] = []
    for index in range(3):  # a writer that awaits each record: the journal is idle before each
        journal.append(record(index), called.append, index)
        await journal.wait_durable(journal.mark())
    assert called == [0, 1, 2] and syscalls.threads == [loop_thread] * 3 and journal.inline_groups == 3
    journal.append(record(3), called.append, 3)  # two records in one loop turn: a busy bookie's group
    journal.append(record(4), called.append, 4)
    await journal.wait_durable(journal.mark())
    assert syscalls.threads[3].startswith("journal-writer") and journal.inline_groups == 3
    syscalls.fdatasync_delay = 0.005  # the disk turns slow: one more lone record inline shows it
    for index in (5, 6):  # ... after which even lone records go to the writer thread
        journal.append(record(index), called.append, index)
        await journal.wait_durable(journal.mark())
    assert syscalls.threads[4] == loop_thread and syscalls.threads[5].startswith("journal-writer")
    syscalls.fdatasync_delay = 0.0
    for index in range(7, 10):  # quick again: the writer's group told it, so the idle path is back
        journal.append(record(index), called.append, index)
        await journal.wait_durable(journal.mark())
    assert syscalls.threads[6].startswith("journal-writer") and syscalls.threads[7:] == [loop_thread] * 2
    assert called == list(range(10))
    await journal.close()
    assert replay_all(tmp_path) == [record(index) for index in range(10)]


async def test_a_lazy_record_rides_with_the_next_group_and_is_written_on_its_own_only_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An advisory record (a bookie's explicit LAC) never costs an fsync of its own between a writer's
    adds: it goes with the next group, or alone after LAZY_FLUSH_S; close writes what is left."""
    journal = Journal(tmp_path)
    await journal.open_for_append()
    syscalls = SyscallLog()
    syscalls.install(monkeypatch)
    called: list[int] = []
    journal.append_lazy(b"lac-1")
    await asyncio.sleep(journal_module.LAZY_FLUSH_S / 5)
    assert syscalls.fdatasyncs == 0  # nobody waits for it: no group yet
    journal.append(b"add-1", called.append, 1)  # the next add carries it: one group, one fsync
    await journal.wait_durable(journal.mark())
    assert syscalls.fdatasyncs == 1 and called == [1] and journal.inline_groups == 1  # still a lone add
    journal.append_lazy(b"lac-2")  # the writer went idle: its last LAC is written alone, a bit later
    await asyncio.wait_for(journal.wait_durable(journal.mark()), timeout=5)
    assert syscalls.fdatasyncs == 2
    journal.append_lazy(b"lac-3")
    await journal.close()  # does not wait for the timer, and leaves nothing behind
    assert syscalls.fdatasyncs == 3
    assert replay_all(tmp_path) == [b"lac-1", b"add-1", b"lac-2", b"lac-3"]


async def test_a_group_that_needs_preallocation_is_never_written_on_the_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, prealloc_bytes=4096)
    await journal.open_for_append()
    syscalls = SyscallLog()
    syscalls.install(monkeypatch)
    syscalls.really_sync = False
    journal.append(b"z" * 100, lambda _: None, None)  # fits the first preallocation
    await journal.wait_durable(journal.mark())
    journal.append(b"z" * 5000, lambda _: None, None)  # needs more of the file: posix_fallocate
    await journal.wait_durable(journal.mark())
    assert syscalls.threads[0] == threading.current_thread().name
    assert syscalls.threads[1].startswith("journal-writer")
    await journal.close()


async def test_group_wait_timer_and_group_bytes_max(tmp_path: Path) -> None:
    journal = Journal(tmp_path, group_wait_us=10_000_000, group_bytes_max=4096)
    await journal.open_for_append()
    called: list[int] = []
    journal.append(b"y" * 100, called.append, 0)
    await asyncio.sleep(0.05)
    assert called == []  # still waiting on the (long) timer
    for index in range(1, 50):
        journal.append(b"y" * 100, called.append, index)  # passes group_bytes_max: flush now
    await asyncio.wait_for(journal.wait_durable(journal.mark()), timeout=5)
    assert called == list(range(50))
    await journal.close()


@pytest.mark.parametrize("damage", ["truncate", "junk", "flip"])
async def test_torn_tail_replays_exactly_the_valid_prefix(tmp_path: Path, damage: str) -> None:
    marks = await write_records(tmp_path, 100)
    path = tmp_path / journal_file_name(list_journal_file_ids(tmp_path)[-1])
    last_start, last_end = marks[-2].offset, marks[-1].offset
    with open(path, "r+b") as file:
        if damage == "truncate":
            file.truncate(last_start + (last_end - last_start) // 2)
        elif damage == "junk":
            file.seek(last_end)
            file.write(b"\x07\x00\x00\x00\xde\xad\xbe\xefjunk!!!")
        else:
            file.seek(last_end - 3)
            byte = file.read(1)
            file.seek(last_end - 3)
            file.write(bytes([byte[0] ^ 0x01]))
    expected = [record(index) for index in range(100 if damage == "junk" else 99)]
    assert replay_all(tmp_path) == expected
    # The next run never appends after the damage; replay goes on into the new file.
    await write_records(tmp_path, 3)
    assert replay_all(tmp_path) == expected + [record(index) for index in range(3)]


async def test_bad_record_in_the_middle_of_an_old_file_ends_that_file_only(tmp_path: Path) -> None:
    marks = await write_records(tmp_path, 50)
    await write_records(tmp_path, 5)
    first = tmp_path / journal_file_name(list_journal_file_ids(tmp_path)[0])
    with open(first, "r+b") as file:
        file.seek(marks[19].offset + 10)
        file.write(b"\xff\xff")
    assert replay_all(tmp_path) == [record(index) for index in range(20)] + [record(index) for index in range(5)]


async def test_replay_from_a_mark_skips_earlier_records(tmp_path: Path) -> None:
    marks = await write_records(tmp_path, 300, file_bytes_max=4096)
    assert len(list_journal_file_ids(tmp_path)) > 3
    for cut in (0, 1, 57, 150, 299):
        assert replay_all(tmp_path, marks[cut]) == [record(index) for index in range(cut + 1, 300)]
    assert replay_all(tmp_path, JournalMark(0, 0)) == [record(index) for index in range(300)]


async def test_file_roll_and_release_before(tmp_path: Path) -> None:
    journal = Journal(tmp_path, file_bytes_max=4096, prealloc_bytes=1024)
    await journal.open_for_append()
    for index in range(400):
        journal.append(record(index), lambda _: None, None)
        if index == 250:
            cut = journal.mark()
    await journal.wait_durable(journal.mark())
    files = list_journal_file_ids(tmp_path)
    assert len(files) > 5
    assert all(os.stat(tmp_path / journal_file_name(file_id)).st_size <= 4096 for file_id in files)
    deleted = journal.release_before(cut)
    assert deleted == sum(1 for file_id in files if file_id < cut.file_id) > 0
    assert list_journal_file_ids(tmp_path)[0] == cut.file_id
    # Even a mark past everything never deletes the file being written.
    journal.release_before(JournalMark(10**9, 0))
    assert list_journal_file_ids(tmp_path) == [journal.mark().file_id]
    await journal.close()
    tail = replay_all(tmp_path)
    assert tail == [record(index) for index in range(400 - len(tail), 400)]


async def test_a_write_error_breaks_the_journal_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fatal: list[BaseException] = []
    journal = Journal(tmp_path, on_fatal=fatal.append)
    await journal.open_for_append()
    good: list[int] = []
    journal.append(b"durable", good.append, 0)
    await journal.wait_durable(journal.mark())
    syscalls = SyscallLog()
    syscalls.install(monkeypatch)
    syscalls.fail_fdatasync = True
    acknowledged: list[int] = []
    for index in range(10):
        journal.append(b"doomed", acknowledged.append, index)
    with pytest.raises(BookieIOError):
        await journal.wait_durable(journal.mark())
    await asyncio.sleep(0.01)
    assert acknowledged == [] and good == [0]
    assert len(fatal) == 1 and isinstance(fatal[0], OSError)
    with pytest.raises(BookieIOError):
        journal.append(b"after", acknowledged.append, 99)
    await journal.close()
    await journal.close()  # idempotent
    assert acknowledged == []


async def test_empty_records_and_append_before_open_are_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    with pytest.raises(BookieIOError):
        journal.append(b"x", lambda _: None, None)
    await journal.open_for_append()
    with pytest.raises(BookieIOError):
        journal.append(b"", lambda _: None, None)
    await journal.close()
    with pytest.raises(BookieIOError):
        journal.append(b"x", lambda _: None, None)


async def test_file_header_and_preallocation(tmp_path: Path) -> None:
    await write_records(tmp_path, 1, prealloc_bytes=65536)
    path = tmp_path / journal_file_name(list_journal_file_ids(tmp_path)[0])
    data = path.read_bytes()
    assert data[:4] == b"DLJN" and data[4:8] == (1).to_bytes(4, "little")
    assert data[8:HEADER_BYTES] == bytes(HEADER_BYTES - 8)
    assert len(data) == HEADER_BYTES + 65536  # posix_fallocate extended it ahead of the writes
    assert journal_module.FRAME_BYTES == 8
