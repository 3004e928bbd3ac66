"""The console producer behind `dlog write`: records from standard input as they arrive.

Theory of operation. A daemon thread reads standard input in chunks (whatever `read` returns: what
is available now, up to CHUNK_BYTES) and hands them to the event loop; at most CHUNKS_AHEAD_MAX
chunks wait there, so a fast producer on the other end of the pipe is held back rather than
buffered without limit. A `RecordParser` turns chunks into records by `--format` (it keeps a
partial last line until the rest arrives). Every record goes to ONE writer, opened on the first
record and closed at the end, so a run is one segment however long it lasts (unless the stream's
roll policy says otherwise). Whenever no further chunk is waiting, which is to say standard input
has nothing more right now, the writer is flushed: `tail -f app.log | dlog write s` makes each
line durable as it comes, and a big file piped in still goes in large entries. A writer that fails
ends the run at once, even while standard input is idle.

The account (`Produced`). Each record's future says how it ended: durable at an offset, lost with a
ledger deleted under the writer (LedgerDeletedError names it, and records acknowledged into it
earlier are moved from durable to lost), not written, or unknown (any other failure: it may have
reached an ack quorum). Acknowledgements come in order, so durable records are a prefix of the
input (what a deleted ledger took aside) and the last durable offset is where to resume. The first
Ctrl-C closes the writer, flushing it; the second aborts it (dlog_tools/interrupts.py), and what
was in flight is unknown.

Formats. `lines`: one record per line, as bytes (any encoding, no decoding); `raw`: all of
standard input is one record; `base64`: one base64-encoded value per line; `jsonl`: one JSON
object per line with `value` and optional `key` and `timestamp` (ms). In `jsonl` a string value
is stored as its UTF-8 text and any other JSON value (object, array, number, boolean) as its
compact JSON text, so `{"value": {"a": 1}}` stores `{"a":1}`; a `null` value is refused (a dlog
record always has a value: write the string "null" for the text). Empty lines are skipped in every
line format. With `--key-separator`, `lines` and `base64` split each line at the first separator
into key and value (both base64 in `base64`); a line without it has no key.

`jsonl` also takes what `dlog read --json --headers` prints, so `dlog read a --json --headers |
dlog write b --format jsonl` copies records losslessly: `value_b64` and `key_b64` (bytes that are
not UTF-8), `headers` ([name, text or null] pairs) or `headers_b64` ([name, base64 or null]), and
`offset` and `position`, which say where the record was and are ignored.

Oversized records. A record holds at most RECORD_BYTES_MAX bytes (2 MiB); a longer line is refused
before it is buffered whole. With `on_oversize="skip"` it is dropped instead (its bytes are read
and thrown away up to the next newline, never buffered) and `on_skip` is told which line, once per
line; the run goes on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bookkeeper.errors import ConfigError, DlogError
from dlog.core.errors import LedgerDeletedError, WriterAbortedError
from dlog_tools.interrupts import Interrupts
from dlog_tools.units import plural

CHUNK_BYTES = 64 * 1024
CHUNKS_AHEAD_MAX = 16  # read from stdin but not yet parsed: at most 1 MiB
RECORD_BYTES_MAX = 2 * 2**20  # below the writer's 3 MiB entry limit, with room for the key
LOCK_NOTICE_AFTER_S = 1.0  # say who holds the writer lock once opening took this long
TAKEOVER_LOCK_WAIT_S = 1.0  # --takeover: how long a free lock is waited for before fencing
FORMATS = ("lines", "raw", "base64", "jsonl")

ON_OVERSIZE = ("fail", "skip")
JSONL_FIELDS = ("key", "key_b64", "value", "value_b64", "timestamp", "headers", "headers_b64", "offset", "position")
Headers = list[tuple[str, "bytes | None"]]


class Record(NamedTuple):
    value: bytes
    key: bytes | None
    timestamp_ms: int | None
    headers: Headers | None = None


# ------------------------------------------------------------------------------ parsing (pure)


class BadInputError(ConfigError):
    """A line of standard input is not what `--format` says it should be."""

    code = 403


class RecordParser:
    """Chunks of standard input in, records out; `finish()` at end of input. Bad input raises
    BadInputError naming the line."""

    def __init__(self, input_format: str, key_separator: str | None = None, on_oversize: str = "fail",
                 on_skip: Callable[[str], None] | None = None) -> None:
        if on_oversize not in ON_OVERSIZE:
            raise ConfigError(f"bad --on-oversize {on_oversize!r}: use one of {', '.join(ON_OVERSIZE)}")
        if input_format not in FORMATS:
            raise ConfigError(f"bad format {input_format!r}: use one of {', '.join(FORMATS)}")
        if key_separator is not None and input_format not in ("lines", "base64"):
            raise ConfigError(f"--key-separator works with --format lines or base64, not {input_format} "
                              + ("(a jsonl line has its own \"key\")" if input_format == "jsonl" else
                                 "(raw input is one value)"))
        if key_separator == "":
            raise ConfigError("--key-separator is empty: give the text between key and value, e.g. ':'")
        self.input_format = input_format
        self.separator = key_separator.encode() if key_separator is not None else None
        self.skip_oversized = on_oversize == "skip"
        self.on_skip = on_skip
        self.skipped = 0  # records dropped for their size (skip)
        self.line_number = 0
        self._pending = bytearray()
        self._skipping = False  # dropping the rest of an oversized line (or of raw input)

    def feed(self, chunk: bytes) -> Iterator[Record]:
        if self._skipping:
            if self.input_format == "raw":
                return
            newline = chunk.find(b"\n")
            if newline < 0:
                return
            self._skipping, chunk = False, chunk[newline + 1:]
        self._pending += chunk
        if self.input_format == "raw":
            if not self._check_size(len(self._pending), "standard input"):
                self._pending = bytearray()
            return
        *lines, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest)
        for line in lines:
            yield from self._line(line)
        if not self._check_size(len(self._pending), f"line {self.line_number + 1}"):
            self.line_number += 1  # the oversized line is dropped as it arrives
            self._pending, self._skipping = bytearray(), True

    def finish(self) -> Iterator[Record]:
        pending, self._pending = bytes(self._pending), bytearray()
        if self.input_format == "raw":
            if pending and not self._skipping:
                yield Record(pending, None, None)
            return
        if pending:
            yield from self._line(pending)

    def _line(self, line: bytes) -> Iterator[Record]:
        self.line_number += 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line or not self._check_size(len(line), f"line {self.line_number}"):
            return
        if self.input_format == "jsonl":
            yield self._json_record(line)
            return
        key, value = None, line
        if self.separator is not None and self.separator in line:
            key, _, value = line.partition(self.separator)
        if self.input_format == "base64":
            key = None if key is None else self._unbase64(key, "key")
            value = self._unbase64(value, "value")
        yield Record(value, key, None)

    def _unbase64(self, text: bytes, what: str) -> bytes:
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadInputError(f"line {self.line_number}: the {what} is not base64 ({exc}); with --format "
                              "base64 write one base64 value per line, e.g. aGVsbG8=") from exc

    def _json_record(self, line: bytes) -> Record:
        number = self.line_number
        example = '{"key": "k", "value": {"a": 1}, "timestamp": 1700000000000}'
        try:
            item = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise BadInputError(f"line {number} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                              "JSON must be UTF-8 (use --format lines or base64 for binary values)") from exc
        except ValueError as exc:
            raise BadInputError(f"line {number} is not JSON ({exc}); with --format jsonl write objects like "
                              f"{example}") from exc
        if not isinstance(item, dict) or ("value" not in item and "value_b64" not in item):
            raise BadInputError(f'line {number} needs a "value" (or "value_b64") field, e.g. {example}')
        unknown = sorted(set(item) - set(JSONL_FIELDS))
        if unknown:
            raise BadInputError(f"line {number} has unknown field {', '.join(map(repr, unknown))}: "
                              f"known are {', '.join(map(repr, JSONL_FIELDS))}")
        for text, binary in (("value", "value_b64"), ("key", "key_b64"), ("headers", "headers_b64")):
            if item.get(text) is not None and item.get(binary) is not None:
                raise BadInputError(f'line {number} has both "{text}" and "{binary}": give one')
        if item.get("value") is None and item.get("value_b64") is None:
            raise BadInputError(f'line {number}: "value" is null, and a record always has a value '
                              '(write "null" as a string to store the text null)')
        timestamp = item.get("timestamp")
        if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool)
                                      or timestamp < 0):
            raise BadInputError(f"line {number}: timestamp must be whole milliseconds since the epoch "
                              f"(>= 0), got {timestamp!r}")
        value = (self._json_b64(item["value_b64"], "value_b64") if item.get("value_b64") is not None
                 else json_text(item["value"]))
        key: bytes | None = None
        if item.get("key_b64") is not None:
            key = self._json_b64(item["key_b64"], "key_b64")
        elif item.get("key") is not None:
            key = json_text(item["key"])
        return Record(value, key, timestamp, self._json_headers(item))

    def _json_b64(self, text: Any, what: str) -> bytes:
        if not isinstance(text, str):
            raise BadInputError(f'line {self.line_number}: "{what}" must be a base64 string, got {text!r}')
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadInputError(f'line {self.line_number}: "{what}" is not base64 ({exc})') from exc

    def _json_headers(self, item: dict[str, Any]) -> Headers | None:
        """`headers` ([name, text or null] pairs) or `headers_b64` ([name, base64 or null]), as read prints them."""
        binary = item.get("headers_b64") is not None
        pairs = item.get("headers_b64") if binary else item.get("headers")
        if pairs is None:
            return None
        what = "headers_b64" if binary else "headers"
        shape = f'"{what}" must be a list of [name, {"base64" if binary else "text"} or null] pairs'
        if not isinstance(pairs, list):
            raise BadInputError(f"line {self.line_number}: {shape}")
        headers: Headers = []
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                    and (pair[1] is None or isinstance(pair[1], str))):
                raise BadInputError(f"line {self.line_number}: {shape}, got {pair!r}")
            name, value = pair
            headers.append((name, None if value is None else
                            self._json_b64(value, what) if binary else value.encode("utf-8")))
        return headers

    def _check_size(self, size_bytes: int, what: str) -> bool:
        """True when the record fits; else BadInputError, or with skip False (and `on_skip` told)."""
        if size_bytes <= RECORD_BYTES_MAX:
            return True
        if not self.skip_oversized:
            raise BadInputError(f"{what} is over {RECORD_BYTES_MAX // 2**20} MiB; a record holds at most "
                                f"{RECORD_BYTES_MAX:,} bytes (pass --on-oversize skip to skip such lines)")
        self.skipped += 1
        self._skipping = self.input_format == "raw"
        if self.on_skip is not None:
            self.on_skip(f"skipped {what}: over {RECORD_BYTES_MAX // 2**20} MiB (a record holds at most "
                         f"{RECORD_BYTES_MAX:,} bytes)")
        return False


def json_text(value: Any) -> bytes:
    """A string as its UTF-8 text, any other JSON value as its compact JSON text."""
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# ------------------------------------------------------------------------------ standard input


async def stdin_chunks(descriptor: int) -> AsyncIterator[tuple[bytes, bool]]:
    """(chunk, more_waiting) as standard input delivers them; `more_waiting` is false when no further
    chunk has been read yet, i.e. the input has nothing more right now."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
    room = threading.BoundedSemaphore(CHUNKS_AHEAD_MAX)

    def read_all() -> None:
        while True:
            room.acquire()
            try:
                chunk = os.read(descriptor, CHUNK_BYTES)
            except OSError as exc:
                loop.call_soon_threadsafe(queue.put_nowait, exc)
                return
            loop.call_soon_threadsafe(queue.put_nowait, chunk)
            if not chunk:
                return

    # a daemon: a read blocked on a terminal must not keep the process alive after Ctrl-C
    threading.Thread(target=read_all, name="dlog-stdin", daemon=True).start()
    while True:
        item = await queue.get()
        room.release()
        if isinstance(item, BaseException):
            raise DlogError(f"cannot read standard input: {item}")
        if not item:
            return
        yield item, not queue.empty()


