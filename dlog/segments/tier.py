"""The tier's file format and store: a completed segment as ONE Parquet file, written from its
entries and read back as entries, on any pyarrow.fs filesystem (local files, S3).

Layout. `<tier uri>/<namespace>/<stream node>/segment=<sequence>/<attempt uuid>.parquet`, so the
stream's directory reads as a table partitioned by segment (`spark.read.parquet`, DuckDB,
`pyarrow.dataset`). `<stream node>` is the stream's one node name (`/` written %2F).

Columns. The position columns `ledger` (int64), `entry` (int64), `slot` (int32) and, when the
segment has a stream position (V4), `position` (int64); then the stream's own columns: for an
untyped stream `timestamp`, `key`, `value` and always `headers` (null where a record has none, so
every file of a stream has one schema), for a typed stream the columns of the schema version its
segment was written with (without field ids: Iceberg maps them by name; readers project a file's
records onto the version they read, as a ledger's). zstd-compressed,
page checksums written. Row groups hold whole entries (an entry is never cut between two), so the
footer's statistics of `entry` are the entry index: reading entries first..last decodes only the
row groups that hold them. The file's key-value metadata `dlog.segment` names the namespace,
stream, segment sequence, ledger, entry range and schema version (JSON).

Integrity. The offloader records the file's size and crc32c in the segment's `TierCopy`; a read
fetches the whole file once (one sequential GET on S3), checks both, then parses it from memory:
a damaged file is one TierDamagedError naming the file and what differs, never wrong records.

A read gives `DecodedEntry` values in place of entry payloads: the record-set codec hands them
out as they are (`RecordSetCodec.decode`), so the stream reader, the Spark source and export read
tier segments through the code that reads ledgers.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from bookkeeper.errors import ConfigError, DlogError
from dlog.names import stream_node_name
from dlog.segments.codec import (
    FLAG_HEADERS,
    FORMAT_VERSION,
    HEADERS_FIELD,
    Compression,
    DecodedEntry,
    RecordSetHeader,
    batch_timestamp_range_ms,
)
from dlog.segments.metadata import Segment, TierCopy

FILE_FORMAT = 1
METADATA_KEY = b"dlog.segment"
POSITION_COLUMNS = ("ledger", "entry", "slot", "position")
UNTYPED_COLUMNS = ("key", "value", "timestamp", "headers")
SCHEMES = ("file", "s3")
ROW_GROUP_ROWS = 128 * 1024  # entries are gathered into a row group until it holds this many records
ROW_GROUP_BYTES = 64 * 2**20  # ... or this many decoded bytes
DECODED_GROUPS_KEPT = 2  # decoded row groups a parsed file keeps (the one read, the next one prefetched)
UPLOAD_CHUNK_BYTES = 8 * 2**20  # what an upload copies per write (S3: one multipart part at most)
READ_CHUNK_BYTES = 8 * 2**20


class TierError(DlogError):
    """The tier could not be written or read (unreachable, refused, full)."""

    code = 340
    retryable = True


class TierDamagedError(DlogError):
    """A tier file is not what its segment's metadata recorded (size, checksum, or its contents)."""

    code = 341
    retryable = False


# ------------------------------------------------------------------------------ the store


@dataclass(frozen=True, slots=True)
class TierOptions:
    """How to reach an S3 tier beyond its URI; None leaves it to pyarrow's own lookup (the
    environment's AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL
    and ~/.aws files, as boto3 reads them)."""

    s3_endpoint: str | None = None  # host:port or a URL (http:// selects plain HTTP)
    s3_region: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> TierOptions:
        unknown = sorted(set(section) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"unknown tier setting(s) {', '.join(unknown)}; known: "
                              f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**{key: str(value) for key, value in section.items()})


