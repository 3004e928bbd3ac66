"""Append-only entry log files: where checkpointed entries live on disk.

A log is ``<log_id:016x>.log``: a 16-byte header (``DLEL`` + u32 version + u64 log id) and
then records ``size u32 | crc32c u32 | ledger_id u64 | entry_id u64 | data`` (little endian),
where ``size`` is the length of ``data`` and the crc covers ledger id, entry id and data.
A location is one int, ``log_id << 32 | offset``. Logs roll at ``log_bytes_max``; a log is
never appended to after a restart (its torn tail stays behind, unindexed).

Per log we keep a *ledger map* (ledger_id -> bytes written for it) and the *synced bytes*
(how far the file is known fsynced). The storage persists both in its index whenever it
commits index entries that point into the log, so the map always covers every indexed
entry: compaction reads a log's live fraction from the map without scanning, and only ever
scans the synced prefix (beyond it is a torn, never-indexed tail).

Threading: one writer at a time (``append*``/``flush``/``take_dirty_metadata``; the storage's
writer lock serializes them). ``read`` and ``delete_log`` share the read-fd cache and are
serialized by the caller (the storage's index lock). ``scan`` opens its own descriptor.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from bookkeeper.errors import BookieIOError, ConfigError, invariant, known

LOG_MAGIC = b"DLEL"
LOG_FORMAT_VERSION = 1
_LOG_HEADER = struct.Struct("<4sIQ")
LOG_HEADER_BYTES = _LOG_HEADER.size
DEFAULT_FLUSH_BYTES = 2 * 2**20
_RECORD_HEAD = struct.Struct("<IIQQ")  # size, crc, ledger_id, entry_id
_SIZE_CRC = struct.Struct("<II")
_IDS = struct.Struct("<QQ")
RECORD_HEADER_BYTES = _RECORD_HEAD.size
_SUFFIX = ".log"
OFFSET_MASK = 0xFFFF_FFFF


def make_location(log_id: int, offset: int) -> int:
    return log_id << 32 | offset


def log_file_name(log_id: int) -> str:
    return f"{log_id:016x}{_SUFFIX}"


def encode_ledger_map(synced_bytes: int, ledger_bytes: dict[int, int]) -> bytes:
    flat = [synced_bytes]
    for ledger_id, count in ledger_bytes.items():
        flat.append(ledger_id)
        flat.append(count)
    return struct.pack(f"<{len(flat)}Q", *flat)


def decode_ledger_map(blob: bytes) -> tuple[int, dict[int, int]]:
    if len(blob) % 16 != 8:
        raise BookieIOError(f"corrupt entry-log ledger map ({len(blob)} bytes)")
    flat = struct.unpack(f"<{len(blob) // 8}Q", blob)
    return flat[0], dict(zip(flat[1::2], flat[2::2], strict=True))


@dataclass(frozen=True, slots=True)
class ScannedEntry:
    ledger_id: int
    entry_id: int
    location: int
    record_bytes: int
    data: bytes


class _LogInfo:
    """What we know about one log file (mutable: the writer grows it)."""

    __slots__ = ("ledger_bytes", "synced_bytes", "file_bytes")

    def __init__(self, ledger_bytes: dict[int, int], synced_bytes: int, file_bytes: int) -> None:
        self.ledger_bytes = ledger_bytes
        self.synced_bytes = synced_bytes
        self.file_bytes = file_bytes


class EntryLogger:
    """The set of entry log files of one storage directory; see the module docstring."""

    def __init__(self, directory: Path, *, log_bytes_max: int, write_buffer_bytes: int = 2**20,
                 flush_bytes: int = DEFAULT_FLUSH_BYTES) -> None:
        if not LOG_HEADER_BYTES < log_bytes_max <= 2**31:
            raise ConfigError(f"entry_log_bytes_max={log_bytes_max} must be in ({LOG_HEADER_BYTES}, 2**31]")
        if flush_bytes < 0:
            raise ConfigError(f"entry_log_flush_bytes={flush_bytes} must be >= 0 (0: only at checkpoints)")
        self._directory = Path(directory)
        self._log_bytes_max = log_bytes_max
        self._write_buffer_bytes = write_buffer_bytes
        # fdatasync every this many bytes written (0: only in flush()), as BookKeeper's
        # flushEntrylogBytes: the journal shares the disk, and one checkpoint's sync of tens of MB
        # would hold the journal's next fdatasync (and every add waiting on it) behind it
        self._flush_bytes = flush_bytes
        self._unsynced_bytes = 0
        self._logs: dict[int, _LogInfo] = {}
        self._read_fds: dict[int, int] = {}
        self.next_log_id = 1
        # Writer state.
        self._fd: int | None = None
        self._log_id = -1  # none yet
        self._position = 0  # logical end of the current log, buffered bytes included
        self._buffer = bytearray()
        self._dirty: set[int] = set()
        self._broken: BaseException | None = None

    def open(self, ledger_maps: dict[int, bytes], next_log_id: int) -> None:
        """Find the logs on disk; ``ledger_maps`` are the encoded maps the index kept."""
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in os.listdir(self._directory):
            stem = name[: -len(_SUFFIX)]
            if not (name.endswith(_SUFFIX) and len(stem) == 16):
                continue
            log_id = int(stem, 16)
            file_bytes = os.stat(self._directory / name).st_size
            synced_bytes, ledger_bytes = 0, dict[int, int]()
            if log_id in ledger_maps:
                synced_bytes, ledger_bytes = decode_ledger_map(ledger_maps[log_id])
            self._logs[log_id] = _LogInfo(ledger_bytes, min(synced_bytes, file_bytes), file_bytes)
        # Never reuse an id, even of a deleted log: stale metadata could attach to it.
        self.next_log_id = max([next_log_id, *[log_id + 1 for log_id in self._logs]])

    def close(self) -> None:
        if self._fd is not None:
            if self._broken is None:
                self.flush()
            os.close(self._fd)
            self._fd = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    # --- writer ---------------------------------------------------------------------------

    @property
    def current_log_id(self) -> int | None:
        return None if self._log_id < 0 else self._log_id

    def append_entries(self, ledger_id: int, entry_ids: list[int], entries: dict[int, bytes]) -> list[int]:
        """Append ``entries[e]`` for each e in ``entry_ids``; returns their locations."""
        if self._broken is not None:
            raise BookieIOError(f"entry logger broken by an earlier error: {self._broken!r}")
        locations = []
        pack_head, pack_ids = _RECORD_HEAD.pack, _IDS.pack
        ledger_total = 0
        for entry_id in entry_ids:
            data = entries[entry_id]
            record_bytes = RECORD_HEADER_BYTES + len(data)
            if self._fd is None or (
                self._position + record_bytes > self._log_bytes_max and self._position > LOG_HEADER_BYTES
            ):
                self._add_ledger_bytes(ledger_id, ledger_total)
                ledger_total = 0
                self._roll()
            # the crc covers ids then data: chained, so the record is never copied whole
            buffer = self._buffer
            buffer += pack_head(len(data), crc32c(data, crc32c(pack_ids(ledger_id, entry_id))), ledger_id, entry_id)
            buffer += data
            locations.append(self._log_id << 32 | self._position)
            self._position += record_bytes
            ledger_total += record_bytes
            if len(buffer) >= self._write_buffer_bytes:
                self._write_buffer()
        self._add_ledger_bytes(ledger_id, ledger_total)
        return locations

    def _add_ledger_bytes(self, ledger_id: int, count: int) -> None:
        if count:
            ledger_bytes = self._logs[self._log_id].ledger_bytes
            ledger_bytes[ledger_id] = ledger_bytes.get(ledger_id, 0) + count

    def _roll(self) -> None:
        """Seal the current log (if any) and start the next one."""
        try:
            if self._fd is not None:
                self.flush()
                os.close(self._fd)
                self._fd = None
            log_id = self.next_log_id
            self.next_log_id += 1
            path = self._directory / log_file_name(log_id)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            self._fd, self._log_id, self._position = fd, log_id, LOG_HEADER_BYTES
            self._logs[log_id] = _LogInfo({}, 0, 0)
            self._buffer += _LOG_HEADER.pack(LOG_MAGIC, LOG_FORMAT_VERSION, log_id)
            self._dirty.add(log_id)
            # The index will point into this file: its name must survive a crash.
            dir_fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as error:
            self._broken = error
            raise BookieIOError(f"cannot roll entry log: {error!r}") from error

    def _write_buffer(self) -> None:
        fd = known(self._fd, "an entry log is open while records are buffered")
        view = memoryview(self._buffer)
        start = self._position - len(view)
        written = 0
        try:
            while written < len(view):
                count = os.pwrite(fd, view[written:], start + written)
                invariant(count > 0, "pwrite to an entry log wrote nothing")
                written += count
        except OSError as error:
            self._broken = error
            raise BookieIOError(f"cannot write entry log {self._log_id:016x}: {error!r}") from error
        finally:
            view.release()
        self._buffer = bytearray()
        self._logs[self._log_id].file_bytes = self._position
        self._unsynced_bytes += written
        if self._flush_bytes and self._unsynced_bytes >= self._flush_bytes:
            self._sync()

    def _sync(self) -> None:
        try:
            os.fdatasync(known(self._fd, "an entry log is open when it is synced"))
        except OSError as error:
            self._broken = error
            raise BookieIOError(f"cannot fdatasync entry log {self._log_id:016x}: {error!r}") from error
        self._unsynced_bytes = 0

    def flush(self) -> None:
        """Write what is buffered and fdatasync the current log."""
        if self._fd is None:
            return
        if self._broken is not None:
            raise BookieIOError(f"entry logger broken by an earlier error: {self._broken!r}")
        self._write_buffer()
        self._sync()
        self._logs[self._log_id].synced_bytes = self._position
        self._dirty.add(self._log_id)

    def take_dirty_metadata(self) -> list[tuple[int, bytes]]:
        """Encoded ledger maps of logs changed since the last call (after ``flush``)."""
        dirty, self._dirty = self._dirty, set()
        return [
            (log_id, encode_ledger_map(self._logs[log_id].synced_bytes, self._logs[log_id].ledger_bytes))
            for log_id in sorted(dirty)
            if log_id in self._logs
        ]

    # --- readers --------------------------------------------------------------------------

    def read(self, location: int, record_bytes: int, ledger_id: int, entry_id: int) -> bytes:
        """The data of the record at ``location``; BookieIOError if it is damaged."""
        log_id, offset = location >> 32, location & OFFSET_MASK
        try:
            fd = self._read_fds.get(log_id)
            if fd is None:
                fd = os.open(self._directory / log_file_name(log_id), os.O_RDONLY | os.O_CLOEXEC)
                self._read_fds[log_id] = fd
            record = os.pread(fd, record_bytes, offset)
        except OSError as error:
            raise BookieIOError(f"cannot read entry log {log_id:016x}: {error!r}") from error
        if len(record) == record_bytes:
            size, checksum, stored_ledger, stored_entry = _RECORD_HEAD.unpack_from(record)
            if (
                size + RECORD_HEADER_BYTES == record_bytes
                and stored_ledger == ledger_id
                and stored_entry == entry_id
                and crc32c(memoryview(record)[8:]) == checksum
            ):
                return record[RECORD_HEADER_BYTES:]
        raise BookieIOError(
            f"entry {ledger_id}:{entry_id} at log {log_id:016x} offset {offset} is damaged"
        )

    def scan(self, log_id: int) -> Iterator[ScannedEntry]:
        """Every record in the synced prefix of ``log_id``, verified; raises on damage."""
        info = self._logs[log_id]
        end = info.synced_bytes
        if end <= LOG_HEADER_BYTES:
            return
        path = self._directory / log_file_name(log_id)
        try:
            with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                if len(mapped) < end or _LOG_HEADER.unpack_from(mapped) != (LOG_MAGIC, LOG_FORMAT_VERSION, log_id):
                    raise BookieIOError(f"entry log {path.name} has a bad header or is shorter than it was synced")
                offset = LOG_HEADER_BYTES
                while offset < end:
                    entry = _scan_record(mapped, log_id, offset, end)
                    yield entry
                    offset += entry.record_bytes
        except OSError as error:
            raise BookieIOError(f"cannot scan entry log {path.name}: {error!r}") from error

    def log_ids(self) -> list[int]:
        return sorted(self._logs)

    def ledger_bytes(self, log_id: int) -> dict[int, int]:
        return dict(self._logs[log_id].ledger_bytes)

    def file_bytes(self, log_id: int) -> int:
        return self._logs[log_id].file_bytes

    def delete_log(self, log_id: int) -> None:
        """Remove a log nothing in the index points to (caller holds writer and read locks)."""
        invariant(log_id != self._log_id, f"cannot delete the log being written ({log_id:016x})")
        fd = self._read_fds.pop(log_id, None)
        if fd is not None:
            os.close(fd)
        self._logs.pop(log_id, None)
        self._dirty.discard(log_id)
        try:
            os.unlink(self._directory / log_file_name(log_id))
        except FileNotFoundError:
            pass

    def total_file_bytes(self) -> int:
        total = 0
        for entry in os.scandir(self._directory):
            if entry.name.endswith(_SUFFIX):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    continue  # compaction deleted it meanwhile
        return total


def _scan_record(mapped: mmap.mmap, log_id: int, offset: int, end: int) -> ScannedEntry:
    if offset + RECORD_HEADER_BYTES > end:
        raise BookieIOError(f"entry log {log_id:016x}: record header at {offset} crosses the synced end")
    size, checksum, ledger_id, entry_id = _RECORD_HEAD.unpack_from(mapped, offset)
    record_bytes = RECORD_HEADER_BYTES + size
    if offset + record_bytes > end or crc32c(mapped[offset + 8 : offset + record_bytes]) != checksum:
        raise BookieIOError(f"entry log {log_id:016x}: damaged record at offset {offset}")
    data = mapped[offset + RECORD_HEADER_BYTES : offset + record_bytes]
    return ScannedEntry(ledger_id, entry_id, make_location(log_id, offset), record_bytes, data)
