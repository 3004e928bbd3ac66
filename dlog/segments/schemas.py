"""Schema evolution of typed streams: the spec forms, field ids, the compatibility rules and the
projection of records written with one schema version onto another. Pure: no I/O, no clock.

Spec. The compact text form is a comma-separated list of fields `NAME[#ID]:TYPE[?][=DEFAULT]`,
e.g. `id:int32, name:string, score:float64?`: `?` makes the field nullable, `#ID` gives its field
id (a rename keeps the id: `full_name#2:string`), `=DEFAULT` a JSON literal that readers use for
records written before the field existed. TYPE is a pyarrow type name (`bool`, `int8`..`int64`,
`uint8`..`uint64`, `float16`, `float32`, `float64`, `string`, `large_string`, `binary`,
`large_binary`, `date32`, `date64`, `timestamp[s|ms|us|ns]`, `timestamp` = `timestamp[ms]`),
`decimal(P,S)` (decimal128), or `list<TYPE>`. The JSON form (`@path` on the command line) is a
list of objects `{"name", "type", "nullable" (default false), "id", "default"}` or an object with
such a list under `"fields"`.

Field ids. Every field of a stored schema carries a stable id in its Arrow field metadata
(`PARQUET:field_id`, the key Parquet and Iceberg use). A field given without an id keeps the id of
the latest version's field of the same name, else gets one above every id any version ever used
(a dropped field's id is never reused). A stored schema from before ids existed numbers its fields
1, 2, 3... in order.

Compatibility (checked against every earlier version: transitive). Data written with schema W
reads with schema R when each field of R is in W under its id with the same type or a widening
(int8->int16->int32->int64, the unsigned likewise, float16->float32->float64, a decimal's
precision increased at the same scale: Iceberg's promotions), not nullable in W where R requires
it, and each field of R missing from W is nullable or has a default. BACKWARD: every earlier
version reads with the new one; FORWARD: the new one reads with every earlier one; FULL: both;
NONE: unchecked (a reader then fails, naming the field, on records it cannot project).

Versions. A stream's schemas are numbered 1, 2, 3...: `StreamConfig.schema_history` holds the
earlier ones, `StreamConfig.schema` the latest. A segment records the version its writer wrote
(`Segment.schema_version`; 0 = written before versions were recorded, which is version 1).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bookkeeper.errors import ConfigError
from dlog.segments.codec import schema_from_text, schema_to_text
from dlog.segments.metadata import SCHEMA_COMPATIBILITY_MODES, StreamConfig

FIELD_ID_KEY = b"PARQUET:field_id"
DEFAULT_KEY = b"dlog.default"  # JSON text of a field's default value
COMPATIBILITY_MODES = SCHEMA_COMPATIBILITY_MODES
FIELDS_MAX = 1000  # fields in one schema
# versions one stream keeps (all in its config node, which ZooKeeper holds to 1 MB): a change past
# this many is refused
SCHEMA_VERSIONS_MAX = 100
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FIELD = re.compile(r"\s*([^\s#:]+)\s*(?:#\s*(\d+)\s*)?:\s*(.+?)\s*\Z", re.S)
_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
_FLOATS = (pa.float16(), pa.float32(), pa.float64())
RULE_WIDEN = "only int->wider int, float->wider float and a decimal's precision increase (same scale) change a type"


# ------------------------------------------------------------------------------ the spec forms


def parse_spec(text: str) -> pa.Schema:
    """A schema (its fields' ids where the spec gives them) from the text or JSON spec form;
    ConfigError naming what is wrong otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("empty schema spec: give fields as 'name:type, other:type?' (docs/concepts.md, Schemas)")
    stripped = text.strip()
    if stripped[0] in "[{":
        return _parse_json(stripped)
    fields = [_parse_field(part) for part in _split_top(stripped, ",")]
    return _checked(pa.schema(fields))


def _parse_json(text: str) -> pa.Schema:
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"schema spec is not valid JSON: {exc}") from None
    if isinstance(document, dict):
        document = document.get("fields")
    if not isinstance(document, list) or not document:
        raise ConfigError('a JSON schema spec is a list of fields, or {"fields": [...]}, each '
                          '{"name", "type", "nullable", "id", "default"}')
    fields = []
    for item in document:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("type"), str):
            raise ConfigError(f"schema field {item!r} needs a text 'name' and 'type'")
        unknown = sorted(set(item) - {"name", "type", "nullable", "id", "default"})
        if unknown:
            raise ConfigError(f"schema field {item['name']!r} has unknown keys {', '.join(unknown)}")
        nullable = item.get("nullable", False)
        field_id = item.get("id")
        if not isinstance(nullable, bool) or (field_id is not None and (type(field_id) is not int or field_id < 1)):
            raise ConfigError(f"schema field {item['name']!r}: nullable must be true or false, id a number >= 1")
        fields.append(_make_field(item["name"], parse_type(item["type"]), nullable, field_id,
                                  json.dumps(item["default"]) if "default" in item else None))
    return _checked(pa.schema(fields))


