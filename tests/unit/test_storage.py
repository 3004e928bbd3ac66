"""Ledger storage keeps every entry readable byte-identical through checkpoint, reopen, delete and compaction, and reports damage."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookkeeper.bookie.entrylog import LOG_HEADER_BYTES, RECORD_HEADER_BYTES
from bookkeeper.bookie.journal import JournalMark
from bookkeeper.bookie.storage import LedgerData, LedgerStorage
from bookkeeper.errors import BookieIOError, ConfigError


def payload(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    seed = f"{ledger_id}:{entry_id}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def checkpoint(storage: LedgerStorage) -> None:
    snapshot = storage.begin_checkpoint()
    storage.flush_checkpoint(snapshot)
    storage.end_checkpoint(snapshot)


def entry_log_bytes(directory: Path) -> int:
    return sum(os.stat(path).st_size for path in (directory / "entrylogs").glob("*.log"))


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[LedgerStorage]:
    store = LedgerStorage(tmp_path, entry_log_bytes_max=64 * 1024)
    store.open()
    yield store
    store.close()


def reopen(storage: LedgerStorage, directory: Path) -> LedgerStorage:
    storage.close()
    store = LedgerStorage(directory, entry_log_bytes_max=64 * 1024)
    store.open()
    return store


def test_add_and_get_from_the_write_cache(storage: LedgerStorage) -> None:
    assert storage.last_entry_id(1) == -1 and storage.get_entry(1, 0) is None
    for entry_id in range(10):
        storage.add_entry(1, entry_id, payload(1, entry_id))
    assert [storage.get_entry(1, entry_id) for entry_id in range(10)] == [payload(1, e) for e in range(10)]
    assert storage.get_entry(1, 10) is None and storage.get_entry(2, 0) is None
    assert storage.last_entry_id(1) == 9 and storage.ledger_ids() == [1]
    assert storage.write_cache_bytes == 1000


def test_get_after_checkpoint_and_after_reopen(storage: LedgerStorage, tmp_path: Path) -> None:
    storage.put_state(7, LedgerData(b"secret", fenced=True, explicit_lac=41, explicit_lac_data=b"lac"))
    for entry_id in range(2000):
        storage.add_entry(7, entry_id, payload(7, entry_id))
    snapshot = storage.begin_checkpoint()
    assert storage.write_cache_bytes == 0
    assert storage.get_entry(7, 5) == payload(7, 5)  # served from the snapshot while it flushes
    storage.flush_checkpoint(snapshot)
    storage.end_checkpoint(snapshot)
    assert storage.get_entry(7, 1999) == payload(7, 1999)  # now from the entry log
    assert len(list((tmp_path / "entrylogs").glob("*.log"))) > 1  # rolled at 64 KiB
    storage.add_entry(7, 2000, payload(7, 2000))  # cache only: close flushes it
    storage = reopen(storage, tmp_path)
    assert storage.last_entry_id(7) == 2000
    assert all(storage.get_entry(7, e) == payload(7, e) for e in range(2001))
    assert storage.get_state(7) == LedgerData(b"secret", True, 41, b"lac")
    assert storage.ledger_ids() == [7]
    storage.close()


def test_mark_is_saved_durably_and_loaded(storage: LedgerStorage, tmp_path: Path) -> None:
    assert storage.load_mark() is None
    storage.save_mark(JournalMark(3, 4096))
    storage.save_mark(JournalMark(4, 512))
    assert storage.load_mark() == JournalMark(4, 512)
    assert not (tmp_path / "lastmark.tmp").exists()
    (tmp_path / "lastmark").write_bytes(b"DLMK" + bytes(20))
    with pytest.raises(BookieIOError):
        storage.load_mark()


def test_delete_then_compaction_reclaims_entry_log_bytes(storage: LedgerStorage, tmp_path: Path) -> None:
    for entry_id in range(3000):  # interleave: every log holds both ledgers
        storage.add_entry(1, entry_id, payload(1, entry_id))
        storage.add_entry(2, entry_id, payload(2, entry_id, 300))
        if entry_id % 500 == 499:
            checkpoint(storage)
    before = entry_log_bytes(tmp_path)
    disk_before = storage.disk_bytes()
    assert storage.compact(0.5) == 0  # everything live: nothing to do
    storage.delete_ledger(2)
    assert storage.get_entry(2, 0) is None and storage.last_entry_id(2) == -1
    reclaimed = storage.compact(0.5)
    after = entry_log_bytes(tmp_path)
    assert reclaimed > 0 and after < before * 0.4
    assert storage.disk_bytes() < disk_before
    assert all(storage.get_entry(1, e) == payload(1, e) for e in range(3000))
    storage = reopen(storage, tmp_path)
    assert all(storage.get_entry(1, e) == payload(1, e) for e in range(3000))
    assert storage.get_entry(2, 5) is None and storage.ledger_ids() == [1]
    storage.delete_ledger(1)
    storage.compact(0.5)
    assert entry_log_bytes(tmp_path) == 0  # logs with no live bytes are simply deleted
    storage.close()


def test_a_flipped_byte_in_an_entry_log_raises_instead_of_missing(storage: LedgerStorage, tmp_path: Path) -> None:
    storage.add_entry(3, 0, payload(3, 0, 1000))
    storage.add_entry(3, 1, payload(3, 1, 1000))
    checkpoint(storage)
    [log_path] = (tmp_path / "entrylogs").glob("*.log")
    with open(log_path, "r+b") as file:
        position = LOG_HEADER_BYTES + RECORD_HEADER_BYTES + 500  # inside entry 0's data
        file.seek(position)
        byte = file.read(1)
        file.seek(position)
        file.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(BookieIOError):
        storage.get_entry(3, 0)
    assert storage.get_entry(3, 1) == payload(3, 1, 1000)


def test_a_ledger_deleted_during_a_checkpoint_stays_deleted(storage: LedgerStorage, tmp_path: Path) -> None:
    for entry_id in range(100):
        storage.add_entry(1, entry_id, payload(1, entry_id))
        storage.add_entry(2, entry_id, payload(2, entry_id))
    snapshot = storage.begin_checkpoint()
    storage.delete_ledger(2)
    assert storage.get_entry(2, 3) is None
    storage.flush_checkpoint(snapshot)
    storage.end_checkpoint(snapshot)
    assert storage.get_entry(2, 3) is None
    storage = reopen(storage, tmp_path)
    assert storage.ledger_ids() == [1] and storage.get_entry(2, 3) is None
    assert storage.get_entry(1, 99) == payload(1, 99)
    storage.close()


@pytest.mark.parametrize("during", ["checkpoint", "compaction", "compaction+checkpoint"])
def test_a_ledger_deleted_just_before_an_index_commit_stays_deleted(
    storage: LedgerStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, during: str
) -> None:
    for entry_id in range(2000):
        storage.add_entry(1, entry_id, payload(1, entry_id))
        storage.add_entry(2, entry_id, payload(2, entry_id))
        storage.add_entry(3, entry_id, payload(3, entry_id, 600))
    if during != "checkpoint":
        checkpoint(storage)
        storage.delete_ledger(3)
    real_commit = storage._commit_index

    def commit_after_a_delete(puts: list, watcher: set[int]) -> None:
        # The writer already appended ledger 2's entries and built their index puts.
        if during == "compaction+checkpoint":
            # A checkpoint that starts and ends meanwhile must not unregister compaction's watcher.
            storage.end_checkpoint(storage.begin_checkpoint())
        storage.delete_ledger(2)
        real_commit(puts, watcher)

    monkeypatch.setattr(storage, "_commit_index", commit_after_a_delete)
    if during != "checkpoint":
        assert storage.compact(0.9) > 0
    else:
        checkpoint(storage)
    monkeypatch.undo()
    assert storage.get_entry(2, 10) is None
    assert all(storage.get_entry(1, e) == payload(1, e) for e in range(2000))
    storage = reopen(storage, tmp_path)
    assert storage.get_entry(2, 10) is None and storage.last_entry_id(2) == -1
    assert all(storage.get_entry(1, e) == payload(1, e) for e in range(2000))
    storage.close()


def test_failed_flush_puts_the_snapshot_back(storage: LedgerStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.add_entry(1, 0, b"kept")
    snapshot = storage.begin_checkpoint()

    def broken(*_: object) -> None:
        raise BookieIOError("injected")

    monkeypatch.setattr(storage._log, "flush", broken)
    with pytest.raises(BookieIOError):
        storage.flush_checkpoint(snapshot)
    storage.end_checkpoint(snapshot)
    assert storage.get_entry(1, 0) == b"kept" and storage.write_cache_bytes == 4
    monkeypatch.undo()


def test_reads_stay_correct_while_compaction_runs_in_a_thread(storage: LedgerStorage) -> None:
    live = range(1, 4)
    for round_number in range(4):
        for ledger_id in (*live, 100 + round_number):
            for entry_id in range(round_number * 400, round_number * 400 + 400):
                storage.add_entry(ledger_id, entry_id, payload(ledger_id, entry_id, 200))
        checkpoint(storage)
    stop, errors = threading.Event(), []

    def compact_repeatedly() -> None:
        try:
            for victim in range(100, 104):
                storage.delete_ledger(victim)  # (test only: deletes belong to the loop thread)
                storage.compact(0.99)
        except BaseException as error:  # report any failure of the worker to the test thread
            errors.append(error)
        finally:
            stop.set()

    worker = threading.Thread(target=compact_repeatedly)
    worker.start()
    reads = 0
    while not stop.is_set() or reads == 0:
        for ledger_id in live:
            for entry_id in range(0, 1600, 7):
                assert storage.get_entry(ledger_id, entry_id) == payload(ledger_id, entry_id, 200)
                reads += 1
    worker.join()
    assert errors == []
    assert all(storage.get_entry(l, e) == payload(l, e, 200) for l in live for e in range(1600))


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 4), st.integers(0, 6), st.integers(1, 300)),
        st.tuples(st.just("checkpoint")),
        st.tuples(st.just("begin")),  # a checkpoint left in progress while other steps run
        st.tuples(st.just("delete"), st.integers(1, 4)),
        st.tuples(st.just("compact"), st.sampled_from([0.3, 0.6, 1.0])),
        st.tuples(st.just("reopen")),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_random_operations_agree_with_a_dict_model(steps: list[tuple]) -> None:
    directory = Path(tempfile.mkdtemp(prefix="storage-model-"))
    model: dict[int, dict[int, bytes]] = {}
    store = LedgerStorage(directory, entry_log_bytes_max=2048)
    store.open()
    snapshot = None
    try:
        for step in steps:
            if snapshot is not None and step[0] in ("checkpoint", "begin", "reopen"):
                store.flush_checkpoint(snapshot)
                store.end_checkpoint(snapshot)
                snapshot = None
            if step[0] == "add":
                _, ledger_id, count, size = step
                entries = model.setdefault(ledger_id, {})
                for _ in range(count):
                    entry_id = len(entries)
                    entries[entry_id] = payload(ledger_id, entry_id, size)
                    store.add_entry(ledger_id, entry_id, entries[entry_id])
            elif step[0] == "checkpoint":
                checkpoint(store)
            elif step[0] == "begin":
                snapshot = store.begin_checkpoint()
            elif step[0] == "delete":
                model.pop(step[1], None)
                store.delete_ledger(step[1])
            elif step[0] == "compact":
                store.compact(step[1])
            else:
                store.close()
                store = LedgerStorage(directory, entry_log_bytes_max=2048)
                store.open()
            assert store.ledger_ids() == sorted(ledger for ledger, entries in model.items() if entries)
            for ledger_id in range(1, 5):
                entries = model.get(ledger_id, {})
                assert store.last_entry_id(ledger_id) == len(entries) - 1
                assert [store.get_entry(ledger_id, e) for e in range(len(entries) + 1)] == [*entries.values(), None]
        if snapshot is not None:
            store.flush_checkpoint(snapshot)
            store.end_checkpoint(snapshot)
    finally:
        store.close()
        shutil.rmtree(directory)


@pytest.mark.parametrize("flush_bytes, least, most", [(2 * 2**20, 4, 6), (0, 1, 1)])
def test_a_checkpoint_syncs_its_entry_log_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    flush_bytes: int, least: int, most: int) -> None:
    """8 MiB of entries with a 2 MiB flush size: the checkpoint syncs as it writes (about every
    2 MiB, as its 1 MiB write buffers go out), not once at the end."""
    store = LedgerStorage(tmp_path, entry_log_flush_bytes=flush_bytes)
    store.open()
    synced: list[int] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr("bookkeeper.bookie.entrylog.os.fdatasync",
                        lambda fd: (synced.append(fd), real_fdatasync(fd))[1])
    for entry_id in range(8192):
        store.add_entry(3, entry_id, payload(3, entry_id, 1024))
    checkpoint(store)
    assert least <= len(synced) <= most
    assert all(store.get_entry(3, e) == payload(3, e, 1024) for e in (0, 4096, 8191))
    store.close()


def test_a_negative_entry_log_flush_size_is_refused(tmp_path: Path) -> None:
    store = LedgerStorage(tmp_path, entry_log_flush_bytes=-1)
    with pytest.raises(ConfigError, match="entry_log_flush_bytes"):
        store.open()


def test_stored_bytes_per_ledger_survive_a_restart_and_go_with_a_deleted_ledger(storage: LedgerStorage,
                                                                                 tmp_path: Path) -> None:
    assert storage.stored_bytes() is None  # not counted yet
    storage.count_stored_bytes()
    for entry_id in range(3):
        storage.add_entry(7, entry_id, payload(7, entry_id, 100))
    storage.add_entries(8, [(0, payload(8, 0, 50)), (1, payload(8, 1, 50))])
    assert storage.stored_bytes() == {7: 300, 8: 100}
    checkpoint(storage)
    storage = reopen(storage, tmp_path)
    storage.add_entry(7, 3, payload(7, 3, 40))  # added after open, before the count
    storage.count_stored_bytes()
    assert storage.stored_bytes() == {7: 340, 8: 100}  # indexed entries counted once, new ones added
    storage.delete_ledger(8)
    assert storage.stored_bytes() == {7: 340}


def test_a_checkpoint_allocates_no_tracked_object_per_entry(tmp_path: Path) -> None:
    """The cycle collector runs after every 50,000 tracked objects (bookkeeper.runtime): a tuple
    per flushed entry made it run several times per checkpoint, each pause holding the GIL and so
    the bookie's loop. 60,000 entries flush without a single collection."""
    import gc

    store = LedgerStorage(tmp_path, entry_log_bytes_max=64 * 2**20)
    store.open()
    try:
        for entry_id in range(60_000):
            store.add_entry(3, entry_id, payload(3, entry_id, 20))
        snapshot = store.begin_checkpoint()
        collections: list[int] = []

        def counted(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                collections.append(info["generation"])

        thresholds = gc.get_threshold()
        gc.collect()
        gc.callbacks.append(counted)  # the collector holds this very list: not a monkeypatch
        gc.set_threshold(50_000, 50, 100)
        try:
            store.flush_checkpoint(snapshot)
        finally:
            gc.set_threshold(*thresholds)
            gc.callbacks.remove(counted)
        store.end_checkpoint(snapshot)
        assert collections == []
        assert store.get_entry(3, 59_999) == payload(3, 59_999, 20)
    finally:
        store.close()
