"""An Apache Iceberg table over a stream's segment files on a tier, registered without rewriting them.

The tier (issue 24) holds each sealed segment of a stream as one Parquet file; `sync_table` makes an
Iceberg table list exactly a given set of those files, so any Iceberg reader (pyiceberg, Spark,
Trino, DuckDB's iceberg extension) sees the stream's offloaded records as one table.

Contract of `sync_table(target, files, schema=None)`:

- Afterwards the table's current snapshot holds exactly `files`: each file not yet in the table is
  registered as it is (pyiceberg's `add_files`: its footer is read for the column statistics, the
  data are never rewritten), each file in the table but not in `files` is removed from the table
  (the file itself is left alone: retention deletes it from the tier, not this module), every other
  file stays. One sync is one catalog commit, so a reader sees all of it or none of it: with both
  additions and removals the commit carries two snapshots, an `overwrite` that only removes files
  (pyiceberg 0.12 has no public delete-by-file; its `delete` producer ignores explicit files,
  apache/iceberg-python#3857) and then an `append`; additions alone make one `append`.
- Idempotent: a sync with the files the table already holds commits nothing (the same snapshot).
- The table is created when absent (with its namespace), unpartitioned, from `schema` if given,
  else from the first new file's Arrow schema; every top-level column is optional, so a file
  without a column (`headers` when no record had any, `position` on a stream without dense
  positions) reads it as null. A new file with columns the table lacks adds them (union by name;
  an int column may widen to long, other type changes are refused).
- `files` are Parquet files: plain local paths (made absolute, stored as `file://` URIs) or URIs
  that pyiceberg's FileIO reads (`file://`, `s3://`...). The same file must be given the same way
  each time: the table compares paths as strings. Duplicates in `files` count once.
- Bad input changes nothing and raises one `ConfigError` line: a file that does not exist or is
  not Parquet, a file with Parquet field ids (the table's name mapping could not apply to it), a
  column whose type conflicts with the table's, no files and no schema for a table that does not
  exist yet, more than `FILES_MAX` files. Every new file is checked before the catalog is touched.
- Another writer committing to the table during a sync: the sync fails with one line and commits
  nothing (pyiceberg's commit retries are off for the table, `TABLE_PROPERTIES`); running it
  again is safe.
- The catalog is pyiceberg's SQL catalog (`catalog_uri` is a SQLAlchemy URL, SQLite by default);
  `warehouse` is where the table's metadata files go. `io_properties` pass through to pyiceberg's
  FileIO for both the data files and the warehouse: for S3 `s3.endpoint`, `s3.access-key-id`,
  `s3.secret-access-key`, `s3.region` (see `S3_PROPERTIES`).
- pyiceberg is the optional extra `dlog[iceberg]`: it is imported on the first call only, and
  without it the call raises one `ConfigError` naming the extra.

Old snapshots still name removed files; time travel to them fails once retention has deleted the
files. Nothing here expires snapshots.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from bookkeeper.errors import ConfigError, DlogError, known

INSTALL_HINT = "pip install 'dlog[iceberg]'"
FILES_MAX = 100_000  # files one table may list: one sync holds each file's path and statistics in memory
CATALOG_NAME = "dlog"
# pyiceberg FileIO properties for an S3 tier (and an S3 warehouse), passed through as given
S3_PROPERTIES = ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key", "s3.region")
FIELD_ID_KEY = b"PARQUET:field_id"
# pyiceberg retries a commit that lost a race by replaying the same additions and removals on the new
# head, which is not "exactly these files" (two syncs adding one file would list it twice): a lost
# race fails instead, and the next sync starts from the table as it is then
COMMIT_RETRIES = "commit.retry.num-retries"
TABLE_PROPERTIES = {COMMIT_RETRIES: "0"}


@dataclass(frozen=True)
class IcebergTarget:
    """Where the table lives: a SQL catalog, a warehouse for its metadata, and its identifier
    (`namespace`, `table`), kept apart because dlog names may contain dots."""

    catalog_uri: str  # a SQLAlchemy URL: sqlite:////absolute/path/iceberg.db
    warehouse: str  # a local folder, a file:// or an s3:// URI
    namespace: str
    table: str
    io_properties: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def local(cls, directory: str | os.PathLike[str], namespace: str, table: str,
              io_properties: Mapping[str, str] | None = None) -> IcebergTarget:
        """The default layout: the catalog in `<directory>/iceberg.db`, metadata under
        `<directory>/iceberg-warehouse`."""
        base = Path(directory).absolute()
        return cls(catalog_uri=f"sqlite:///{base / 'iceberg.db'}", warehouse=f"file://{base / 'iceberg-warehouse'}",
                   namespace=namespace, table=table, io_properties=dict(io_properties or {}))

    @property
    def name(self) -> str:
        """`<namespace>.<table>`, for messages."""
        return f"{self.namespace}.{self.table}"


@dataclass(frozen=True)
class SyncResult:
    added: int
    removed: int
    unchanged: int
    snapshot_id: int | None  # the table's current snapshot after the sync (None: it holds no files)


def sync_table(target: IcebergTarget, files: Sequence[str], schema: pa.Schema | None = None) -> SyncResult:
    """Make the table of `target` hold exactly `files` (the module docstring is the contract).
    `schema` is the table's schema when this call creates it, and is not used afterwards."""
    pyiceberg = _pyiceberg()
    wanted = list(dict.fromkeys(file_uri(path) for path in files))
    if len(wanted) > FILES_MAX:
        raise ConfigError(f"{len(wanted)} files for table {target.name}: at most {FILES_MAX} per table (FILES_MAX)")
    properties = {**target.io_properties, "warehouse": target.warehouse}
    identifier = (target.namespace, target.table)
    database = _sqlite_file(target.catalog_uri)
    catalog = None  # a SQLite catalog not created yet holds no table: it is created once the files are checked
    if database is None or database.exists():
        catalog = _open_catalog(pyiceberg, target.catalog_uri, properties)
    table = None
    if catalog is not None:
        try:
            table = catalog.load_table(identifier)
        except pyiceberg.NoSuchTableError:
            pass
    held = {} if table is None else {task.file.file_path: task.file for task in table.scan().plan_files()}
    listed = set(wanted)
    new = [path for path in wanted if path not in held]
    gone = [data_file for path, data_file in held.items() if path not in listed]
    if table is None and not new and schema is None:
        raise ConfigError(f"no files and no schema: nothing to create table {target.name} from")
    io = table.io if table is not None else pyiceberg.load_file_io(properties, new[0] if new else None)
    schemas = [_file_schema(io, path) for path in new]  # every new file checked before anything changes
    if catalog is None:
        catalog = _open_catalog(pyiceberg, target.catalog_uri, properties)
    if table is not None and table.properties.get(COMMIT_RETRIES) != "0":  # a table this module did not create
        table = table.transaction().set_properties({COMMIT_RETRIES: "0"}).commit_transaction()
    if not new and not gone:
        if table is None:  # an empty table of the given schema
            catalog.create_namespace_if_not_exists((target.namespace,))
            table = catalog.create_table(identifier, schema=_optional(known(schema, "checked above")),
                                         properties=TABLE_PROPERTIES)
        return SyncResult(added=0, removed=0, unchanged=len(held), snapshot_id=_snapshot_id(table))
    namespace = (target.namespace,)  # one level, even with dots in the name
    made_namespace = table is None and not catalog.namespace_exists(namespace)
    try:
        if made_namespace:
            catalog.create_namespace(namespace)
        if table is None:
            transaction = catalog.create_table_transaction(identifier, schema=_optional(schema or schemas[0]),
                                                           properties=TABLE_PROPERTIES)
        else:
            transaction = table.transaction()
        for path, file_schema in zip(new, schemas, strict=True):
            _check_types(pyiceberg, transaction.table_metadata.schema(), path, file_schema)
            with transaction.update_schema() as update:
                update.union_by_name(_optional(file_schema))
        if gone:
            with transaction.update_snapshot().overwrite() as overwrite:
                for data_file in gone:
                    overwrite.delete_data_file(data_file)
        if new:
            transaction.add_files(new, check_duplicate_files=False)  # `held` is the current snapshot's files
        table = transaction.commit_transaction()
    except Exception as exc:
        if made_namespace:  # a refused sync leaves no namespace behind
            _drop_namespace_if_empty(pyiceberg, catalog, namespace)
        refusal = _refusal(pyiceberg, exc, target.name)
        if refusal is None:
            raise
        raise refusal from None
    return SyncResult(added=len(new), removed=len(gone), unchanged=len(held) - len(gone),
                      snapshot_id=_snapshot_id(table))


