"""Ledger storage: write cache, entry logs, rocksdict index, ledger states, checkpoint, compaction.

Theory of operation
-------------------
Threads. The event-loop thread (L) runs the hot path (``add_entry``, ``get_entry``,
``last_entry_id``) and the rare calls (states, ``delete_ledger``, begin/end checkpoint).
A worker thread (W) runs ``flush_checkpoint`` and ``compact``. The write cache, the last
entry ids and the ledger states belong to L; W only does ``key in dict`` checks on them
(atomic under the GIL) and reads checkpoint snapshots, which L never mutates after
``begin_checkpoint`` swapped them out.

Locks (none on the hot path; the cache paths of ``get_entry`` take none):
* ``_writer_lock`` (W): one entry-log writer at a time, held from a batch's first append to
  its index commit. So when compaction lists logs below the current one under this lock, none
  has an append whose index entries are still to come.
* ``_compaction_lock`` (W): one compaction at a time.
* ``_index_lock`` (L and W, short): L holds it over a disk read (index get + pread) and over
  ``delete_ledger``; W over each index batch write and over unlinking a log. A location read
  under the lock is read from under the same lock, and a log is unlinked only after the index
  no longer points into it, so a reader never sees a location of a deleted file. W never holds
  it across entry-log I/O or fsync; index batches are chunked to keep it short.

Deletes racing writers: ``delete_ledger`` adds the ledger to every registered *watcher* set
(the in-flight checkpoint snapshot, a running compaction). Before writing an index batch under
``_index_lock`` a writer drops the ledgers its watcher holds, so a delete is never undone.

Durability order: entry log fdatasync, then index batches, then a synced rocksdict WAL (which
also covers earlier unsynced ``put_state``/``delete_ledger`` writes); only then may the caller
save the journal mark. Compaction syncs the WAL before it unlinks a log. Each log's ledger map
is persisted before (or with) the first index entry pointing into it.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from crc32c import crc32c
from rocksdict import Options, Rdict, WriteBatch

from bookkeeper.bookie.entrylog import (
    DEFAULT_FLUSH_BYTES,
    RECORD_HEADER_BYTES,
    EntryLogger,
    ScannedEntry,
)
from bookkeeper.bookie.journal import JournalMark, fsync_directory
from bookkeeper.errors import BookieIOError, invariant, known

_INDEX_KEY = struct.Struct(">BQQ")  # big endian so one ledger's keys are contiguous and sorted
_INDEX_VALUE = struct.Struct("<QI")  # location, record bytes
_LEDGER_KEY = struct.Struct(">BQ")
_INDEX, _STATE, _LEDGER_MAP = ord("i"), ord("s"), ord("m")
_NEXT_LOG_ID_KEY = b"n"
_STATE_HEAD = struct.Struct("<BBqI")  # version, fenced, explicit_lac, master key bytes
_STATE_VERSION = 1
_MARK = struct.Struct("<4sQQ")
_MARK_MAGIC = b"DLMK"
_CHUNK_PUTS = 4096  # index puts per batch: bounds how long _index_lock (and the GIL) is held
# A checkpoint is Python work per entry in a worker thread, and the event loop needs the GIL to
# answer adds and long polls: between chunks of this many entries the worker sleeps a moment, so
# the loop waits for the GIL at most about one chunk's work (~0.5 ms) instead of the switch interval
# after each of its system calls (a checkpoint of 100,000 entries takes ~60 ms longer)
CHECKPOINT_CHUNK_ENTRIES = 256
CHECKPOINT_PAUSE_S = 0.0002
_RELOCATE_BATCH_BYTES = 4 * 2**20


@dataclass(frozen=True, slots=True)
class LedgerData:
    """What a bookie knows about a ledger besides its entries (kept in memory and rocksdict)."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    explicit_lac_data: bytes = b""  # the client-signed LAC buffer, returned as is by readLac


def encode_state(state: LedgerData) -> bytes:
    head = _STATE_HEAD.pack(_STATE_VERSION, state.fenced, state.explicit_lac, len(state.master_key))
    return head + state.master_key + state.explicit_lac_data