def check_tier_uri(uri: str) -> str:
    """A tier URI as stored: `file:///absolute/path` or `s3://bucket[/prefix]`, without a trailing
    slash; ConfigError (one line, what is wrong and what is right) otherwise."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme not in SCHEMES:
        raise ConfigError(f"tier URI {uri!r} has scheme {parsed.scheme or '(none)'!r}; expected file:///path "
                          f"or s3://bucket/prefix")
    if parsed.scheme == "file" and (parsed.netloc or not parsed.path.startswith("/")):
        raise ConfigError(f"tier URI {uri!r} is not an absolute local path; expected file:///absolute/path")
    if parsed.scheme == "s3" and not parsed.netloc:
        raise ConfigError(f"tier URI {uri!r} names no bucket; expected s3://bucket/prefix")
    if parsed.fragment:
        raise ConfigError(f"tier URI {uri!r} has a fragment; expected none")
    return uri.rstrip("/")


def segment_file_uri(tier_uri: str, namespace: str, stream: str, sequence: int, attempt: str) -> str:
    """Where one offload attempt of a segment writes its file."""
    parsed = urllib.parse.urlsplit(check_tier_uri(tier_uri))
    node = urllib.parse.quote(stream_node_name(stream), safe="%")
    directory = f"{parsed.path.rstrip('/')}/{urllib.parse.quote(namespace, safe='')}/{node}"
    path = f"{directory}/segment={sequence}/{attempt}.parquet"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, parsed.query, ""))


def stream_table_uri(tier_uri: str, namespace: str, stream: str) -> str:
    """The directory that reads as the stream's table (with the tier URI's query: its endpoint)."""
    parsed = urllib.parse.urlsplit(segment_file_uri(tier_uri, namespace, stream, 0, "x"))
    return parsed._replace(path=parsed.path.rsplit("/segment=", 1)[0]).geturl()


class TierStore:
    """Files on tiers, one pyarrow filesystem per (scheme, bucket, query), built once."""

    def __init__(self, options: TierOptions | None = None) -> None:
        self.options = options or TierOptions()
        self._filesystems: dict[tuple[str, str, str], pafs.FileSystem] = {}
        self._lock = threading.Lock()

    def locate(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """The filesystem and the path within it of a file or directory URI."""
        parsed = urllib.parse.urlsplit(uri)
        if parsed.scheme not in SCHEMES:
            raise ConfigError(f"tier URI {uri!r} has scheme {parsed.scheme!r}; expected file or s3")
        path = urllib.parse.unquote(parsed.path)
        key = (parsed.scheme, parsed.netloc, parsed.query)
        with self._lock:
            filesystem = self._filesystems.get(key)
            if filesystem is None:
                filesystem = self._filesystems[key] = self._filesystem(parsed)
        if parsed.scheme == "file":
            return filesystem, path
        return filesystem, f"{parsed.netloc}{path}"

    def _filesystem(self, parsed: urllib.parse.SplitResult) -> pafs.FileSystem:
        if parsed.scheme == "file":
            return pafs.LocalFileSystem()
        query = dict(urllib.parse.parse_qsl(parsed.query))
        options: dict[str, Any] = {}
        endpoint = query.pop("endpoint_override", None) or self.options.s3_endpoint
        if endpoint:
            if "://" in endpoint:
                scheme, _, endpoint = endpoint.partition("://")
                options["scheme"] = scheme
            options["endpoint_override"] = endpoint
        if "scheme" in query:
            options["scheme"] = query.pop("scheme")
        region = query.pop("region", None) or self.options.s3_region
        if region:
            options["region"] = region
        if self.options.s3_access_key:
            options["access_key"] = self.options.s3_access_key
            options["secret_key"] = self.options.s3_secret_key or ""
        if query:
            raise ConfigError(f"tier URI query has unknown option(s) {', '.join(sorted(query))}; known: "
                              "endpoint_override, scheme, region")
        try:
            return pafs.S3FileSystem(**options)
        except (OSError, ValueError) as exc:
            raise TierError(f"cannot set up the S3 tier s3://{parsed.netloc}: {exc}") from exc

    # ------------------------------------------------------------------ files

    def upload(self, local_path: str, uri: str) -> None:
        """Copy a local file to `uri` (on S3 a multipart upload when larger than a part)."""
        filesystem, path = self.locate(uri)
        try:
            filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with open(local_path, "rb") as source, filesystem.open_output_stream(path) as target:
                while chunk := source.read(UPLOAD_CHUNK_BYTES):
                    target.write(chunk)
        except OSError as exc:
            raise TierError(f"cannot write {uri}: {exc}") from exc

    def fetch(self, uri: str, size_max: int) -> bytes:
        filesystem, path = self.locate(uri)
        try:
            with filesystem.open_input_stream(path) as source:
                data = source.read(size_max + 1)
        except FileNotFoundError as exc:
            raise TierDamagedError(f"tier file {uri} is missing") from exc
        except OSError as exc:
            if "not exist" in str(exc).lower() or "nosuchkey" in str(exc).lower():
                raise TierDamagedError(f"tier file {uri} is missing") from exc
            raise TierError(f"cannot read {uri}: {exc}") from exc
        return bytes(data)

    def delete(self, uri: str) -> bool:
        """Remove a file; False when it was not there (deleting twice is no error)."""
        filesystem, path = self.locate(uri)
        try:
            if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
                return False
            filesystem.delete_file(path)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise TierError(f"cannot delete {uri}: {exc}") from exc

    def exists(self, uri: str) -> bool:
        filesystem, path = self.locate(uri)
        try:
            return bool(filesystem.get_file_info(path).type != pafs.FileType.NotFound)
        except OSError as exc:
            raise TierError(f"cannot look at {uri}: {exc}") from exc

    def list_files(self, directory_uri: str) -> list[str]:
        """Every file under a directory URI (recursively), as URIs; [] when it does not exist."""
        filesystem, path = self.locate(directory_uri)
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise TierError(f"cannot list {directory_uri}: {exc}") from exc
        parsed = urllib.parse.urlsplit(directory_uri)
        base = urllib.parse.unquote(parsed.path).rstrip("/")
        found = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(path.rstrip("/")):]
            found.append(urllib.parse.urlunsplit((parsed.scheme, parsed.netloc,
                                                  urllib.parse.quote(base + relative, safe="/%=:"),
                                                  parsed.query, "")))
        return sorted(found)


# ------------------------------------------------------------------------------ writing


def file_schema(stream_schema: pa.Schema, positions: bool) -> pa.Schema:
    """The columns of a segment file of a stream with `stream_schema` (an untyped stream's
    schema gains `headers`)."""
    fields = [pa.field("ledger", pa.int64(), nullable=False), pa.field("entry", pa.int64(), nullable=False),
              pa.field("slot", pa.int32(), nullable=False)]
    if positions:
        fields.append(pa.field("position", pa.int64(), nullable=False))
    columns = [field.remove_metadata() for field in stream_schema]  # no field ids: Iceberg maps by name
    if stream_schema.names == ["key", "value", "timestamp"]:  # untyped: the order of the table
        columns = [stream_schema.field("timestamp"), stream_schema.field("key"), stream_schema.field("value"),
                   HEADERS_FIELD]
    return pa.schema([*fields, *columns])


@dataclass(frozen=True, slots=True)
class WrittenFile:
    local_path: str
    size_bytes: int
    crc32c: int
    rows: int
    entries: int


class SegmentFileWriter:
    """Builds one segment's Parquet file in a local temporary file, entry by entry (in entry
    order, from the segment's first entry), gathering whole entries into row groups."""

    def __init__(self, namespace: str, stream: str, segment: Segment, stream_schema: pa.Schema,
                 directory: str | None = None) -> None:
        self.segment = segment
        self.positions = segment.first_position is not None
        self.schema = file_schema(stream_schema, self.positions).with_metadata({METADATA_KEY: json.dumps({
            "format": FILE_FORMAT, "namespace": namespace, "stream": stream, "sequence": segment.sequence,
            "ledger": segment.ledger_id, "first_entry": segment.first_entry, "last_entry": segment.last_entry,
            "records": segment.records, "schema_version": segment.schema_version}, sort_keys=True).encode()})
        handle, self.local_path = tempfile.mkstemp(prefix=f"dlog-offload-{segment.ledger_id}-", suffix=".parquet",
                                                   dir=directory)
        os.close(handle)
        # no dictionary for an untyped stream's values: mostly distinct, so Parquet would build one
        # per page and fall back to plain anyway; read back ~30% faster without (dlog bench tier)
        dictionary = [field.name for field in self.schema if field.name != "value"]
        self._writer = pq.ParquetWriter(self.local_path, self.schema, compression="zstd", use_dictionary=dictionary,
                                        write_page_checksum=True)
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self.rows = 0
        self.entries = 0
        self._next_entry = segment.first_entry

    def add(self, entry_id: int, header: RecordSetHeader, batch: pa.RecordBatch) -> None:
        if entry_id != self._next_entry:
            raise TierDamagedError(f"segment {self.segment.sequence}: entry {entry_id} came where entry "
                                   f"{self._next_entry} was expected")
        if header.first_record_index != self.rows:
            raise TierDamagedError(f"segment {self.segment.sequence}: entry {entry_id} says its first record is "
                                   f"record {header.first_record_index} of the segment; the entries before "
                                   f"it hold {self.rows}")
        count = batch.num_rows
        columns: dict[str, pa.Array] = {
            "ledger": pa.array([self.segment.ledger_id] * count, pa.int64()),
            "entry": pa.array([entry_id] * count, pa.int64()),
            "slot": pa.array(range(count), pa.int32()),
        }
        if self.positions:
            start = int(self.segment.first_position or 0) + self.rows
            columns["position"] = pa.array(range(start, start + count), pa.int64())
        for field in self.schema:
            if field.name in columns:
                continue
            index = batch.schema.get_field_index(field.name)
            columns[field.name] = (batch.column(index) if index >= 0 else pa.nulls(count, field.type))
        arrays = [columns[field.name] for field in self.schema]
        self._pending.append(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
        self._pending_rows += count
        self._pending_bytes += batch.nbytes
        self.rows += count
        self.entries += 1
        self._next_entry += 1
        if self._pending_rows >= ROW_GROUP_ROWS or self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            table = pa.Table.from_batches(self._pending, schema=self.schema)
            self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0

    def finish(self) -> WrittenFile:
        """Close the file and measure it; the caller uploads `local_path` and removes it."""
        self._flush()
        self._writer.close()
        checksum = 0
        size = 0
        with open(self.local_path, "rb") as source:
            while chunk := source.read(READ_CHUNK_BYTES):
                checksum = crc32c.crc32c(chunk, checksum)
                size += len(chunk)
        return WrittenFile(self.local_path, size, checksum, self.rows, self.entries)

    def discard(self) -> None:
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - closing a half-built file we are removing anyway
            pass
        try:
            os.unlink(self.local_path)
        except FileNotFoundError:
            pass


# ------------------------------------------------------------------------------ reading


class SegmentFile:
    """A segment's file, fetched and checked against its `TierCopy`, parsed from memory."""

    def __init__(self, copy: TierCopy, data: bytes) -> None:
        self.copy = copy
        self.size_bytes = len(data)
        self._lock = threading.Lock()
        self._decoded: dict[int, pa.RecordBatch | None] = {}  # row group -> decoded, oldest first
        if len(data) != copy.size_bytes:
            raise TierDamagedError(f"tier file {copy.uri} is {len(data)} bytes; its segment recorded "
                                   f"{copy.size_bytes}")
        checksum = crc32c.crc32c(data)
        if checksum != copy.crc32c:
            raise TierDamagedError(f"tier file {copy.uri} has crc32c {checksum:#010x}; its segment recorded "
                                   f"{copy.crc32c:#010x}")
        try:
            self.file = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
            metadata = self.file.metadata
            names = self.file.schema_arrow.names
        except (pa.ArrowException, OSError) as exc:
            raise TierDamagedError(f"tier file {copy.uri} is not a readable Parquet file: {exc}") from exc
        stream_columns = [name for name in names if name not in POSITION_COLUMNS]
        self.headers = sorted(stream_columns) == sorted(UNTYPED_COLUMNS)  # an untyped stream's file
        # the records as the codec gives them: an untyped stream's columns in its schema's order
        self.output_names = list(UNTYPED_COLUMNS) if self.headers else stream_columns
        # the entry index: per row group its first and last entry, and the record index it starts at
        self.groups: list[tuple[int, int, int]] = []
        start = 0
        entry_column = names.index("entry")
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            stats = group.column(entry_column).statistics
            if stats is None or not stats.has_min_max:
                raise TierDamagedError(f"tier file {copy.uri} row group {index} has no entry statistics")
            self.groups.append((int(stats.min), int(stats.max), start))
            start += group.num_rows
        if start != copy.rows:
            raise TierDamagedError(f"tier file {copy.uri} holds {start} records; its segment recorded {copy.rows}")

    def entries(self, first: int, last: int) -> list[tuple[int, DecodedEntry]]:
        """Entries first..last (those the file holds), decoded."""
        found: list[tuple[int, DecodedEntry]] = []
        for index, (low, high, start) in enumerate(self.groups):
            if high < first or low > last:
                continue
            found.extend(self._split(self.group(index), start, first, last))
        return found

    def group(self, index: int) -> pa.RecordBatch | None:
        """Row group `index`, decoded (None: empty); the last DECODED_GROUPS_KEPT decoded are kept,
        so reads of a few entries at a time decode each row group once. Thread-safe: a reader's
        prefetch decodes the next group in a worker while it hands out this one."""
        with self._lock:
            found = self._decoded.get(index)
            if found is not None or index in self._decoded:
                return found
            try:
                table = self.file.read_row_group(index)
            except (pa.ArrowException, OSError) as exc:
                raise TierDamagedError(f"tier file {self.copy.uri} row group {index} cannot be read: {exc}") from exc
            batch = table.combine_chunks().to_batches()[0] if table.num_rows else None
            self._decoded[index] = batch
            while len(self._decoded) > DECODED_GROUPS_KEPT:
                self._decoded.pop(next(iter(self._decoded)))
            return batch

    def forget_decoded(self) -> None:
        """Drop the decoded row groups (the read cache keeps them only for the files in use)."""
        with self._lock:
            self._decoded.clear()

    def group_after(self, entry_id: int) -> int | None:
        """The row group after the one holding `entry_id` (None: that is the last, or decoded already)."""
        for index, (low, high, _) in enumerate(self.groups):
            if low <= entry_id <= high:
                following = index + 1
                if following < len(self.groups) and following not in self._decoded:
                    return following
                return None
        return None

    def _split(self, batch: pa.RecordBatch | None, start: int, first: int,
               last: int) -> Iterator[tuple[int, DecodedEntry]]:
        if batch is None:
            return
        entry_ids = batch.column("entry")
        starts = pc.indices_nonzero(pc.equal(batch.column("slot"), 0)).to_pylist()
        starts.append(batch.num_rows)
        records = batch.select(self.output_names)
        for at, end in zip(starts, starts[1:], strict=False):
            entry_id = entry_ids[at].as_py()
            if entry_id < first or entry_id > last:
                continue
            piece = records.slice(at, end - at)
            low_ms, high_ms = batch_timestamp_range_ms(piece)  # in ms whatever the column's unit, as a ledger entry's
            flags = FLAG_HEADERS if self.headers and piece.column("headers").null_count < piece.num_rows else 0
            header = RecordSetHeader(FORMAT_VERSION, Compression.NONE, piece.num_rows, start + at, low_ms, high_ms,
                                     piece.nbytes, flags)
            yield entry_id, DecodedEntry(header, piece)


def read_file_metadata(data: bytes) -> dict[str, Any]:
    """The `dlog.segment` metadata of a file's bytes (for tools)."""
    schema = pq.read_schema(pa.BufferReader(data))
    raw = (schema.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def rows_of(entries: Iterable[tuple[int, DecodedEntry]]) -> int:
    return sum(entry.header.record_count for _, entry in entries)