def _parse_field(part: str) -> pa.Field:
    found = _FIELD.match(part)
    if found is None:
        raise ConfigError(f"bad schema field {part.strip()!r}: write NAME[#ID]:TYPE[?][=DEFAULT], "
                          "e.g. 'score:float64?'")
    name, field_id, rest = found.group(1), found.group(2), found.group(3)
    default = None
    pieces = _split_top(rest, "=")
    if len(pieces) > 2:
        raise ConfigError(f"bad schema field {part.strip()!r}: one '=' before its default")
    if len(pieces) == 2:
        rest, default = pieces[0].strip(), pieces[1].strip()
        try:
            json.loads(default)
        except ValueError:
            raise ConfigError(f"field {name!r}: default {default!r} is not a JSON literal "
                              "(a number, true, false, null, or a \"quoted\" text)") from None
    nullable = rest.endswith("?")
    kind = parse_type(rest[:-1].strip() if nullable else rest)
    return _make_field(name, kind, nullable, int(field_id) if field_id else None, default)


def _make_field(name: str, kind: pa.DataType, nullable: bool, field_id: int | None, default: str | None) -> pa.Field:
    if not _NAME.match(name):
        raise ConfigError(f"bad field name {name!r}: letters, digits and '_', not starting with a digit")
    if field_id is not None and field_id < 1:
        raise ConfigError(f"field {name!r}: id {field_id} must be >= 1")
    metadata: dict[bytes, bytes] = {}
    if field_id is not None:
        metadata[FIELD_ID_KEY] = str(field_id).encode()
    if default is not None:
        value = json.loads(default)
        try:
            pa.scalar(value, kind)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            raise ConfigError(f"field {name!r}: default {default} is not a {type_name(kind)}") from None
        if value is None and not nullable:
            raise ConfigError(f"field {name!r}: a default of null needs a nullable field ('?')")
        metadata[DEFAULT_KEY] = default.encode()
    return pa.field(name, kind, nullable=nullable, metadata=metadata or None)


def parse_type(text: str) -> pa.DataType:
    """A pyarrow type from its spec name (see the module's docstring)."""
    name = text.strip()
    lowered = name.lower()
    decimal = re.fullmatch(r"decimal(?:128)?\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", lowered)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise ConfigError(f"bad type {name!r}: a decimal's precision is 1..38 and its scale at most that")
        return pa.decimal128(precision, scale)
    listed = re.fullmatch(r"list\s*<(.+)>", name, re.S)
    if listed:
        return pa.list_(parse_type(listed.group(1)))
    if lowered == "timestamp":
        return pa.timestamp("ms")
    if lowered in ("float32", "float16", "float64"):
        lowered = {"float32": "float", "float16": "halffloat", "float64": "double"}[lowered]
    try:
        kind = pa.type_for_alias(lowered)
    except ValueError:
        raise ConfigError(f"unknown type {name!r}: use bool, int8..int64, uint8..uint64, float16/32/64, string, "
                          "binary, large_string, large_binary, date32, date64, timestamp[s|ms|us|ns], "
                          "decimal(P,S) or list<TYPE>") from None
    if pa.types.is_dictionary(kind) or pa.types.is_null(kind):
        raise ConfigError(f"type {name!r} cannot be a stream column")
    return kind