def decode_state(blob: bytes) -> LedgerData:
    if len(blob) < _STATE_HEAD.size:
        raise BookieIOError(f"corrupt ledger state ({len(blob)} bytes)")
    version, fenced, lac, key_bytes = _STATE_HEAD.unpack_from(blob)
    if version != _STATE_VERSION or len(blob) < _STATE_HEAD.size + key_bytes:
        raise BookieIOError(f"corrupt ledger state (version {version}, {len(blob)} bytes)")
    key_end = _STATE_HEAD.size + key_bytes
    return LedgerData(blob[_STATE_HEAD.size : key_end], bool(fenced), lac, blob[key_end:])


class CheckpointSnapshot:
    """A write cache swapped out by begin_checkpoint; ``deleted`` is its deletion watcher."""

    __slots__ = ("entries", "cache_bytes", "deleted", "flushed")

    def __init__(self, entries: dict[int, dict[int, bytes]], cache_bytes: int, deleted: set[int]) -> None:
        self.entries = entries
        self.cache_bytes = cache_bytes
        self.deleted = deleted
        self.flushed = False


def _index_key(ledger_id: int, entry_id: int) -> bytes:
    return _INDEX_KEY.pack(_INDEX, ledger_id, entry_id)


class LedgerStorage:
    """Entries and ledger states of one bookie directory; see the module docstring."""

    def __init__(
        self, directory: Path, *, entry_log_bytes_max: int = 256 * 2**20, write_cache_bytes_max: int = 64 * 2**20,
        entry_log_flush_bytes: int = DEFAULT_FLUSH_BYTES,
    ) -> None:
        self._directory = Path(directory)
        self._entry_log_bytes_max = entry_log_bytes_max
        self._entry_log_flush_bytes = entry_log_flush_bytes
        self.write_cache_bytes_max = write_cache_bytes_max
        self._db: Rdict | None = None
        self._log: EntryLogger | None = None
        self._active: dict[int, dict[int, bytes]] = {}
        self._active_bytes = 0
        self._snapshot: CheckpointSnapshot | None = None
        self._last_entry: dict[int, int] = {}
        # stored bytes per ledger (the stored-bytes quota): the entries indexed before open, counted
        # once by count_stored_bytes(), plus every entry added since open
        self._last_at_open: dict[int, int] = {}
        self._stored_base: dict[int, int] | None = None
        self._stored_added: dict[int, int] = {}
        self._states: dict[int, LedgerData] = {}
        self._watchers: list[set[int]] = []
        self._writer_lock = threading.Lock()
        self._compaction_lock = threading.Lock()
        self._index_lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        invariant(self._db is None, "LedgerStorage.open called twice")
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._db = Rdict(str(self.index_dir), Options(raw_mode=True))
        self._states = {
            _LEDGER_KEY.unpack(key)[1]: decode_state(value) for key, value in self._prefix_items(_STATE)
        }
        ledger_maps = {_LEDGER_KEY.unpack(key)[1]: value for key, value in self._prefix_items(_LEDGER_MAP)}
        stored_next = self._db.get(_NEXT_LOG_ID_KEY)
        next_log_id = struct.unpack("<Q", stored_next)[0] if stored_next is not None else 1
        self._last_entry = self._load_last_entries()
        self._last_at_open = dict(self._last_entry)
        self._log = EntryLogger(self.entry_log_dir, log_bytes_max=self._entry_log_bytes_max,
                                flush_bytes=self._entry_log_flush_bytes)
        self._log.open(ledger_maps, next_log_id)
        for log_id in ledger_maps.keys() - set(self._log.log_ids()):
            self._db.delete(_LEDGER_KEY.pack(_LEDGER_MAP, log_id))  # a crash between unlink and this delete

    def _index(self) -> Rdict:
        return known(self._db, "ledger storage is open")

    def _entry_logger(self) -> EntryLogger:
        return known(self._log, "ledger storage is open")

    def _raw_items(self, from_key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The index's (key, value) pairs from `from_key` on (raw mode: both are bytes)."""
        return cast("Iterator[tuple[bytes, bytes]]", self._index().items(from_key=from_key))

    def _prefix_items(self, prefix: int) -> list[tuple[bytes, bytes]]:
        items = []
        for key, value in self._raw_items(bytes([prefix])):
            if key[0] != prefix:
                break
            items.append((key, value))
        return items

    def _load_last_entries(self) -> dict[int, int]:
        """Highest indexed entry id per ledger: one seek pair per ledger, not a full scan."""
        last_entry: dict[int, int] = {}
        iterator = self._index().iter()
        iterator.seek(bytes([_INDEX]))
        while iterator.valid() and iterator.key()[0] == _INDEX:
            ledger_id = _INDEX_KEY.unpack(iterator.key())[1]
            iterator.seek_for_prev(_index_key(ledger_id, 2**64 - 1))
            last_entry[ledger_id] = _INDEX_KEY.unpack(iterator.key())[2]
            if ledger_id == 2**64 - 1:
                break
            iterator.seek(_index_key(ledger_id + 1, 0))
        return last_entry

    def close(self) -> None:
        """Flush the write cache to the entry logs, then close; call with no checkpoint running."""
        if self._db is None:
            return
        invariant(self._snapshot is None, "LedgerStorage.close during a checkpoint")
        with self._compaction_lock:
            if self._active:
                snapshot = self.begin_checkpoint()
                self.flush_checkpoint(snapshot)
                self.end_checkpoint(snapshot)
            with self._writer_lock, self._index_lock:
                self._entry_logger().close()
                self._db.flush_wal(True)
                self._db.close()
                self._db = self._log = None

    # --- hot path (loop thread) -----------------------------------------------------------

    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Into the write cache; ``data`` must be immutable bytes."""
        entries = self._active.get(ledger_id)
        if entries is None:
            entries = self._active[ledger_id] = {}
        entries[entry_id] = data
        self._active_bytes += len(data)
        self._stored_added[ledger_id] = self._stored_added.get(ledger_id, 0) + len(data)
        if entry_id > self._last_entry.get(ledger_id, -1):
            self._last_entry[ledger_id] = entry_id

    def add_entries(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        """Several entries of one ledger into the write cache (an ADD_BATCH group)."""
        cache = self._active.get(ledger_id)
        if cache is None:
            cache = self._active[ledger_id] = {}
        added_bytes, highest = 0, -1
        for entry_id, data in entries:
            cache[entry_id] = data
            added_bytes += len(data)
            if entry_id > highest:
                highest = entry_id
        self._active_bytes += added_bytes
        self._stored_added[ledger_id] = self._stored_added.get(ledger_id, 0) + added_bytes
        if highest > self._last_entry.get(ledger_id, -1):
            self._last_entry[ledger_id] = highest

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self._active.get(ledger_id)
        if entries is not None:
            data = entries.get(entry_id)
            if data is not None:
                return data
        snapshot = self._snapshot
        if snapshot is not None:
            entries = snapshot.entries.get(ledger_id)
            if entries is not None and ledger_id not in snapshot.deleted:
                data = entries.get(entry_id)
                if data is not None:
                    return data
        if not 0 <= entry_id <= self._last_entry.get(ledger_id, -1):
            return None
        key = _index_key(ledger_id, entry_id)
        with self._index_lock:
            value = self._index().get(key)
            if value is None:
                return None
            location, record_bytes = _INDEX_VALUE.unpack(value)
            return self._entry_logger().read(location, record_bytes, ledger_id, entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        return self._last_entry.get(ledger_id, -1)

    @property
    def write_cache_bytes(self) -> int:
        """Bytes in the active write cache (not counting a snapshot being flushed)."""
        return self._active_bytes

    @property
    def unflushed_bytes(self) -> int:
        """Entry bytes not yet in entry logs: the active cache plus a snapshot being flushed."""
        snapshot = self._snapshot
        return self._active_bytes + (snapshot.cache_bytes if snapshot is not None else 0)

    # --- ledger states (loop thread) ------------------------------------------------------

    def get_state(self, ledger_id: int) -> LedgerData | None:
        return self._states.get(ledger_id)

    def put_state(self, ledger_id: int, state: LedgerData) -> None:
        self._states[ledger_id] = state
        self._index().put(_LEDGER_KEY.pack(_STATE, ledger_id), encode_state(state))

    def ledger_ids(self) -> list[int]:
        return sorted(self._states.keys() | self._last_entry.keys())

    def delete_ledger(self, ledger_id: int) -> None:
        self._states.pop(ledger_id, None)
        self._last_entry.pop(ledger_id, None)
        self._last_at_open.pop(ledger_id, None)
        self._stored_added.pop(ledger_id, None)
        if self._stored_base is not None:
            self._stored_base.pop(ledger_id, None)
        dropped = self._active.pop(ledger_id, None)
        if dropped:
            self._active_bytes -= sum(len(data) for data in dropped.values())
        batch = WriteBatch(raw_mode=True)
        batch.delete(_LEDGER_KEY.pack(_STATE, ledger_id))
        # Index keys are exactly 17 bytes, so this 18-byte end sorts after all of this ledger's.
        batch.delete_range(_index_key(ledger_id, 0), _index_key(ledger_id, 2**64 - 1) + b"\0")
        with self._index_lock:
            for watcher in self._watchers:
                watcher.add(ledger_id)
            self._index().write(batch)

    def count_stored_bytes(self) -> None:
        """Count the bytes of the entries indexed before open (a scan of their index records; run
        it on a thread). Entries added since open are counted as they come, and have higher ids
        than any counted here; an entry re-added over an old one (recovery) counts twice."""
        base: dict[int, int] = {}
        for ledger_id, last_entry_id in list(self._last_at_open.items()):
            total = 0
            for key, value in self._raw_items(_index_key(ledger_id, 0)):
                if key[0] != _INDEX or len(key) != _INDEX_KEY.size:
                    break
                _, key_ledger, entry_id = _INDEX_KEY.unpack(key)
                if key_ledger != ledger_id or entry_id > last_entry_id:
                    break
                total += _INDEX_VALUE.unpack(value)[1] - RECORD_HEADER_BYTES  # the entry itself
            base[ledger_id] = total
        self._stored_base = {ledger_id: size for ledger_id, size in base.items()
                             if ledger_id in self._last_at_open}  # deleted while counting: gone

    def stored_bytes(self) -> dict[int, int] | None:
        """Bytes stored per ledger; None until count_stored_bytes() has run."""
        base = self._stored_base
        if base is None:
            return None
        stored = dict(base)
        for ledger_id, size in list(self._stored_added.items()):
            stored[ledger_id] = stored.get(ledger_id, 0) + size
        return stored

    def _ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self._states or ledger_id in self._last_entry

    # --- checkpoint -----------------------------------------------------------------------

    def begin_checkpoint(self) -> CheckpointSnapshot:
        """Loop thread: swap the write cache out; reads still see it until end_checkpoint."""
        invariant(self._snapshot is None, "a checkpoint is already in progress")
        snapshot = CheckpointSnapshot(self._active, self._active_bytes, self._watch())
        self._active, self._active_bytes = {}, 0
        self._snapshot = snapshot
        return snapshot

    def flush_checkpoint(self, snapshot: CheckpointSnapshot) -> None:
        """Worker thread: entries to the entry log (fsynced), then the index (WAL synced)."""
        invariant(snapshot is self._snapshot, "flush_checkpoint of a snapshot not in progress")
        pack_key, pack_value = _INDEX_KEY.pack, _INDEX_VALUE.pack
        with self._writer_lock:
            puts = _IndexPuts()
            put_ledger, put_key, put_value = puts.ledger_ids.append, puts.keys.append, puts.values.append
            for ledger_id in sorted(snapshot.entries):
                if ledger_id in snapshot.deleted:
                    continue
                entries = snapshot.entries[ledger_id]
                all_ids = sorted(entries)
                for start in range(0, len(all_ids), CHECKPOINT_CHUNK_ENTRIES):
                    entry_ids = all_ids[start: start + CHECKPOINT_CHUNK_ENTRIES]
                    locations = self._entry_logger().append_entries(ledger_id, entry_ids, entries)
                    for entry_id, location in zip(entry_ids, locations, strict=True):
                        record_bytes = RECORD_HEADER_BYTES + len(entries[entry_id])
                        put_ledger(ledger_id)
                        put_key(pack_key(_INDEX, ledger_id, entry_id))
                        put_value(pack_value(location, record_bytes))
                    _let_the_loop_run()
            self._entry_logger().flush()
            self._commit_index(puts, snapshot.deleted)
            snapshot.flushed = True

    def end_checkpoint(self, snapshot: CheckpointSnapshot) -> None:
        """Loop thread: forget the snapshot; if its flush failed, its entries go back to the cache."""
        invariant(snapshot is self._snapshot, "end_checkpoint of a snapshot not in progress")
        self._unwatch(snapshot.deleted)
        self._snapshot = None
        if not snapshot.flushed:
            self._restore(snapshot)

    def _restore(self, snapshot: CheckpointSnapshot) -> None:
        """Put an unflushed snapshot back so reads keep finding it (rare: a failed flush)."""
        for ledger_id, entries in snapshot.entries.items():
            if ledger_id in snapshot.deleted:
                continue
            active = self._active.setdefault(ledger_id, {})
            for entry_id, data in entries.items():
                if entry_id not in active:
                    active[entry_id] = data
                    self._active_bytes += len(data)

    def _commit_index(self, puts: _IndexPuts, watcher: set[int]) -> None:
        """Writer lock held, entry log flushed: log metadata, then index puts, then sync the WAL."""
        metadata = WriteBatch(raw_mode=True)
        for log_id, blob in self._entry_logger().take_dirty_metadata():
            metadata.put(_LEDGER_KEY.pack(_LEDGER_MAP, log_id), blob)
        metadata.put(_NEXT_LOG_ID_KEY, struct.pack("<Q", self._entry_logger().next_log_id))
        self._index().write(metadata)
        for start in range(0, len(puts.keys), _CHUNK_PUTS):
            end = start + _CHUNK_PUTS
            _let_the_loop_run()
            batch = puts.batch(start, end, ())
            with self._index_lock:
                # A ledger deleted since its entries were read must not come back.
                deleted = set(puts.ledger_ids[start:end]) & watcher if watcher else None
                if deleted:
                    batch = puts.batch(start, end, deleted)
                self._index().write(batch)
        self._index().flush_wal(True)

    def _watch(self) -> set[int]:
        watcher: set[int] = set()
        with self._index_lock:
            self._watchers.append(watcher)
        return watcher

    def _unwatch(self, watcher: set[int]) -> None:
        with self._index_lock:  # by identity: two empty watchers are equal sets
            self._watchers = [other for other in self._watchers if other is not watcher]

    # --- journal mark -----------------------------------------------------------------------

    def load_mark(self) -> JournalMark | None:
        try:
            blob = (self._directory / "lastmark").read_bytes()
        except FileNotFoundError:
            return None
        if len(blob) != _MARK.size + 4 or struct.unpack("<I", blob[-4:])[0] != crc32c(blob[:-4]):
            raise BookieIOError("lastmark file is corrupt")
        magic, file_id, offset = _MARK.unpack(blob[:-4])
        if magic != _MARK_MAGIC:
            raise BookieIOError("lastmark file has a bad magic")
        return JournalMark(file_id, offset)

    def save_mark(self, mark: JournalMark) -> None:
        """Durably replace the mark: write temp, fsync, rename, fsync directory."""
        body = _MARK.pack(_MARK_MAGIC, mark.file_id, mark.offset)
        temporary = self._directory / "lastmark.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, body + struct.pack("<I", crc32c(body)))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self._directory / "lastmark")
        fsync_directory(self._directory)

    # --- compaction (worker thread) -------------------------------------------------------

    def compact(self, live_fraction_max: float = 0.5) -> int:
        """Reclaim logs below the current one whose live fraction < threshold; returns bytes."""
        with self._compaction_lock:
            watcher = self._watch()
            try:
                with self._writer_lock:
                    logger = self._entry_logger()
                    current = logger.current_log_id
                    candidates = [log_id for log_id in logger.log_ids() if current is None or log_id < current]
                return sum(self._compact_log(log_id, live_fraction_max, watcher) for log_id in candidates)
            finally:
                self._unwatch(watcher)

    def _compact_log(self, log_id: int, live_fraction_max: float, watcher: set[int]) -> int:
        file_bytes = self._entry_logger().file_bytes(log_id)
        ledger_bytes = self._entry_logger().ledger_bytes(log_id)
        live_bytes = sum(count for ledger_id, count in ledger_bytes.items() if self._ledger_exists(ledger_id))
        if live_bytes > 0 and live_bytes >= live_fraction_max * file_bytes:
            return 0
        copied = self._relocate(log_id, watcher) if live_bytes > 0 else 0
        # Index deletes (delete_ledger) and the moves above must be durable before the unlink.
        self._index().flush_wal(True)
        with self._writer_lock, self._index_lock:
            self._entry_logger().delete_log(log_id)
            self._index().delete(_LEDGER_KEY.pack(_LEDGER_MAP, log_id))
        return max(file_bytes - copied, 0)

    def _relocate(self, log_id: int, watcher: set[int]) -> int:
        """Copy the live entries of ``log_id`` into the current log; returns bytes copied."""
        copied, pending, pending_bytes = 0, [], 0
        for scanned in self._entry_logger().scan(log_id):
            if not self._ledger_exists(scanned.ledger_id):
                continue
            key = _index_key(scanned.ledger_id, scanned.entry_id)
            value = _INDEX_VALUE.pack(scanned.location, scanned.record_bytes)
            if self._index().get(key) != value:
                continue  # superseded by a newer copy, or deleted
            pending.append((scanned, key, value))
            pending_bytes += scanned.record_bytes
            if pending_bytes >= _RELOCATE_BATCH_BYTES:
                copied += self._move(pending, watcher)
                pending, pending_bytes = [], 0
        if pending:
            copied += self._move(pending, watcher)
        return copied

    def _move(self, pending: list[tuple[ScannedEntry, bytes, bytes]], watcher: set[int]) -> int:
        with self._writer_lock:
            puts, copied = _IndexPuts(), 0
            for scanned, key, value in pending:
                # Under the writer lock only delete_ledger can still change the key (watcher).
                if self._index().get(key) != value:
                    continue
                ledger_id, entry_id = scanned.ledger_id, scanned.entry_id
                [location] = self._entry_logger().append_entries(ledger_id, [entry_id], {entry_id: scanned.data})
                puts.ledger_ids.append(ledger_id)
                puts.keys.append(key)
                puts.values.append(_INDEX_VALUE.pack(location, scanned.record_bytes))
                copied += scanned.record_bytes
            self._entry_logger().flush()
            self._commit_index(puts, watcher)
        return copied

    # --- metrics ----------------------------------------------------------------------------

    @property
    def entry_log_dir(self) -> Path:
        return self._directory / "entrylogs"

    @property
    def index_dir(self) -> Path:
        return self._directory / "index"

    def disk_bytes(self) -> int:
        """Bytes of entry logs plus the index directory."""
        total = self._log.total_file_bytes() if self._log is not None else 0
        for root, _, names in os.walk(self.index_dir):
            for name in names:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    continue  # rocksdb compaction removed it meanwhile
        return total


class _IndexPuts:
    """The index puts of a checkpoint or a compaction, as three parallel lists. Not a tuple per
    entry: those are objects the cycle collector tracks, and 200,000 of them made it collect four
    times per checkpoint, 4-25 ms each, holding the GIL and so the bookie's loop (adds, fsync
    callbacks, long-poll answers; the tail p99 during checkpoints). Bytes and ints are not tracked."""

    __slots__ = ("keys", "ledger_ids", "values")

    def __init__(self) -> None:
        self.ledger_ids: list[int] = []
        self.keys: list[bytes] = []
        self.values: list[bytes] = []

    def batch(self, start: int, end: int, skip: set[int] | tuple[()]) -> WriteBatch:
        """Puts start..end (exclusive), but none of a ledger in `skip`."""
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        keys, values = self.keys[start:end], self.values[start:end]
        if skip:
            for ledger_id, key, value in zip(self.ledger_ids[start:end], keys, values, strict=True):
                if ledger_id not in skip:
                    put(key, value)
        else:
            for key, value in zip(keys, values, strict=True):
                put(key, value)
        return batch


def _let_the_loop_run() -> None:
    """Worker thread: release the GIL long enough for the event loop's thread to take it."""
    time.sleep(CHECKPOINT_PAUSE_S)


def allocated_bytes(directory: Path) -> int:
    """Bytes the files under `directory` take on disk (allocated blocks, as `du` counts them: a
    preallocated journal file counts in full); 0 when it does not exist."""
    total = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # rolled, compacted or collected meanwhile
    return total