def _drop_namespace_if_empty(pyiceberg: _PyIceberg, catalog: Any, namespace: tuple[str]) -> None:
    try:
        catalog.drop_namespace(namespace)
    except pyiceberg.NamespaceNotEmptyError:
        pass  # another sync created a table in it meanwhile


def _refusal(pyiceberg: _PyIceberg, exc: Exception, name: str) -> DlogError | None:
    """The one-line error for what pyiceberg refused (None: not a refusal, a bug to see whole)."""
    if isinstance(exc, DlogError):
        return exc
    if isinstance(exc, pyiceberg.CommitFailedException):
        return DlogError(f"table {name} changed while this sync ran (another sync?); nothing was changed by "
                         f"this one: run it again ({_first_line(exc)})")
    if isinstance(exc, pyiceberg.TableAlreadyExistsError):
        return DlogError(f"table {name} was created while this sync ran (another sync?); nothing was changed "
                         "by this one: run it again")
    if isinstance(exc, (ValueError, pyiceberg.ValidationError)):
        return ConfigError(f"cannot register the files in table {name}: {_first_line(exc)}; nothing was changed")
    return None


def _open_catalog(pyiceberg: _PyIceberg, uri: str, properties: dict[str, str]) -> Any:
    """The SQL catalog at `uri` (created if new; for SQLite with the folder of its file)."""
    if (database := _sqlite_file(uri)) is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    return pyiceberg.SqlCatalog(CATALOG_NAME, uri=uri, **properties)


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite catalog URL (sqlite:///relative or sqlite:////absolute)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri == prefix + ":memory:":
        return None
    return Path(uri[len(prefix):])


def _snapshot_id(table: Any) -> int | None:
    snapshot = table.current_snapshot()
    return None if snapshot is None else int(snapshot.snapshot_id)


def file_uri(path: str) -> str:
    """The one spelling of a file in the table: a plain path as an absolute `file://` URI, a
    `file:` URI as `file://<path>`, any other URI as given."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"{path}: a file:// URI names a local file (file:///path), not host {parsed.netloc!r}")
        return f"file://{parsed.path}"
    if len(parsed.scheme) > 1:  # a URI (a one-letter scheme would be a Windows drive)
        return path
    return f"file://{os.path.abspath(path)}"


class _PyIceberg:
    """The pyiceberg names this module uses, imported on first use (the optional extra)."""

    def __init__(self) -> None:
        try:
            import pyiceberg.types
            from pyiceberg.catalog.sql import SqlCatalog
            from pyiceberg.exceptions import (
                CommitFailedException,
                NamespaceNotEmptyError,
                NoSuchTableError,
                TableAlreadyExistsError,
                ValidationError,
            )
            from pyiceberg.io import load_file_io
            from pyiceberg.io.pyarrow import pyarrow_to_schema
        except ImportError as exc:
            raise ConfigError(f"the Iceberg view needs pyiceberg, which is not installed in this environment "
                              f"({exc.name}): {INSTALL_HINT}") from None
        self.SqlCatalog = SqlCatalog
        self.CommitFailedException = CommitFailedException
        self.NamespaceNotEmptyError = NamespaceNotEmptyError
        self.NoSuchTableError = NoSuchTableError
        self.TableAlreadyExistsError = TableAlreadyExistsError
        self.ValidationError = ValidationError
        self.load_file_io = load_file_io
        self.pyarrow_to_schema = pyarrow_to_schema
        self.types = pyiceberg.types


def _pyiceberg() -> _PyIceberg:
    return _PyIceberg()


def _file_schema(io: Any, path: str) -> pa.Schema:
    """The Arrow schema of the Parquet file at `path`, or ConfigError if it cannot be registered."""
    source = io.new_input(path)
    if not source.exists():
        raise ConfigError(f"no such file: {path}; nothing was changed")
    try:
        with source.open() as stream:
            schema = pq.read_schema(stream)
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{path} is not a readable Parquet file ({_first_line(exc)}); nothing was changed") from None
    if _has_field_ids(schema):
        raise ConfigError(f"{path} carries Parquet field ids: only files written without them (as dlog "
                          "writes them) can be registered by name; nothing was changed")
    return schema


def _check_types(pyiceberg: _PyIceberg, table_schema: Any, path: str, file_schema: pa.Schema) -> None:
    """ConfigError unless each column of the file that the table has is of the table's type (an int
    may widen to long, a float to double): pyiceberg would take some other changes (string for
    binary) and then fail on the file's statistics without naming the file."""
    names = {field_.name for field_ in table_schema.fields}
    shared = pa.schema([field_ for field_ in file_schema if field_.name in names])
    try:
        file_types = pyiceberg.pyarrow_to_schema(shared, name_mapping=table_schema.name_mapping)
    except ValueError:
        return  # a nested field the table lacks: union_by_name and add_files judge it
    for field_ in file_types.fields:
        table_type = table_schema.find_field(field_.field_id).field_type
        if not _fits(pyiceberg, field_.field_type, table_type):
            raise ConfigError(f"{path}: column {field_.name} is {field_.field_type}, the table's is {table_type}; "
                              "nothing was changed")