def _split_top(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside brackets and quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for index, char in enumerate(text):
        if char == '"' and (index == 0 or text[index - 1] != "\\"):
            quoted = not quoted
        elif quoted:
            continue
        elif char in "(<[":
            depth += 1
        elif char in ")>]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _checked(schema: pa.Schema) -> pa.Schema:
    """ConfigError on duplicate names or ids, no fields, or too many."""
    if not 1 <= len(schema) <= FIELDS_MAX:
        raise ConfigError(f"a schema has 1..{FIELDS_MAX} fields, this one {len(schema)}")
    seen: dict[str, int] = {}
    ids: dict[int, str] = {}
    for field in schema:
        if field.name in seen:
            raise ConfigError(f"field {field.name!r} appears twice in the schema")
        seen[field.name] = 1
        field_id = field_id_of(field)
        if field_id is not None:
            if field_id in ids:
                raise ConfigError(f"fields {ids[field_id]!r} and {field.name!r} have the same id {field_id}")
            ids[field_id] = field.name
    return schema


def field_id_of(field: pa.Field) -> int | None:
    raw = (field.metadata or {}).get(FIELD_ID_KEY)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"field {field.name!r} has field id {raw!r}, not a number") from None


def default_of(field: pa.Field) -> Any:
    """The field's default value (None when it has none)."""
    raw = (field.metadata or {}).get(DEFAULT_KEY)
    return None if raw is None else json.loads(raw)


def has_default(field: pa.Field) -> bool:
    return DEFAULT_KEY in (field.metadata or {})


def with_field_id(field: pa.Field, field_id: int) -> pa.Field:
    metadata = dict(field.metadata or {})
    metadata[FIELD_ID_KEY] = str(field_id).encode()
    return field.with_metadata(metadata)


def without_field_ids(schema: pa.Schema) -> pa.Schema:
    """`schema` with no field metadata (a tier file's columns: Iceberg registers them by name)."""
    return pa.schema([field.remove_metadata() for field in schema], metadata=schema.metadata)


def spec_text(schema: pa.Schema) -> str:
    """The compact text form of `schema`, ids included (what `dlog stream info` shows)."""
    parts = []
    for field in schema:
        type_text = type_name(field.type)
        field_id = field_id_of(field)
        default = (field.metadata or {}).get(DEFAULT_KEY)
        parts.append(f"{field.name}{'' if field_id is None else f'#{field_id}'}:{type_text}"
                     f"{'?' if field.nullable else ''}{'' if default is None else '=' + default.decode()}")
    return ", ".join(parts)


def type_name(kind: pa.DataType) -> str:
    """The spec name of a type (`float64`, `decimal(10,2)`, `list<int32>`)."""
    if pa.types.is_decimal(kind):
        return f"decimal({kind.precision},{kind.scale})"
    if pa.types.is_list(kind):
        return f"list<{type_name(kind.value_type)}>"
    return {"float": "float32", "double": "float64", "halffloat": "float16"}.get(str(kind), str(kind))


# ------------------------------------------------------------------------------ ids and versions


def assign_ids(schema: pa.Schema, versions: Sequence[pa.Schema]) -> pa.Schema:
    """`schema` with an id on every field: its own, else the latest version's field of that name,
    else the next above every id used so far (by any version or by `schema`)."""
    _checked(schema)
    latest = {field.name: field_id_of(field) for field in versions[-1]} if versions else {}
    used = [field_id_of(field) or 0 for version in versions for field in version]
    used += [field_id_of(field) or 0 for field in schema]
    next_id = max(used, default=0) + 1
    fields = []
    for field in schema:
        field_id = field_id_of(field) or latest.get(field.name)
        if field_id is None:
            field_id, next_id = next_id, next_id + 1
        fields.append(with_field_id(field, field_id))
    return _checked(pa.schema(fields, metadata=schema.metadata))


def schema_version(config: StreamConfig) -> int:
    """The stream's latest schema version (0: an untyped stream, which has none)."""
    return len(config.schema_history) + 1 if config.schema else 0


def versions_of(config: StreamConfig) -> tuple[pa.Schema, ...]:
    """Every schema version of a typed stream, version 1 first (with field ids)."""
    if not config.schema:
        return ()
    return tuple(_stored(text) for text in (*config.schema_history, config.schema))


