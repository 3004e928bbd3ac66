"""The bookie's write-ahead journal: framed records, group commit, fdatasync, replay.

Theory of operation. ``append`` runs on the event-loop thread and only frames the record
into an in-memory buffer and remembers its callback: no lock, no future, no syscall. The
first record into an idle journal schedules a flush (``call_soon``, or after
``group_wait_us``). A flush swaps the buffer out and hands it to ONE dedicated writer
thread, which does ``pwrite`` (looping until every byte is written) and ``fdatasync``;
when that returns, the loop thread runs the group's callbacks in append order. Only one
flush is ever in flight: whatever arrives meanwhile forms the next group, which starts the
moment the previous fsync returns (adaptive group commit: the slower the disk, the bigger
the groups). The writer thread owns the file descriptor, file rolls and preallocation; the
loop thread owns the buffer, marks and callbacks, so the two share no mutable state except
through the executor hand-off.

File layout: ``<file_id:016x>.journal``, a 512-byte header (``DLJN`` + u32 version + zero
padding), then records ``length u32 | crc32c(record) u32 | record`` (little endian). Files
are preallocated with ``posix_fallocate`` so most fdatasyncs need not update the file size;
the zeros of preallocation read as length 0, which ends replay (so empty records are
refused).

The idle path: when nothing is being written and the disk's last fsync was quick, a group of one
record (of a writer that awaits each write, typically) is written and fsynced right on the loop
thread, without the two thread hops (see INLINE_BYTES_MAX).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from bookkeeper.clock import perf_s
from bookkeeper.errors import BookieIOError, ConfigError, invariant, known

log = logging.getLogger(__name__)

HEADER_BYTES = 512
MAGIC = b"DLJN"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sI")
_FRAME = struct.Struct("<II")
_pack_frame = _FRAME.pack  # bound once: append is the hottest code of the bookie
FRAME_BYTES = _FRAME.size
_SUFFIX = ".journal"
# The idle path: a group of one record of at most INLINE_BYTES_MAX that starts while nothing is
# being written, and while the disk's last group took at most INLINE_WRITE_S_MAX, is written and
# fsynced on the loop thread: one record of an idle writer then costs no hop to the writer thread
# and back (which, with the loop busy, also waits for the GIL). Groups of several records (a busy
# bookie: what arrived in one loop turn, or during the last fsync) go to the writer thread as before,
# so a busy journal still overlaps its fsyncs with the loop's work (an inline fsync would hold the
# loop, and the next group would form only after it: no overlap at all); and a slow disk never holds
# the loop (reads, long polls) for longer than one quick fsync.
INLINE_BYTES_MAX = 64 * 2**10
INLINE_WRITE_S_MAX = 0.001
LAZY_FLUSH_S = 0.05  # the longest a lazy record (append_lazy) waits for a group to carry it


@dataclass(frozen=True, slots=True, order=True)
class JournalMark:
    """A position in the journal: ``offset`` is just past the last record covered."""

    file_id: int
    offset: int


def journal_file_name(file_id: int) -> str:
    return f"{file_id:016x}{_SUFFIX}"


def list_journal_file_ids(directory: Path) -> list[int]:
    """Ids of the journal files in ``directory``, ascending; other files are ignored."""
    ids = []
    for name in os.listdir(directory):
        stem = name[: -len(_SUFFIX)]
        if name.endswith(_SUFFIX) and len(stem) == 16:
            try:
                ids.append(int(stem, 16))
            except ValueError:
                continue
    return sorted(ids)


def fsync_directory(directory: Path) -> None:
    """Make a create, rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class _Piece:
    """Bytes of one group that go to one file, starting at ``offset``."""

    file_id: int
    offset: int
    data: bytearray