def _fits(pyiceberg: _PyIceberg, file_type: Any, table_type: Any) -> bool:
    """Whether values of `file_type` read as `table_type` unchanged (requiredness aside)."""
    types = pyiceberg.types
    if isinstance(file_type, types.IntegerType) and isinstance(table_type, types.LongType):
        return True
    if isinstance(file_type, types.FloatType) and isinstance(table_type, types.DoubleType):
        return True
    if isinstance(file_type, types.StructType) and isinstance(table_type, types.StructType):
        return all(_fits(pyiceberg, field_.field_type, table_type.field(field_.field_id).field_type)
                   for field_ in file_type.fields if table_type.field(field_.field_id) is not None)
    if isinstance(file_type, types.ListType) and isinstance(table_type, types.ListType):
        return _fits(pyiceberg, file_type.element_type, table_type.element_type)
    if isinstance(file_type, types.MapType) and isinstance(table_type, types.MapType):
        return (_fits(pyiceberg, file_type.key_type, table_type.key_type)
                and _fits(pyiceberg, file_type.value_type, table_type.value_type))
    return bool(file_type == table_type)


def _has_field_ids(schema: pa.Schema) -> bool:
    def walk(field_: pa.Field) -> bool:
        if field_.metadata and FIELD_ID_KEY in field_.metadata:
            return True
        kind = field_.type
        if pa.types.is_struct(kind):
            return any(walk(kind.field(i)) for i in range(kind.num_fields))
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return walk(kind.value_field)
        if pa.types.is_map(kind):
            return walk(kind.key_field) or walk(kind.item_field)
        return False

    return any(walk(field_) for field_ in schema)


def _optional(schema: pa.Schema) -> pa.Schema:
    """`schema` with every top-level column nullable: a file may lack any of them."""
    return pa.schema([field_.with_nullable(True) for field_ in schema], metadata=schema.metadata)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