def schema_at(config: StreamConfig, version: int) -> pa.Schema:
    """Schema version `version` of the stream (0: version 1, what segments from before versions hold)."""
    versions = versions_of(config)
    if type(version) is not int or not 0 <= version <= len(versions) or not versions:
        known = f"versions 1..{len(versions)}" if versions else "no schema versions (it is untyped)"
        raise ConfigError(f"stream {config.name!r} has {known}; there is no schema version {version!r}")
    return versions[max(version, 1) - 1]


@functools.lru_cache(maxsize=256)
def _stored(text: str) -> pa.Schema:
    schema = schema_from_text(text)
    if all(field_id_of(field) is not None for field in schema):
        return schema
    return pa.schema([field if field_id_of(field) is not None else with_field_id(field, index)
                      for index, field in enumerate(schema, 1)], metadata=schema.metadata)


def evolve(config: StreamConfig, schema: pa.Schema | str, compatibility: str | None = None) -> StreamConfig:
    """The config with `schema` as its next version (ids assigned, checked against every version
    under the stream's compatibility mode, or `compatibility` when given); the config unchanged
    when `schema` equals the latest version. ConfigError, one line naming the field and the rule,
    when refused."""
    mode = config.schema_compatibility if compatibility is None else check_mode(compatibility)
    if not config.schema:
        raise ConfigError(f"stream {config.name!r} is untyped (key, value, timestamp): its schema cannot change; "
                          "create a typed stream (--schema) instead; nothing was changed")
    versions = versions_of(config)
    new = assign_ids(parse_spec(schema) if isinstance(schema, str) else schema, versions)
    updated = replace(config, schema_compatibility=mode)
    if _same(new, versions[-1]):
        return updated
    if len(versions) >= SCHEMA_VERSIONS_MAX:
        raise ConfigError(f"stream {config.name!r} has {len(versions)} schema versions, the most one stream keeps "
                          f"(SCHEMA_VERSIONS_MAX); nothing was changed")
    check_compatible(new, versions, mode)
    return replace(updated, schema=schema_to_text(new), schema_history=(*config.schema_history, config.schema))


def first_schema(schema: pa.Schema | str) -> pa.Schema:
    """A new typed stream's version 1: parsed when text, ids assigned."""
    return assign_ids(parse_spec(schema) if isinstance(schema, str) else schema, ())


def check_mode(mode: str) -> str:
    upper = mode.upper() if isinstance(mode, str) else mode
    if upper not in COMPATIBILITY_MODES:
        raise ConfigError(f"bad schema compatibility {mode!r}: use one of {', '.join(COMPATIBILITY_MODES)}")
    return str(upper)


def _same(a: pa.Schema, b: pa.Schema) -> bool:
    return bool(a.equals(b)) and [f.metadata for f in a] == [f.metadata for f in b]


# ------------------------------------------------------------------------------ compatibility


def check_compatible(new: pa.Schema, versions: Sequence[pa.Schema], mode: str) -> None:
    """ConfigError naming the first field whose change `mode` forbids against any earlier version."""
    mode = check_mode(mode)
    if mode == "NONE":
        return
    for number, old in enumerate(versions, 1):
        if mode in ("BACKWARD", "FULL"):
            problem = read_problem(old, new)
            if problem:
                raise ConfigError(f"schema change refused (BACKWARD: records of version {number} must read with "
                                  f"the new schema): {problem}; nothing was changed")
        if mode in ("FORWARD", "FULL"):
            problem = read_problem(new, old, forward=True)
            if problem:
                raise ConfigError(f"schema change refused (FORWARD: records of the new schema must read with "
                                  f"version {number}): {problem}; nothing was changed")