# ------------------------------------------------------------------------------ producing


@dataclass
class Produced:
    """What a run wrote, whatever its length: records durable (acknowledged by an ack quorum, in a
    ledger that still exists), per ledger in stream order; records lost with a ledger deleted under
    the writer; records that failed, either certainly not written or with an unknown outcome."""

    started: bool = False  # a record was handed to a writer
    unknown: int = 0
    not_written: int = 0
    lost: int = 0
    error: BaseException | None = None
    duplicates: int = 0  # a named producer's records the stream already held (--producer-id): not written again
    deleted_ledgers: list[int] = field(default_factory=list)
    _durable: dict[int, list[Any]] = field(default_factory=dict, repr=False)  # ledger -> [count, first, last]

    def track(self, future: asyncio.Future[Any]) -> None:
        self.started = True
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self.unknown += 1
            self.error = self.error or DlogError("a write was cancelled")
            return
        error = future.exception()
        if error is not None:
            self.error = self.error or error
            if isinstance(error, LedgerDeletedError):
                self._lose(error.ledger_id)
                if error.pending_lost:  # sent only to the deleted ledger, or never sent
                    self.not_written += 1
                    return
            self.unknown += 1
            return
        offset = future.result()
        if not hasattr(offset, "ledger_id"):  # a dlog.writer.DuplicateWrite (that module not imported: pyarrow)
            self.duplicates += 1
            return
        if offset.ledger_id in self.deleted_ledgers:  # acknowledged just before the writer learned
            self.lost += 1
            return
        durable = self._durable.get(offset.ledger_id)
        if durable is None:
            self._durable[offset.ledger_id] = [1, offset, offset]
        else:
            durable[0] += 1
            durable[2] = offset

    def writer_failed(self, error: BaseException) -> None:
        """The writer's own error, which names a deleted ledger even when no record was pending."""
        self.error = self.error or error
        if isinstance(error, LedgerDeletedError):
            self._lose(error.ledger_id)

    def _lose(self, ledger_id: int) -> None:
        """Records acknowledged into a ledger deleted under the writer were durable, and are not now."""
        if ledger_id not in self.deleted_ledgers:
            self.deleted_ledgers.append(ledger_id)
            self.lost += self._durable.pop(ledger_id, [0])[0]

    @property
    def count(self) -> int:
        return sum(durable[0] for durable in self._durable.values())

    @property
    def first(self) -> Any:
        return next(iter(self._durable.values()))[1] if self._durable else None

    @property
    def last(self) -> Any:
        return next(reversed(self._durable.values()))[2] if self._durable else None

    @property
    def clean(self) -> bool:
        """Every record handed to the writer is durable."""
        return self.error is None and not (self.unknown or self.not_written or self.lost)

    def to_json(self) -> dict[str, Any]:
        first, last = self.first, self.last
        return {"count": self.count, "first": None if first is None else str(first),
                "last": None if last is None else str(last),
                "first_position": None if first is None else first.position,  # stream positions (V4)
                "last_position": None if last is None else last.position, "unknown": self.unknown,
                "lost": self.lost, "not_written": self.not_written, "deleted_ledgers": list(self.deleted_ledgers),
                "duplicates": self.duplicates}

    def summary(self, name: str) -> str:
        """One line: what is durable (and up to where: where to resume from) and what is not."""
        count = self.count
        duplicates = f"; {plural(self.duplicates, 'record')} already in {name}, not written again" \
            if self.duplicates else ""
        if self.clean:
            offsets = f" ({self.first} .. {self.last})" if count else ""
            return f"wrote {plural(count, 'record')} to {name}{offsets}{duplicates}"
        parts = [f"{plural(count, 'record')} durable in {name}" + (f" up to {self.last}" if count else "")]
        if self.unknown:
            parts.append(f"{self.unknown:,} in flight with an unknown outcome")
        if self.lost:
            ledgers = ", ".join(map(str, self.deleted_ledgers))
            parts.append(f"{self.lost:,} acknowledged into ledger{'s' if len(self.deleted_ledgers) > 1 else ''} "
                         f"{ledgers}, deleted under the writer, lost")
        if self.not_written:
            parts.append(f"{self.not_written:,} not written")
        return "; ".join(parts) + duplicates


