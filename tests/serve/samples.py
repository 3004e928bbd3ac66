"""Test helpers: kafka-python messages with a distinct value in every field of a version, framed
the way a client sends them."""

from __future__ import annotations

import itertools
from typing import Any

_counter = itertools.count(1)


def sample_message(cls: Any, version: int) -> Any:
    """An instance of kafka-python message class `cls` at `version`, every untagged field of that
    version set (struct arrays to two elements), so a decode that drops or shifts a field shows."""
    values = {}
    for field in cls.fields.values():
        if field.for_version_q(version) and not field.tagged_field_q(version):
            values[field.name] = _sample(field, version)
    return cls(version=version, **values)


def _sample(field: Any, version: int) -> Any:
    if field.is_struct_array():
        return [sample_message(field.data_class, version) for _ in range(2)]
    if field.is_struct():
        return sample_message(field.data_class, version)
    if field.is_array():
        return [_simple(field.type_str[2:]) for _ in range(2)]
    return _simple(field.type_str)


def _simple(type_name: str) -> Any:
    n = next(_counter)
    return {"int8": n % 100, "int16": n % 30000, "uint16": n % 60000, "int32": n * 1000,
            "int64": n * 10**10, "bool": True, "string": f"s{n}", "bytes": b"b%d" % n,
            "records": b"r%d" % n, "uuid": None, "float64": 1.5, "bitfield": {1, 3}}[type_name]


def framed_request(message: Any, correlation_id: int, client_id: str | None = "sample-client") -> bytes:
    """`message` as a client puts it on the wire: size, request header, body."""
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))