def read_problem(written: pa.Schema, reader: pa.Schema, forward: bool = False) -> str | None:
    """Why records written with `written` cannot be read with `reader` (None: they can). The text
    speaks of the change from the older schema to the newer one (`forward`: `written` is newer)."""
    by_id = {field_id_of(field): field for field in written}
    for field in reader:
        source = by_id.get(field_id_of(field))
        name = f"field {field.name!r} (id {field_id_of(field)})"
        if source is None:
            if field.nullable or has_default(field):
                continue
            if forward:
                return (f"{name} is required and the new schema drops it "
                        "(rule: only a nullable field, or one with a default, may be dropped)")
            return (f"{name} is new and required without a default "
                    "(rule: a field added must be nullable or have a default)")
        old, new = (field.type, source.type) if forward else (source.type, field.type)
        change = f"{type_name(old)} -> {type_name(new)}"
        problem = type_problem(source.type, field.type)
        if problem:
            return f"{name}: {change} {problem}"
        if source.nullable and not field.nullable:
            if forward:
                return f"{name}: required -> nullable: records with nulls would not read with the earlier schema " \
                       "(rule: under FORWARD a field does not become nullable)"
            return f"{name}: nullable -> required (rule: earlier records may hold nulls)"
    return None


def type_problem(written: pa.DataType, reader: pa.DataType) -> str | None:
    """Why values of type `written` cannot be read as `reader` (None: the same type, or a widening)."""
    if written.equals(reader):
        return None
    for family in (_SIGNED, _UNSIGNED, _FLOATS):
        if written in family and reader in family:
            return None if family.index(written) < family.index(reader) else f"narrows (rule: {RULE_WIDEN})"
    integers, floats = (*_SIGNED, *_UNSIGNED), _FLOATS
    if (written in integers and reader in floats) or (written in floats and reader in integers):
        return f"is lossy: integers and floats do not convert (rule: {RULE_WIDEN})"
    if pa.types.is_decimal(written) and pa.types.is_decimal(reader):
        if written.scale != reader.scale:
            return f"changes the scale (rule: {RULE_WIDEN})"
        if reader.precision < written.precision:
            return f"narrows (rule: {RULE_WIDEN})"
        return None if reader.bit_width >= written.bit_width else f"narrows (rule: {RULE_WIDEN})"
    return f"changes the type (rule: {RULE_WIDEN})"


# ------------------------------------------------------------------------------ projection


@dataclass(frozen=True, slots=True)
class Projection:
    """How a batch written with one version becomes a batch of the reader's version: per reader
    field, the written column of its id (cast when widened, under the reader's name) or, absent,
    its default or nulls."""

    reader: pa.Schema
    sources: tuple[int | None, ...]  # per reader field: the written column's index, or None
    casts: tuple[bool, ...]

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        columns = []
        rows = batch.num_rows
        for field, source, cast in zip(self.reader, self.sources, self.casts, strict=True):
            if source is None:
                default = default_of(field)
                columns.append(pa.nulls(rows, field.type) if default is None
                               else pa.repeat(pa.scalar(default, field.type), rows))
                continue
            column = batch.column(source)
            if cast:
                try:
                    column = pc.cast(column, field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ConfigError(f"records cannot be read with this schema: field {field.name!r} "
                                      f"({type_name(column.type)} -> {type_name(field.type)}): "
                                      f"{str(exc).splitlines()[0]}") from None
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=self.reader)


def projection(written: pa.Schema, reader: pa.Schema, written_version: int = 0,
               reader_version: int = 0) -> Projection | None:
    """The projection of records written with `written` onto `reader` (None: nothing to do);
    ConfigError when a field `reader` requires is neither written nor defaulted."""
    if _same(written, reader):
        return None
    by_id = {field_id_of(field): index for index, field in enumerate(written)}
    sources: list[int | None] = []
    casts = []
    for field in reader:
        index = by_id.get(field_id_of(field))
        if index is None and not field.nullable and not has_default(field):
            raise ConfigError(f"records of schema version {written_version or 1} lack field {field.name!r}, which "
                              f"version {reader_version} requires without a default: read them with a later version")
        sources.append(index)
        casts.append(index is not None and not written.field(index).type.equals(field.type))
    return Projection(reader, tuple(sources), tuple(casts))


__all__ = ["COMPATIBILITY_MODES", "FIELD_ID_KEY", "Projection", "assign_ids", "check_compatible", "evolve",
           "first_schema", "parse_spec", "projection", "read_problem", "schema_at", "schema_version", "spec_text",
           "type_problem", "versions_of", "without_field_ids"]
