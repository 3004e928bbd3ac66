"""Reading stream snapshots: segment lists, LACs and entry headers, through ONE bounded cache of
open read handles and decoded entry headers.

The rules (where readable data starts and ends, truncation, data loss, in-progress counts) are
`dlog.core.snapshot`'s; this is the thin driver every caller gathers their inputs through: the
stream reader (its handles), Spark's catalog (one view per stream per trigger, entry headers for
admission and timestamp searches) and its workers (handles reused from one partition to the
next), `dlog stream info` and the status page (in-progress record counts).

Costs. `view` is one segment-list read and, when a segment is in progress, one LAC read (each
bookie of its last ensemble asked once; opening a ledger reads it too, so a new handle costs no
second one). A handle of a completed segment may read up to the segment's last entry, which the
committed list vouches for even before the ledger's close lands; a caller reading entries a view
saw confirmed passes that bound (`confirmed_through`) instead of asking the bookies again. Entry
headers never change once their entry is confirmed, so they are cached by (ledger, entry).

Positions. `locate` finds a record by its stream position (V4) with the pure rules of
`dlog.core.snapshot`: the segment by binary search on the list's first positions, the entry by
binary search on entry headers (each read once through this cache), so O(log entries) header
reads, none for entries already cached; `position_bounds` gives the first readable position and
the next one to be written (Kafka's log start and end offsets).

Tier copies. A completed segment offloaded to the tier (`Segment.tier`) is read from its Parquet
file when its bookie copy was deleted, when the caller prefers the tier (`prefer="tier"`), or
when its ledger turns out to be gone; a damaged file falls back to the bookie copy while it
exists. A tier handle answers like a ledger's (`read`, `last_add_confirmed`) with entries whose
payloads are already decoded (`dlog.segments.codec.DecodedEntry`). Files are kept parsed in
memory, at most `tier_bytes_max` bytes of them (least recently used first out), and the
`TIER_FILES_DECODED` most recently read keep their last decoded row groups
(`dlog.segments.tier.DECODED_GROUPS_KEPT` each, at most 64 MiB decoded apiece); the tier copy
of each segment seen in a view is remembered (bounded like the handles), so a caller that knows
only a ledger id reads the right copy.

Bounds. At most `handles_max` handles (default READ_HANDLES_MAX) and `headers_max` headers
(default ENTRY_HEADERS_MAX) are kept; the least recently used goes first. A ledger id names one
ledger for the life of a cluster (its id counter never goes back), so nothing cached can be
mistaken for another ledger's.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from bookkeeper.errors import ConfigError, NoSuchLedgerError
from dlog.core.compaction import located_kept
from dlog.core.snapshot import (
    Located,
    PositionAt,
    RecordSearch,
    SegmentView,
    StreamView,
    TailCount,
    end_position,
    located,
    located_end,
    lookup_position,
    readable_position,
    tail_count,
)
from dlog.segments import compacted as compaction_format
from dlog.segments.codec import DecodedEntry, RecordSetCodec, RecordSetHeader, default_schema
from dlog.segments.metadata import Segment, TierCopy
from dlog.segments.tier import SegmentFile, TierDamagedError, TierStore

log = logging.getLogger(__name__)
T = TypeVar("T")
K = TypeVar("K")
READ_HANDLES_MAX = 1024
ENTRY_HEADERS_MAX = 100_000
TIER_BYTES_MAX = 512 * 2**20  # tier files kept parsed in memory, in all
TIER_FILES_DECODED = 4  # files whose decoded row groups are kept (DECODED_GROUPS_KEPT each)
COMPACTED_SEGMENTS_MAX = 8  # compacted segments kept read in memory (the most recently opened)
PREFER = ("bookies", "tier")
Blocking = Callable[..., Awaitable[Any]]


class TierEntry(NamedTuple):
    """An entry read from a tier file, shaped as a ledger entry: its payload already decoded."""

    entry_id: int
    payload: DecodedEntry
    length: int


class TierHandle:
    """A tier file read as a closed ledger's handle (entries first..last of the segment). A part
    of the file found damaged only when read (a file damaged before its checksum was taken) is
    read through `fallback` (the bookie copy's handle, while it exists) instead."""

    is_closed = True

    def __init__(self, segment_file: SegmentFile, last_entry: int, blocking: Blocking,
                 fallback: Callable[[TierDamagedError], Awaitable[Any]] | None = None) -> None:
        self.file = segment_file
        self.last_add_confirmed = last_entry
        self.blocking = blocking
        self.fallback = fallback
        self._prefetch: asyncio.Future[Any] | None = None  # the next row group, decoding

    def advance_lac(self, entry_id: int) -> None:
        """Nothing to advance: the file holds the completed segment."""

    async def read_lac(self) -> int:
        return self.last_add_confirmed

    async def read(self, first: int, last: int) -> list[Any]:
        try:
            entries = await self.blocking(self.file.entries, first, last)
        except TierDamagedError as exc:
            if self.fallback is None:
                raise
            return list(await (await self.fallback(exc)).read(first, last))
        following = self.file.group_after(last)
        if following is not None and last < self.last_add_confirmed:
            # decode the next row group in a worker while the caller hands these entries out
            self._prefetch = asyncio.ensure_future(self.blocking(self.file.group, following))
            self._prefetch.add_done_callback(_quiet)
        return [TierEntry(entry_id, payload, 0) for entry_id, payload in entries]

    async def wait_for_entry(self, entry_id: int, timeout_ms: int) -> None:
        return None  # a completed segment gets no new entries


class CompactedSegment:
    """A compacted segment's kept records, read whole from its compaction ledger, found by their
    original entry (key compaction: `dlog.core.compaction`)."""

    def __init__(self, batches: list[Any]) -> None:
        import pyarrow as pa

        self.batch = pa.concat_batches(batches) if len(batches) > 1 else batches[0] if batches else None
        self.spans: dict[int, tuple[int, int]] = {}  # original entry -> (first row, rows)
        self.size_bytes = 0
        if self.batch is not None:
            self.size_bytes = self.batch.nbytes
            for row, entry_id in enumerate(self.batch.column(compaction_format.ENTRY_COLUMN).to_pylist()):
                first, count = self.spans.get(entry_id, (row, 0))
                self.spans[entry_id] = (first, count + 1)
        self.indexes: list[int] = [] if self.batch is None else \
            self.batch.column(compaction_format.INDEX_COLUMN).to_pylist()

    def kept_at_or_after(self, record_index: int) -> tuple[int, int, int] | None:
        """(entry, slot, index) of the first kept record whose index in the segment is at least
        `record_index` (None: none)."""
        row = bisect.bisect_left(self.indexes, record_index)
        if row == len(self.indexes) or self.batch is None:
            return None
        return (self.batch.column(compaction_format.ENTRY_COLUMN)[row].as_py(),
                self.batch.column(compaction_format.SLOT_COLUMN)[row].as_py(), self.indexes[row])

    def entry(self, entry_id: int) -> DecodedEntry | None:
        span = self.spans.get(entry_id)
        if span is None or self.batch is None:
            return None
        return compaction_format.compacted_entry(self.batch.slice(*span))


class CompactedHandle:
    """A compacted segment read as a closed ledger's handle over its ORIGINAL entry ids: each
    entry's kept records (an entry compaction emptied comes back with none), with their original
    slots (`dlog.segments.compacted.CompactedEntry`)."""

    is_closed = True

    def __init__(self, segment: CompactedSegment, last_entry: int, empty: DecodedEntry) -> None:
        self.segment = segment
        self.last_add_confirmed = last_entry
        self.empty = empty

    def advance_lac(self, entry_id: int) -> None:
        """Nothing to advance: the segment is completed."""

    async def read_lac(self) -> int:
        return self.last_add_confirmed

    async def read(self, first: int, last: int) -> list[Any]:
        return [TierEntry(entry_id, self.segment.entry(entry_id) or self.empty, 0)
                for entry_id in range(first, min(last, self.last_add_confirmed) + 1)]

    async def wait_for_entry(self, entry_id: int, timeout_ms: int) -> None:
        return None


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What an entry's header and position say (its records are not decoded)."""

    header: RecordSetHeader
    length: int  # the ledger's length in bytes through this entry
    size_bytes: int  # this entry's payload


class SegmentReads:
    """Read handles of segment ledgers and entry headers, cached and bounded, over one ledger
    client. `step_timeout_s` bounds each ledger operation (open, LAC read, entry read) for callers
    that must answer in time whatever the bookies do (the status page); None leaves the client's
    own timeouts."""

    def __init__(self, client: Any, *, handles_max: int = READ_HANDLES_MAX, headers_max: int = ENTRY_HEADERS_MAX,
                 step_timeout_s: float | None = None, tier: TierStore | None = None,
                 tier_bytes_max: int = TIER_BYTES_MAX) -> None:
        for what, value in (("read_handles_max", handles_max), ("entry_headers_max", headers_max),
                            ("tier_bytes_max", tier_bytes_max)):
            if value < 1:
                raise ConfigError(f"{what} must be >= 1, got {value}")
        self.client = client  # a bookkeeper.client.BookKeeper (or the stream simulator's ledgers)
        self.handles_max = handles_max
        self.headers_max = headers_max
        self.step_timeout_s = step_timeout_s
        self._handles: OrderedDict[int, Any] = OrderedDict()
        self._headers: OrderedDict[tuple[int, int], EntryInfo] = OrderedDict()
        self._codec = RecordSetCodec(default_schema())  # a header does not depend on the schema
        self.tier = tier or TierStore()
        # how tier files are written, fetched and parsed off the event loop: a worker thread (the
        # stream simulator runs them inline, so its runs replay exactly)
        self.blocking: Blocking = asyncio.to_thread
        self.tier_bytes_max = tier_bytes_max
        self._tier_copies: OrderedDict[int, TierCopy] = OrderedDict()  # ledger -> its segment's tier copy
        self._tier_files: OrderedDict[str, SegmentFile] = OrderedDict()  # uri -> the file, parsed
        self._tier_bytes = 0
        self.tier_reads = 0  # tier handles handed out (files fetched or reused)
        # (compaction ledger, segment sequence) -> the segment's kept records, read
        self._compacted: OrderedDict[tuple[int, int], CompactedSegment] = OrderedDict()
        self._compacted_of: OrderedDict[int, Segment] = OrderedDict()  # ledger -> its compacted segment
        self.tier_fallbacks = 0  # damaged tier files read from bookies instead

    # ------------------------------------------------------------------ handles

    def know(self, segment: Segment) -> None:
        """Remember where a segment's tier copy is, for callers that later name only its ledger."""
        if segment.tier is not None:
            _remember(self._tier_copies, segment.ledger_id, segment.tier, self.handles_max)
        if segment.compacted is not None:  # its ledger is gone: positions are found in its kept records
            _remember(self._compacted_of, segment.ledger_id, segment, self.handles_max)

    async def handle(self, ledger_id: int, password: bytes, confirmed_through: int | None = None, *,
                     tier: TierCopy | None = None, prefer: str = "bookies") -> Any:
        """A read handle of a ledger (shared: reads of it may run at once), allowed to read up to
        `confirmed_through`, an entry the caller knows is confirmed; of its tier file instead when
        the segment has one (`tier`, or one `know` remembered) and its bookie copy is gone, the
        caller prefers the tier, or the ledger is missing (see the module doc)."""
        if prefer not in PREFER:
            raise ConfigError(f"prefer must be one of {', '.join(PREFER)}, got {prefer!r}")
        tier = tier or self._tier_copies.get(ledger_id)
        if tier is not None and confirmed_through is not None and (not tier.on_bookies or prefer == "tier"):
            copy, through = tier, confirmed_through

            async def fallback(exc: TierDamagedError) -> Any:  # damage found when reading a row group
                self.forget_tier(copy.uri)  # never kept as a good file
                if not copy.on_bookies:
                    raise exc
                self.tier_fallbacks += 1
                log.warning("%s; reading ledger %d from the bookies instead", exc, ledger_id)
                return await self._bookie_handle(ledger_id, password, through)

            try:
                found = await self.tier_handle(tier, confirmed_through)
                found.fallback = fallback
                return found
            except TierDamagedError as exc:
                if not tier.on_bookies:
                    raise
                self.tier_fallbacks += 1
                log.warning("%s; reading ledger %d from the bookies instead", exc, ledger_id)
        try:
            return await self._bookie_handle(ledger_id, password, confirmed_through)
        except NoSuchLedgerError:
            if tier is None or confirmed_through is None:
                raise
            return await self.tier_handle(tier, confirmed_through)

    async def tier_handle(self, tier: TierCopy, last_entry: int) -> TierHandle:
        """A handle over a segment's tier file (fetched, checked and parsed once, then cached)."""
        self.tier_reads += 1
        found = self._tier_files.get(tier.uri)
        if found is None or found.copy != tier:
            data = await self._step(self.blocking(self.tier.fetch, tier.uri, tier.size_bytes))
            found = await self.blocking(SegmentFile, tier, data)
            self._drop_tier_file(tier.uri)
            self._tier_files[tier.uri] = found
            self._tier_bytes += found.size_bytes
            while self._tier_bytes > self.tier_bytes_max and len(self._tier_files) > 1:
                self._drop_tier_file(next(iter(self._tier_files)))
        else:
            self._tier_files.move_to_end(tier.uri)
        for idle in list(self._tier_files.values())[:-TIER_FILES_DECODED]:
            idle.forget_decoded()  # decoded row groups only for the files read most recently
        return TierHandle(found, last_entry, self.blocking)

    def _drop_tier_file(self, uri: str) -> None:
        dropped = self._tier_files.pop(uri, None)
        if dropped is not None:
            self._tier_bytes -= dropped.size_bytes

    async def _bookie_handle(self, ledger_id: int, password: bytes, confirmed_through: int | None) -> Any:
        handle: Any = self._handles.get(ledger_id)
        if handle is None:
            handle = await self._step(self.client.open_ledger(ledger_id, password=password, recovery=False))
            _remember(self._handles, ledger_id, handle, self.handles_max)
        else:
            self._handles.move_to_end(ledger_id)
        if confirmed_through is not None:
            handle.advance_lac(confirmed_through)
        return handle

    async def segment_handle(self, segment: Segment, password: bytes, prefer: str = "bookies",
                             compacted: bool = False) -> Any:
        """The handle of a segment's ledger with its end up to date: an in-progress segment's LAC
        read now (opening reads it), a completed segment's last entry readable (from its tier file
        when `handle` says so). A compacted segment is read from its compacted copy when the
        caller asks for the compacted view (`compacted`) or its ledger is gone."""
        if segment.compacted is not None:
            if not compacted:
                try:
                    return await self.handle(segment.ledger_id, password, segment.last_entry)
                except NoSuchLedgerError:
                    self.forget(segment.ledger_id)
            return await self.compacted_handle(segment, password)
        self.know(segment)
        cached = segment.ledger_id in self._handles
        handle = await self.handle(segment.ledger_id, password,
                                   None if segment.is_in_progress else segment.last_entry,
                                   tier=segment.tier, prefer=prefer)
        if cached and segment.is_in_progress:
            await self._step(handle.read_lac())
        return handle

    async def compacted_handle(self, segment: Segment, password: bytes) -> CompactedHandle:
        """A handle over a compacted segment's kept records (read from its compaction ledger once,
        then kept while among the COMPACTED_SEGMENTS_MAX opened last)."""
        copy = segment.compacted
        assert copy is not None
        key = (copy.ledger_id, segment.sequence)
        found = self._compacted.get(key)
        if found is None:
            batches = []
            if copy.last_entry >= copy.first_entry:
                handle = await self._bookie_handle(copy.ledger_id, password, copy.last_entry)
                first = copy.first_entry
                while first <= copy.last_entry:
                    last = min(copy.last_entry, first + 63)
                    entries = await self._step(handle.read(first, last))
                    batches += [compaction_format.decode(entry.payload) for entry in entries]
                    first = last + 1
            found = CompactedSegment(batches)
            _remember(self._compacted, key, found, COMPACTED_SEGMENTS_MAX)
        else:
            self._compacted.move_to_end(key)
        empty = compaction_format.empty_entry(found.batch)
        return CompactedHandle(found, segment.last_entry, empty)

    def forget(self, ledger_id: int) -> None:
        """Drop a ledger's handle (the ledger is gone, or its handle failed)."""
        self._handles.pop(ledger_id, None)

    def forget_tier(self, uri: str) -> None:
        """Drop a tier file from memory (removed by retention, or damaged)."""
        self._drop_tier_file(uri)

    # ------------------------------------------------------------------ snapshots

    async def view(self, store: Any, name: str, password: bytes) -> StreamView:
        """One snapshot of a stream: its segment list and its in-progress segment's LAC."""
        listing = await store.segments(name)
        for segment in listing.segments:
            self.know(segment)
        in_progress = listing.in_progress
        lac = None
        if in_progress is not None:
            lac = (await self.segment_handle(in_progress, password)).last_add_confirmed
        return StreamView.of(name, listing, lac)

    async def lac(self, segment: Segment, password: bytes) -> int:
        """An in-progress segment's LAC, read now."""
        return (await self.segment_handle(segment, password)).last_add_confirmed

    async def tail(self, segment: Segment, lac: int, password: bytes) -> TailCount:
        """An in-progress segment's records through entry `lac` (its LAC): one header read, none
        while the LAC has not moved."""
        if lac < segment.first_entry:
            return tail_count(segment.first_entry, lac, None, 0)
        info = await self.entry_info(segment.ledger_id, lac, password, lac)
        return tail_count(segment.first_entry, lac, info.header, info.size_bytes)

    # ------------------------------------------------------------------ entries

    async def entry(self, ledger_id: int, entry_id: int, password: bytes, confirmed_through: int) -> Any:
        """One entry (a bookkeeper LedgerEntry) of a ledger confirmed through `confirmed_through`."""
        handle = await self.handle(ledger_id, password, confirmed_through)
        return (await self._step(handle.read(entry_id, entry_id)))[0]

    async def entry_info(self, ledger_id: int, entry_id: int, password: bytes, confirmed_through: int) -> EntryInfo:
        """An entry's record-set header and the ledger's length through it (cached)."""
        key = (ledger_id, entry_id)
        found = self._headers.get(key)
        if found is not None:
            self._headers.move_to_end(key)
            return found
        entry = await self.entry(ledger_id, entry_id, password, confirmed_through)
        found = EntryInfo(self._codec.peek_header(entry.payload), entry.length, len(entry.payload))
        _remember(self._headers, key, found, self.headers_max)
        return found

    # ------------------------------------------------------------------ positions

    async def tail_records(self, view: StreamView, password: bytes) -> int | None:
        """The records of the view's in-progress segment through its LAC (one header read, cached;
        None when no segment is in progress)."""
        last = view.segments[-1] if view.segments else None
        if last is None or not last.is_in_progress:
            return None
        if last.end_entry <= last.first_entry:
            return 0
        lac = last.end_entry - 1
        return (await self.entry_info(last.ledger_id, lac, password, lac)).header.next_record_index

    async def locate(self, view: StreamView, position: int, password: bytes) -> Located:
        """Where the record at stream `position` is in the view: the segment by binary search on
        first positions, then the entry by binary search on entry headers."""
        lookup = lookup_position(view, position, await self.tail_records(view, password))
        if lookup.at is PositionAt.END:
            return located_end(view, lookup)
        if lookup.at is not PositionAt.RECORD:
            return Located(lookup.at, end_position=lookup.end_position)
        segment = view.segments[lookup.index]
        compacted = self._compacted_of.get(segment.ledger_id)
        if compacted is not None:
            held = await self.compacted_handle(compacted, password)
            return located_kept(view, lookup, held.segment.kept_at_or_after(lookup.record_index))
        last_entry = segment.end_entry - 1
        search = RecordSearch(segment.first_entry, segment.end_entry, lookup.record_index)
        while (probe := search.probe) is not None:
            info = await self.entry_info(segment.ledger_id, probe, password, last_entry)
            search.answer(info.header.first_record_index)
        info = await self.entry_info(segment.ledger_id, search.entry_id, password, last_entry)
        return located(view, lookup, search.entry_id, info.header)

    async def position_bounds(self, view: StreamView, password: bytes) -> tuple[int | None, int | None]:
        """(the position of the first readable record, the position the next record gets): Kafka's
        log start and log end offsets; (None, None) for a stream without positions yet. The first
        equals the second when nothing is readable."""
        if any(segment.first_position is None for segment in view.segments):
            return None, None
        end = end_position(view, await self.tail_records(view, password))
        for segment in view.segments:
            if segment.live and segment.end_entry > segment.start_entry:
                return await self._readable_position(segment, password), end
        return end, end

    async def _readable_position(self, segment: SegmentView, password: bytes) -> int | None:
        if (segment.start_entry, segment.start_slot) == (segment.first_entry, 0):
            return readable_position(segment, None)
        info = await self.entry_info(segment.ledger_id, segment.start_entry, password, segment.end_entry - 1)
        return readable_position(segment, info.header)

    async def _step(self, awaitable: Awaitable[T]) -> T:
        if self.step_timeout_s is None:
            return await awaitable
        async with asyncio.timeout(self.step_timeout_s):
            return await awaitable


def _quiet(future: asyncio.Future[Any]) -> None:
    """A prefetch's outcome is the next read's business (it decodes again and says what failed)."""
    if not future.cancelled():
        future.exception()


def _remember(cache: OrderedDict[K, Any], key: K, value: Any, size_max: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size_max:
        cache.popitem(last=False)
