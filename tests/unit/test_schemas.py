"""Schema evolution rules (dlog.segments.schemas): the spec forms, field ids, each allowed and each
refused change under each compatibility mode, and the projection of earlier records."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from bookkeeper.errors import ConfigError
from dlog.segments.codec import schema_to_text
from dlog.segments.metadata import Segment, StreamConfig
from dlog.segments.schemas import (
    assign_ids,
    evolve,
    field_id_of,
    first_schema,
    parse_spec,
    parse_type,
    projection,
    schema_at,
    schema_version,
    spec_text,
    versions_of,
)


def typed(spec: str, compatibility: str = "BACKWARD") -> StreamConfig:
    return StreamConfig("s", schema=schema_to_text(first_schema(spec)), schema_compatibility=compatibility)


def ids(schema: pa.Schema) -> dict[str, int | None]:
    return {field.name: field_id_of(field) for field in schema}


# ------------------------------------------------------------------ spec forms


def test_the_text_form_gives_types_nullability_ids_and_defaults():
    schema = parse_spec("id:int32, name#7:string, score:float64?, price:decimal(10,2), at:timestamp[us]?, "
                        "tags:list<string>?, n:int64=5, label:string?=\"a,b\"")
    assert [(f.name, f.type, f.nullable) for f in schema] == [
        ("id", pa.int32(), False), ("name", pa.string(), False), ("score", pa.float64(), True),
        ("price", pa.decimal128(10, 2), False), ("at", pa.timestamp("us"), True),
        ("tags", pa.list_(pa.string()), True), ("n", pa.int64(), False), ("label", pa.string(), True)]
    assert ids(schema)["name"] == 7 and ids(schema)["id"] is None
    numbered = first_schema(schema)
    assert ids(numbered) == {"id": 8, "name": 7, "score": 9, "price": 10, "at": 11, "tags": 12, "n": 13, "label": 14}
    assert parse_spec(spec_text(numbered)).equals(numbered, check_metadata=True)  # the text form round-trips


def test_the_json_form_equals_the_text_form():
    text = first_schema("id:int32, score:float64?, n:int64=3")
    document = {"fields": [{"name": "id", "type": "int32"}, {"name": "score", "type": "float64", "nullable": True},
                           {"name": "n", "type": "int64", "default": 3}]}
    assert first_schema(json.dumps(document)).equals(text, check_metadata=True)
    assert first_schema(json.dumps(document["fields"])).equals(text, check_metadata=True)


@pytest.mark.parametrize(("spec", "says"), [
    ("", "empty schema spec"),
    ("id int32", "bad schema field"),
    ("id:int33", "unknown type 'int33'"),
    ("id:int32, id:string", "appears twice"),
    ("a#1:int32, b#1:int32", "same id 1"),
    ("1a:int32", "bad field name"),
    ("n:int32=x", "not a JSON literal"),
    ("n:int32=\"text\"", "is not a int32"),
    ("n:int32=null", "needs a nullable field"),
    ("d:decimal(50,2)", "precision is 1..38"),
    ("[1]", "needs a text 'name' and 'type'"),
    ('[{"name": "a", "type": "int32", "size": 3}]', "unknown keys size"),
    ("{", "not valid JSON"),
])
def test_a_bad_spec_is_one_clear_error(spec, says):
    with pytest.raises(ConfigError, match=says):
        parse_spec(spec)


def test_type_names():
    assert parse_type("float32") == pa.float32() and parse_type("timestamp") == pa.timestamp("ms")
    assert parse_type("list<decimal(5, 1)>") == pa.list_(pa.decimal128(5, 1))


def test_ids_follow_names_and_a_dropped_id_is_never_reused():
    v1 = first_schema("id:int32, name:string, old:string?")
    v2 = assign_ids(parse_spec("id:int32, name:string, extra:int64?"), [v1])  # `old` (id 3) dropped
    assert ids(v2) == {"id": 1, "name": 2, "extra": 4}
    v3 = assign_ids(parse_spec("id:int32, full_name#2:string, more:int8?"), [v1, v2])
    assert ids(v3) == {"id": 1, "full_name": 2, "more": 5}


def test_a_schema_stored_before_ids_gets_ids_by_position():
    config = StreamConfig("s", schema=schema_to_text(pa.schema([("a", pa.int32()), ("b", pa.string())])))
    assert ids(versions_of(config)[0]) == {"a": 1, "b": 2}
    assert schema_version(config) == 1 and schema_at(config, 0) is schema_at(config, 1)
    assert schema_version(StreamConfig("u")) == 0


# ------------------------------------------------------------------ allowed changes


@pytest.mark.parametrize(("v1", "v2"), [
    ("id:int32", "id:int32, note:string?"),                      # add a nullable field
    ("id:int32", "id:int32, n:int64=0"),                         # add a required field with a default
    ("id:int32, note:string?", "id:int32"),                      # drop a nullable field
    ("id:int32, name:string", "id:int32, full_name#2:string"),  # rename (id kept)
    ("id:int32", "id:int64"),                                    # widen int32 -> int64
    ("x:float32", "x:float64"),                                  # widen float32 -> float64
    ("d:decimal(10,2)", "d:decimal(12,2)"),                      # decimal precision increase
    ("id:int32", "id:int32?"),                                   # required -> nullable
])
def test_backward_allows(v1, v2):
    config = evolve(typed(v1), v2)
    assert schema_version(config) == 2 and len(config.schema_history) == 1


@pytest.mark.parametrize(("v1", "v2"), [
    ("id:int32", "id:int32, note:string?"),
    ("id:int32, note:string?", "id:int32"),
    ("id:int32, name:string", "id:int32, full_name#2:string"),
])
def test_full_allows(v1, v2):
    assert schema_version(evolve(typed(v1, "FULL"), v2)) == 2


def test_none_allows_anything_and_an_unchanged_schema_is_no_new_version():
    assert schema_version(evolve(typed("id:int32", "NONE"), "id:string")) == 2
    same = evolve(typed("id:int32"), "id:int32")
    assert schema_version(same) == 1
    assert schema_version(evolve(typed("id:int32"), "id:string", compatibility="none")) == 2


# ------------------------------------------------------------------ refused changes


@pytest.mark.parametrize(("mode", "v1", "v2", "says"), [
    ("BACKWARD", "id:int32", "id:float64", "field 'id' (id 1): int32 -> float64 is lossy: integers and floats"),
    ("BACKWARD", "x:float64", "x:int64", "field 'x' (id 1): float64 -> int64 is lossy"),
    ("BACKWARD", "id:int64", "id:int32", "field 'id' (id 1): int64 -> int32 narrows"),
    ("BACKWARD", "x:float64", "x:float32", "float64 -> float32 narrows"),
    ("BACKWARD", "d:decimal(12,2)", "d:decimal(10,2)", "decimal(12,2) -> decimal(10,2) narrows"),
    ("BACKWARD", "d:decimal(10,2)", "d:decimal(12,3)", "changes the scale"),
    ("BACKWARD", "id:int32", "id:string", "int32 -> string changes the type"),
    ("BACKWARD", "id:int32?", "id:int32", "nullable -> required (rule: earlier records may hold nulls)"),
    ("BACKWARD", "id:int32", "id:int32, n:int64", "field 'n' (id 2) is new and required without a default"),
    ("FORWARD", "id:int32, name:string", "id:int32", "field 'name' (id 2) is required and the new schema drops"),
    ("FORWARD", "id:int32", "id:int64", "(FORWARD|int32 -> int64 narrows"),
    ("FULL", "id:int32", "id:int64", "(FORWARD|narrows"),
    ("FULL", "id:int32", "id:int32, n:int64", "(BACKWARD|is new and required"),
])
def test_refused_with_the_rule_naming_the_field(mode, v1, v2, says):
    config = typed(v1, mode)
    with pytest.raises(ConfigError) as refused:
        evolve(config, v2)
    message = str(refused.value)
    assert all(part in message for part in says.split("|")), message
    assert "\n" not in message and "nothing was changed" in message and "(rule: " in message


def test_checks_are_transitive_against_every_earlier_version():
    config = evolve(typed("id:int32, note:string?"), "id:int32")  # v2 drops the nullable `note`
    # v3 re-adds id 2 as an int: v2 never had it, v1 had it as a string
    with pytest.raises(ConfigError, match="version 1.*field 'note' \\(id 2\\): string -> int64 changes the type"):
        evolve(config, "id:int32, note#2:int64?")


def test_an_untyped_stream_cannot_evolve():
    with pytest.raises(ConfigError, match="untyped"):
        evolve(StreamConfig("u"), "id:int32")


def test_versions_are_bounded():
    config = typed("id:int32")
    for number in range(2, 101):
        config = evolve(config, f"id:int32, f{number}:int32?")
    assert schema_version(config) == 100
    with pytest.raises(ConfigError, match="has 100 schema versions, the most one stream keeps"):
        evolve(config, "id:int32, last:int8?")
    assert len(config.to_bytes()) < 200_000  # far below ZooKeeper's 1 MB node


def test_bad_mode_and_bad_version():
    with pytest.raises(ConfigError, match="bad schema compatibility"):
        evolve(typed("id:int32"), "id:int64", compatibility="SIDEWAYS")
    with pytest.raises(ConfigError, match="versions 1..1; there is no schema version 2"):
        schema_at(typed("id:int32"), 2)


def test_config_and_segment_round_trip_their_schema_fields():
    config = evolve(typed("id:int32", "FULL"), "id:int32, x:string?")
    assert StreamConfig.from_bytes(config.to_bytes()) == config
    segment = Segment(1, 5, schema_version=2)
    assert Segment.from_bytes(segment.to_bytes()).schema_version == 2
    old = json.loads(segment.to_bytes())
    del old["schema_version"]
    assert Segment.from_bytes(json.dumps(old).encode()).schema_version == 0


# ------------------------------------------------------------------ projection


def test_earlier_records_project_by_field_id():
    config = evolve(typed("id:int32, name:string, note:string?"), "id:int32, full_name#2:string, note:string?, "
                    "score:float64?, n:int64=7")
    config = evolve(config, "id:int64, full_name:string, score:float64?, n:int64=7")
    v1, v2, v3 = versions_of(config)
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"],
                                        "note": ["x", None]}, schema=v1)
    projected = projection(v1, v3, 1, 3).apply(batch)
    assert projected.schema.equals(v3, check_metadata=True)
    assert projected.to_pydict() == {"id": [1, 2], "full_name": ["a", "b"], "score": [None, None], "n": [7, 7]}
    assert projection(v3, v3) is None
    # read with an earlier version: the dropped `note` is null, the new fields are left out
    later = pa.RecordBatch.from_pydict({"id": pa.array([3], pa.int64()), "full_name": ["c"], "score": [0.5],
                                        "n": pa.array([1], pa.int64())}, schema=v3)
    assert projection(v3, v2, 3, 2).apply(later).to_pydict() == {
        "id": [3], "full_name": ["c"], "note": [None], "score": [0.5], "n": [1]}


def test_a_value_that_does_not_fit_an_earlier_type_is_one_clear_error():
    config = evolve(typed("id:int32"), "id:int64")
    v1, v2 = versions_of(config)
    big = pa.RecordBatch.from_pydict({"id": pa.array([2**40], pa.int64())}, schema=v2)
    with pytest.raises(ConfigError, match="field 'id' \\(int64 -> int32\\): .*"):
        projection(v2, v1, 2, 1).apply(big)


def test_a_required_field_records_lack_cannot_be_projected():
    config = evolve(typed("id:int32, name:string"), "id:int32")
    v1, v2 = versions_of(config)
    with pytest.raises(ConfigError, match="version 2 lack field 'name'"):
        projection(v2, v1, 2, 1)