async def produce(ns: Any, name: str, chunks: AsyncIterator[tuple[bytes, bool]], parser: RecordParser, *,
                  takeover: bool = False, on_lock_wait: Callable[[dict[str, Any] | None], None] | None = None,
                  produced: Produced | None = None, headers: list[tuple[str, bytes]] | None = None,
                  interrupts: Interrupts | None = None, producer_id: str | None = None) -> Produced:
    """Write every record from `chunks` through one writer; flush whenever the input pauses.
    `headers` (`--header`) go on every record. A second Ctrl-C (`interrupts`) aborts the writer.
    `producer_id` (`--producer-id`): a named idempotent producer whose sequences are the records'
    places in the input (0, 1, 2...), so a run again over the same input writes only what is missing."""
    produced = produced if produced is not None else Produced()
    run = _Run(ns, name, takeover, on_lock_wait, produced, headers, producer_id)
    try:
        await run.feed(chunks, parser)
    except BadInputError as exc:  # what came before the bad line is written, and the message says so
        await run.close(interrupts)
        raise BadInputError(f"{exc} ({plural(produced.count, 'record')} before it "
                            f"{'was' if produced.count == 1 else 'were'} written to {name})") from exc
    finally:
        await run.close(interrupts)
    if produced.error is not None:
        raise produced.error
    return produced