class _Writer:
    """State of the writer thread: only ever touched from the journal's single executor."""

    def __init__(self, directory: Path, file_bytes_max: int, prealloc_bytes: int, sync: bool) -> None:
        self.directory = directory
        self.file_bytes_max = file_bytes_max
        self.prealloc_bytes = prealloc_bytes
        self.sync = sync
        self.fd: int | None = None
        self.file_id = -1
        self.allocated_bytes = 0

    def create(self, file_id: int) -> None:
        """Start ``file_id``: header, first preallocation, fsync of file and directory."""
        if self.fd is not None:
            # Its records must be durable before the group that rolled is reported durable.
            if self.sync:
                os.fdatasync(self.fd)
            os.close(self.fd)
            self.fd = None
        path = self.directory / journal_file_name(file_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.fd, self.file_id, self.allocated_bytes = fd, file_id, HEADER_BYTES
        header = _HEADER.pack(MAGIC, FORMAT_VERSION).ljust(HEADER_BYTES, b"\0")
        self.write_all(header, 0)
        self.ensure_allocated(HEADER_BYTES + 1)
        if self.sync:
            os.fsync(fd)
            fsync_directory(self.directory)

    def _open_fd(self) -> int:
        return known(self.fd, "a journal file is open while it is written")

    def ensure_allocated(self, end: int) -> None:
        if self.prealloc_bytes <= 0:
            return
        while end > self.allocated_bytes:
            # Never past the roll size, unless one record alone is bigger than that.
            target = min(self.allocated_bytes + self.prealloc_bytes, max(self.file_bytes_max, end))
            os.posix_fallocate(self._open_fd(), self.allocated_bytes, target - self.allocated_bytes)
            self.allocated_bytes = target

    def write_all(self, data: bytes | bytearray, offset: int) -> None:
        view = memoryview(data)
        written = 0
        while written < len(view):
            count = os.pwrite(self._open_fd(), view[written:], offset + written)
            if count <= 0:
                raise OSError(f"pwrite wrote {count} bytes to journal {self.file_id:016x}")
            written += count

    def fits(self, pieces: list[_Piece]) -> bool:
        """Whether writing `pieces` needs no new file and no preallocation (only quick syscalls)."""
        return all(piece.file_id == self.file_id and piece.offset + len(piece.data) <= self.allocated_bytes
                   for piece in pieces)

    def write_group(self, pieces: list[_Piece]) -> float:
        """Write and fdatasync one group; returns the seconds it took."""
        started = perf_s()
        for piece in pieces:
            if piece.file_id != self.file_id:
                self.create(piece.file_id)
            self.ensure_allocated(piece.offset + len(piece.data))
            self.write_all(piece.data, piece.offset)
        if self.sync:
            os.fdatasync(self._open_fd())
        return perf_s() - started

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Journal:
    """Write-ahead log with group commit; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        *,
        file_bytes_max: int = 256 * 2**20,
        prealloc_bytes: int = 16 * 2**20,
        group_bytes_max: int = 512 * 2**10,
        group_wait_us: int = 0,
        inline_bytes_max: int = INLINE_BYTES_MAX,
        buffered_bytes_max: int = 64 * 2**20,
        sync: bool = True,
        on_commit: Callable[[int, int, float], None] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        if file_bytes_max <= HEADER_BYTES + FRAME_BYTES:
            raise ConfigError(f"file_bytes_max={file_bytes_max} must exceed {HEADER_BYTES + FRAME_BYTES}")
        if prealloc_bytes < 0 or group_bytes_max <= 0 or group_wait_us < 0 or buffered_bytes_max <= 0:
            raise ConfigError("prealloc_bytes, group_wait_us must be >= 0; group/buffered bytes max > 0")
        self._directory = Path(directory)
        self._file_bytes_max = file_bytes_max
        self._group_bytes_max = group_bytes_max
        self._group_wait_seconds = group_wait_us / 1e6
        self._inline_bytes_max = inline_bytes_max if group_wait_us == 0 else 0
        self.inline_groups = 0  # groups written on the loop thread (the idle path)
        self._last_write_s = 0.0  # the last group's write + fdatasync
        self.buffered_bytes_max = buffered_bytes_max
        self._on_commit = on_commit
        self._on_fatal = on_fatal
        self._writer = _Writer(self._directory, file_bytes_max, prealloc_bytes, sync)
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = False
        self._accepting = False  # open, not closing, not failed: the one flag append checks
        self._closed = False
        self._failure: BaseException | None = None
        # Append side: where the next record goes, and what has not been handed off yet.
        self._file_id = 0
        self._offset = HEADER_BYTES
        self._buffer = bytearray()
        self._buffer_offset = HEADER_BYTES
        self._pieces: list[_Piece] = []  # full pieces of files rolled away from, not yet handed off
        self._pieces_bytes = 0
        self._callbacks: list[tuple[Callable[[object], None], object]] = []
        # Flush state: a flush is scheduled or in flight exactly when _scheduled is true.
        self._scheduled = False
        self._writing = False
        self._writing_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._lazy_timer: asyncio.TimerHandle | None = None  # armed while only lazy records wait
        self._durable = JournalMark(0, HEADER_BYTES)
        self._waiters: list[tuple[JournalMark, asyncio.Future[None]]] = []

    # --- replay ---------------------------------------------------------------------------

    def replay(self, start: JournalMark | None, visit: Callable[[bytes], None]) -> int:
        """Visit every valid record at or after ``start`` in order; returns how many."""
        invariant(not self._open, "replay must run before open_for_append")
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        file_ids = list_journal_file_ids(self._directory)
        if start is not None:
            file_ids = [file_id for file_id in file_ids if file_id >= start.file_id]
        count = 0
        for index, file_id in enumerate(file_ids):
            first = HEADER_BYTES
            if start is not None and file_id == start.file_id:
                first = max(start.offset, HEADER_BYTES)
            count += self._replay_file(file_id, first, visit, index == len(file_ids) - 1)
        return count

    def _replay_file(self, file_id: int, first: int, visit: Callable[[bytes], None], is_last: bool) -> int:
        path = self._directory / journal_file_name(file_id)
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            header = file.read(HEADER_BYTES)
            if len(header) < HEADER_BYTES or header[:4] != MAGIC:
                # A crash while the file was being created: it never held an acknowledged record.
                log.warning("journal %s has no valid header; skipping it", path.name)
                return 0
            (version,) = struct.unpack_from("<I", header, 4)
            if version != FORMAT_VERSION:
                raise BookieIOError(f"journal {path.name} has unknown format version {version}")
            if size <= first:
                return 0
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                count, offset, reason = _replay_records(mapped, first, size, visit)
        if reason and not is_last:
            log.warning("journal %s ends at offset %d (%s); replay goes on with the next file",
                        path.name, offset, reason)
        elif reason:
            log.info("journal %s: torn tail at offset %d (%s) ignored", path.name, offset, reason)
        return count

    # --- append ---------------------------------------------------------------------------

    async def open_for_append(self) -> None:
        """Start a new journal file, one past the highest id present."""
        invariant(not self._open and not self._closed, "open_for_append called twice or after close")
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-writer")
        existing = list_journal_file_ids(self._directory)
        self._file_id = (existing[-1] + 1) if existing else 1
        self._offset = self._buffer_offset = HEADER_BYTES
        await self._loop.run_in_executor(self._executor, self._writer.create, self._file_id)
        self._durable = JournalMark(self._file_id, HEADER_BYTES)
        self._open = self._accepting = True

    def append(self, record: bytes, callback: Callable[[object], None], argument: object) -> None:
        """Buffer ``record``; ``callback(argument)`` runs on the loop once it is fsynced."""
        self._frame(record)
        self._callbacks.append((callback, argument))
        if not self._scheduled:
            self._schedule()
        elif self._timer is not None and len(self._buffer) >= self._group_bytes_max:
            self._timer.cancel()
            self._timer = None
            self._flush()

    def append_lazy(self, record: bytes) -> None:
        """Buffer a record nobody waits for (an advisory explicit LAC): it is written with the next
        group, and starts one of its own only after LAZY_FLUSH_S, so it never costs a writer an
        fsync of its own between two of its adds."""
        self._frame(record)
        self._arm_lazy()

    def _frame(self, record: bytes) -> None:
        if not self._accepting:
            raise self._unavailable()
        size = len(record)
        end = self._offset + FRAME_BYTES + size
        if end > self._file_bytes_max or size == 0:
            end = self._make_room(size)
        buffer = self._buffer
        buffer += _pack_frame(size, crc32c(record))
        buffer += record
        self._offset = end

    def _arm_lazy(self) -> None:
        """Lazy records wait alone (no group scheduled): flush them within LAZY_FLUSH_S."""
        if not self._scheduled and self._lazy_timer is None and self._unwritten:
            self._lazy_timer = self._event_loop().call_later(LAZY_FLUSH_S, self._on_lazy_timer)

    def _on_lazy_timer(self) -> None:
        self._lazy_timer = None
        self._flush_lazy()

    def _flush_lazy(self) -> None:
        """Start a group for lazy records, unless one is scheduled or being written already."""
        if not self._scheduled and self._unwritten:
            self._scheduled = True
            self._flush()

    @property
    def _unwritten(self) -> bool:
        return bool(self._buffer or self._pieces)

    def _make_room(self, size: int) -> int:
        """The slow path of append: refuse empty records, roll when the file is full."""
        if size == 0:
            raise BookieIOError("empty journal records are not allowed (zeros mark the end of a file)")
        if self._offset > HEADER_BYTES:
            self._roll()
        return self._offset + FRAME_BYTES + size

    def _roll(self) -> None:
        """Later records go to the next file; the current buffer becomes a finished piece."""
        if self._buffer:
            self._pieces.append(_Piece(self._file_id, self._buffer_offset, self._buffer))
            self._pieces_bytes += len(self._buffer)
            self._buffer = bytearray()
        self._file_id += 1
        self._offset = self._buffer_offset = HEADER_BYTES

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        return known(self._loop, "the journal is open for append")

    def _schedule(self) -> None:
        self._scheduled = True
        if self._group_wait_seconds <= 0:
            self._event_loop().call_soon(self._flush, self._inline_bytes_max)
        else:
            self._timer = self._event_loop().call_later(self._group_wait_seconds, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._flush()

    def _flush(self, inline_bytes_max: int = 0) -> None:
        """Hand everything buffered to the writer thread, unless a flush is already in flight. A
        group of one record of at most `inline_bytes_max` bytes is written and fsynced right here on
        the loop thread instead, when the disk was quick and the group needs no new file or
        preallocation (a flush scheduled by the first record into an idle journal; INLINE_BYTES_MAX)."""
        if self._writing or self._failure is not None:
            return
        if not self._unwritten:
            self._scheduled = False
            return
        if self._lazy_timer is not None:  # this group carries the lazy records
            self._lazy_timer.cancel()
            self._lazy_timer = None
        pieces = self._pieces
        if self._buffer:
            pieces.append(_Piece(self._file_id, self._buffer_offset, self._buffer))
        group_bytes = sum(len(piece.data) for piece in pieces)
        callbacks, end = self._callbacks, JournalMark(self._file_id, self._offset)
        self._pieces, self._pieces_bytes, self._callbacks = [], 0, []
        self._buffer, self._buffer_offset = bytearray(), self._offset
        self._writing, self._writing_bytes = True, group_bytes
        if (len(callbacks) == 1 and group_bytes <= inline_bytes_max and self._last_write_s <= INLINE_WRITE_S_MAX
                and self._writer.fits(pieces)):  # the writer thread is idle: its state may be read
            self.inline_groups += 1
            try:
                seconds = self._writer.write_group(pieces)
            except Exception as error:  # the disk failed: as on the writer thread
                self._on_written(error, 0.0, callbacks, end, group_bytes)
                return
            self._on_written(None, seconds, callbacks, end, group_bytes)
            return
        future = self._event_loop().run_in_executor(self._executor, self._writer.write_group, pieces)
        future.add_done_callback(lambda done: self._on_written(
            done.exception(), 0.0 if done.exception() else done.result(), callbacks, end, group_bytes))

    def _on_written(
        self,
        error: BaseException | None,
        seconds: float,
        callbacks: list[tuple[Callable[[object], None], object]],
        end: JournalMark,
        group_bytes: int,
    ) -> None:
        self._writing, self._writing_bytes, self._last_write_s = False, 0, seconds
        if error is not None:
            self._fail(error)
            return
        self._durable = end
        # Start the next group before running callbacks so its fsync overlaps their work.
        if self._callbacks:
            self._flush()
        else:
            self._scheduled = False
            self._arm_lazy()  # lazy records alone: they can wait
        if self._on_commit is not None:
            try:
                self._on_commit(len(callbacks), group_bytes, seconds)
            except Exception:
                log.exception("journal on_commit hook failed")
        for callback, argument in callbacks:
            try:
                callback(argument)
            except Exception:
                log.exception("journal callback %r failed", callback)
        if self._waiters:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        durable, waiting = self._durable, []
        for mark, future in self._waiters:
            if mark <= durable:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((mark, future))
        self._waiters = waiting

    def _fail(self, error: BaseException) -> None:
        """The disk failed: nothing buffered or in flight is ever reported durable."""
        log.error("journal write failed; the journal is broken: %r", error)
        self._failure = error
        self._accepting = False
        self._callbacks, self._pieces, self._pieces_bytes, self._buffer = [], [], 0, bytearray()
        for timer in (self._timer, self._lazy_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._lazy_timer = None
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(self._unavailable())
        self._waiters = []
        if self._on_fatal is not None:
            try:
                self._on_fatal(error)
            except Exception:
                log.exception("journal on_fatal hook failed")

    def _unavailable(self) -> BookieIOError:
        if self._failure is not None:
            error = BookieIOError(f"journal failed: {self._failure!r}")
            error.__cause__ = self._failure
            return error
        return BookieIOError("journal is not open for append (not yet opened, or closed)")

    # --- positions and housekeeping -------------------------------------------------------

    def mark(self) -> JournalMark:
        """Just past everything appended so far, durable or not."""
        return JournalMark(self._file_id, self._offset)

    def durable_mark(self) -> JournalMark:
        """Just past everything fsynced."""
        return self._durable

    @property
    def full(self) -> bool:
        """True while the bytes not yet fsynced reach `buffered_bytes_max`: the server stops
        reading requests until a group commit brings them below it."""
        return self.buffered_bytes >= self.buffered_bytes_max

    @property
    def buffered_bytes(self) -> int:
        """Bytes appended and not yet durable (buffered plus the group being written)."""
        return len(self._buffer) + self._pieces_bytes + self._writing_bytes

    async def wait_durable(self, mark: JournalMark) -> None:
        """Return once everything up to ``mark`` is fsynced (raises if the journal failed)."""
        if self._failure is not None:
            raise self._unavailable()
        if mark <= self._durable:
            return
        invariant(mark <= self.mark(), f"wait_durable({mark}) is past the end {self.mark()}")
        future: asyncio.Future[None] = self._event_loop().create_future()
        self._waiters.append((mark, future))
        await future

    def release_before(self, mark: JournalMark) -> int:
        """Delete files whose records all lie before ``mark``; never one still written to."""
        limit = mark.file_id
        if self._open:
            limit = min(limit, self._durable.file_id, self._file_id)
        deleted = 0
        for file_id in list_journal_file_ids(self._directory):
            if file_id >= limit:
                break
            try:
                os.unlink(self._directory / journal_file_name(file_id))
                deleted += 1
            except FileNotFoundError:
                continue
        return deleted

    async def close(self) -> None:
        """Flush and fsync what is buffered (its callbacks run), then close; idempotent."""
        if self._closed:
            return
        self._accepting = False
        if self._open and self._failure is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
                self._flush()
            else:
                self._flush_lazy()
            try:
                await self.wait_durable(self.mark())
            except BookieIOError:
                pass  # already reported through on_fatal
        self._closed = True
        self._open = False
        if self._executor is not None:
            await self._event_loop().run_in_executor(self._executor, self._writer.close)
            self._executor.shutdown(wait=True)
            self._executor = None


def _replay_records(
    mapped: mmap.mmap, offset: int, size: int, visit: Callable[[bytes], None]
) -> tuple[int, int, str]:
    """Visit records from ``offset``; returns (count, stop offset, reason or '' if clean)."""
    count = 0
    unpack_frame = _FRAME.unpack_from
    while offset + FRAME_BYTES <= size:
        length, checksum = unpack_frame(mapped, offset)
        if length == 0:
            # Preallocated zeros are the normal end; anything else there is damage.
            return count, offset, "" if checksum == 0 else "zero length with a checksum"
        end = offset + FRAME_BYTES + length
        if end > size:
            return count, offset, f"record of {length} bytes runs past the end of the file"
        record = mapped[offset + FRAME_BYTES : end]
        if crc32c(record) != checksum:
            return count, offset, "checksum mismatch"
        visit(record)
        count += 1
        offset = end
    tail = size - offset
    return count, offset, "" if tail == 0 else f"{tail} trailing bytes"
