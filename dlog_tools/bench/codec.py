"""Record-set codec throughput: encode and decode N realistic records in batches of several sizes.

Values are ~100-byte JSON-like events (user, event, sku, price, country, session, ts) drawn from
a seeded generator, keys are user ids, timestamps rise with jitter. For each batch size it prints
records/s for encode and decode and the compression ratio (Arrow IPC bytes / entry bytes) of:

    zstd-1, zstd-3   this codec: the IPC message in ONE zstd frame (the stream default is level 3)
    none             this codec without compression
    arrow-zstd-1/3   Arrow's own IPC compression (one zstd frame per buffer), single-threaded,
                     counted with the same 40-byte header so the sizes compare

Decode includes `validate(full=True)`, which this codec always runs; its share is printed apart.
Single process, single thread; a number is the best of --repeat runs.

    dlog bench codec
    dlog bench codec --records 200000 --batch-records 1000 --batch-records 5000
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from bookkeeper.clock import perf_s
from dlog.segments.codec import (
    HEADER_BYTES,
    RecordSetCodec,
    default_schema,
    records_to_batch,
)

EVENTS = ("page_view", "add_to_cart", "checkout", "search", "login", "logout", "purchase", "review")
COUNTRIES = ("DE", "FR", "US", "GB", "NL", "SE", "PL", "ES", "IT", "JP", "BR", "IN", "CA", "AU")


@dataclass(frozen=True, slots=True)
class Result:
    mode: str
    batch_records: int
    encode_seconds: float
    decode_seconds: float
    ipc_bytes: int
    entry_bytes: int



def make_records(count: int, seed: int) -> tuple[list[bytes], list[bytes], list[int]]:
    rng = random.Random(seed)
    values, keys, timestamps_ms = [], [], []
    now_ms = 1_750_000_000_000
    for index in range(count):
        user = f"u{rng.randrange(1_000_000):06d}"
        now_ms += rng.randrange(0, 3)
        event = {
            "user": user,
            "event": rng.choice(EVENTS),
            "sku": f"SKU-{rng.randrange(50_000):05d}",
            "price": round(rng.uniform(1, 500), 2),
            "country": rng.choice(COUNTRIES),
            "session": f"{rng.getrandbits(32):08x}",
            "seq": index,
        }
        values.append(json.dumps(event, separators=(",", ":")).encode())
        keys.append(user.encode())
        timestamps_ms.append(now_ms)
    return values, keys, timestamps_ms


def best_seconds(action: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = perf_s()
        action()
        best = min(best, perf_s() - started)
    return best


def bench_codec(mode: str, codec: RecordSetCodec, batches: list[pa.RecordBatch], repeat: int) -> Result:
    entries: list[bytes] = []

    def encode() -> None:
        entries[:] = [codec.encode(batch, 0) for batch in batches]

    def decode() -> None:
        for entry in entries:
            codec.decode(entry)

    encode_seconds = best_seconds(encode, repeat)
    decode_seconds = best_seconds(decode, repeat)
    ipc_bytes = sum(batch.serialize().size for batch in batches)
    return Result(mode, batches[0].num_rows, encode_seconds, decode_seconds, ipc_bytes, sum(map(len, entries)))


def bench_arrow(mode: str, level: int, schema: pa.Schema, batches: list[pa.RecordBatch], repeat: int) -> Result:
    options = ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=level), use_threads=False)
    stream: list[pa.Buffer] = []

    def encode() -> None:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, schema, options=options) as writer:
            for batch in batches:
                writer.write_batch(batch)
        stream[:] = [sink.getvalue()]

    def decode() -> None:
        reader = ipc.MessageReader.open_stream(stream[0])
        reader.read_next_message()  # the schema, which entries would not carry
        for message in reader:
            ipc.read_record_batch(message, schema).validate(full=True)

    encode_seconds = best_seconds(encode, repeat)
    decode_seconds = best_seconds(decode, repeat)
    schema_bytes = schema.serialize().size + 8  # the stream's schema message and end marker
    entry_bytes = stream[0].size - schema_bytes + HEADER_BYTES * len(batches)
    ipc_bytes = sum(batch.serialize().size for batch in batches)
    return Result(mode, batches[0].num_rows, encode_seconds, decode_seconds, ipc_bytes, entry_bytes)


def validate_all(batches: list[pa.RecordBatch]) -> None:
    for batch in batches:
        batch.validate(full=True)


def run_codec(records: int = 1_000_000, batch_sizes: tuple[int, ...] = (1000, 5000, 20_000),
              repeat: int = 3, seed: int = 7) -> dict[str, Any]:
    """Encode/decode records/s and compression ratio per batch size and codec variant."""
    started = perf_s()
    values, keys, timestamps_ms = make_records(records, seed)
    generate_s = perf_s() - started
    started = perf_s()
    whole = records_to_batch(values, keys, timestamps_ms)
    build_s = perf_s() - started
    value_bytes = sum(map(len, values))
    schema = default_schema()
    runs: list[dict[str, Any]] = []
    for batch_records in batch_sizes:
        batches = [whole.slice(start, batch_records) for start in range(0, records, batch_records)]
        results = [
            bench_codec("zstd-1", RecordSetCodec(schema, compression_level=1), batches, repeat),
            bench_codec("zstd-3", RecordSetCodec(schema, compression_level=3), batches, repeat),
            bench_codec("none", RecordSetCodec(schema, compress=False), batches, repeat),
            bench_arrow("arrow-zstd-1", 1, schema, batches, repeat),
            bench_arrow("arrow-zstd-3", 3, schema, batches, repeat),
        ]
        decoded = [RecordSetCodec(schema).decode(RecordSetCodec(schema).encode(batch, 0))[1] for batch in batches]
        validate_s = best_seconds(functools.partial(validate_all, decoded), repeat)
        runs += [{"codec": result.mode, "batch_records": result.batch_records,
                  "encode_records_per_s": round(records / result.encode_seconds),
                  "decode_records_per_s": round(records / result.decode_seconds),
                  "compression_ratio": round(result.ipc_bytes / result.entry_bytes, 2),
                  "bytes_per_record": round(result.entry_bytes / records, 1),
                  "validate_ms": round(1e3 * validate_s, 1)} for result in results]
    return {"mode": "codec", "records": records, "mean_value_bytes": round(value_bytes / records, 1),
            "generate_s": round(generate_s, 2), "records_to_batch_per_s": round(records / build_s),
            "runs": runs}