class _Run:
    """One run of the console producer: its writer, opened on the first record."""

    def __init__(self, ns: Any, name: str, takeover: bool,
                 on_lock_wait: Callable[[dict[str, Any] | None], None] | None, produced: Produced,
                 headers: list[tuple[str, bytes]] | None, producer_id: str | None = None) -> None:
        self.ns, self.name, self.takeover, self.on_lock_wait = ns, name, takeover, on_lock_wait
        self.produced, self.headers = produced, headers
        self.writer: Any = None
        self.producer_id, self.records = producer_id, 0  # records of the input so far (a named producer's sequences)

    async def feed(self, chunks: AsyncIterator[tuple[bytes, bool]], parser: RecordParser) -> None:
        iterator = chunks.__aiter__()
        while (item := await self._next_chunk(iterator)) is not None:
            chunk, more_waiting = item
            for record in parser.feed(chunk):
                await self._write(record)
            if not more_waiting and self.writer is not None:
                await self.writer.flush()
        for record in parser.finish():
            await self._write(record)

    async def _write(self, record: Record) -> None:
        if self.writer is None:
            self.writer = await open_writer(self.ns, self.name, self.takeover, self.on_lock_wait, self.producer_id)
        await self.writer.wait_writable()
        headers = record.headers if not self.headers else [*(record.headers or []), *self.headers]
        if self.producer_id is None:
            self.produced.track(self.writer.write_nowait(record.value, record.key, record.timestamp_ms, headers))
            return
        sequence, self.records = self.records, self.records + 1
        self.produced.track(self.writer.write_nowait(record.value, record.key, record.timestamp_ms, headers,
                                                     sequence=sequence))

    async def _next_chunk(self, iterator: AsyncIterator[tuple[bytes, bool]]) -> tuple[bytes, bool] | None:
        """The next chunk (None at the end of input), or the writer's error as soon as it fails, even
        while standard input has nothing new (`tail -f app.log | dlog write s`)."""
        if self.writer is None:
            return await anext(iterator, None)
        reading = asyncio.ensure_future(anext(iterator, None))
        try:
            await asyncio.wait({reading, self.writer.until_ended()}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            reading.cancel()
            raise
        if reading.done():
            return reading.result()
        reading.cancel()
        await asyncio.wait({reading})  # the reader stops before the writer is closed
        raise self.writer.error or DlogError(f"the writer of stream {self.name!r} ended")

    async def close(self, interrupts: Interrupts | None) -> None:
        """Close the writer (flushing what it holds); a second Ctrl-C meanwhile aborts it."""
        writer, self.writer = self.writer, None
        if writer is None:
            return
        if writer.error is not None:
            self.produced.writer_failed(writer.error)
        stop_waiting = interrupts.on_second(lambda: writer.abort(WriterAbortedError(
            "interrupted twice: stopped without waiting for the records in flight, whose outcome is "
            "unknown"))) if interrupts is not None else None
        try:
            await writer.close()
        except WriterAbortedError:
            pass  # the second Ctrl-C: each record's outcome is in `produced`
        finally:
            if stop_waiting is not None:
                stop_waiting()


async def open_writer(ns: Any, name: str, takeover: bool,
                      on_lock_wait: Callable[[dict[str, Any] | None], None] | None,
                      producer_id: str | None = None) -> Any:
    """Open the stream's writer; if that takes a while (another writer holds the lock), tell
    `on_lock_wait` who holds it, once, and keep waiting. With `takeover`, `on_lock_wait` is told at
    once who holds the lock (the writer about to be fenced), if anyone does."""
    # with --takeover there is no point in first waiting the writer's whole lock timeout
    options: dict[str, Any] = {"takeover": True, "lock_timeout_s": TAKEOVER_LOCK_WAIT_S} if takeover else {}
    if producer_id is not None:
        options["producer_id"] = producer_id
    if takeover and on_lock_wait is not None:
        holder = await ns.store.lock_holder(name)
        if holder is not None:
            on_lock_wait(holder)
        on_lock_wait = None
    opening = asyncio.ensure_future(ns.open_writer(name, **options))
    try:
        done, _ = await asyncio.wait({opening}, timeout=LOCK_NOTICE_AFTER_S)
        if not done and on_lock_wait is not None:
            on_lock_wait(await ns.store.lock_holder(name))
        return await opening
    except BaseException:
        opening.cancel()
        raise
