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

    .venv/bin/python tools/bench_codec.py
    .venv/bin/python tools/bench_codec.py --records 200000 --batch-sizes 1000,5000
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from dlog.segments.codec import HEADER_BYTES, RecordSetCodec, default_schema, records_to_batch

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

    def line(self, records: int) -> str:
        return (
            f"{self.mode:<13} batch={self.batch_records:<6d} encode={records / self.encode_seconds:>12,.0f} rec/s "
            f"decode={records / self.decode_seconds:>12,.0f} rec/s  ratio={self.ipc_bytes / self.entry_bytes:5.2f}  "
            f"bytes/record={self.entry_bytes / records:6.1f}"
        )


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
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch-sizes", default="1000,5000,20000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    arguments = parser.parse_args()
    records = arguments.records

    started = time.perf_counter()
    values, keys, timestamps_ms = make_records(records, arguments.seed)
    generate_seconds = time.perf_counter() - started
    started = time.perf_counter()
    whole = records_to_batch(values, keys, timestamps_ms)
    build_seconds = time.perf_counter() - started
    value_bytes = sum(map(len, values))
    print(f"{records:,} records, mean value {value_bytes / records:.1f} bytes, e.g. {values[0].decode()}")
    print(f"(generating them in Python: {generate_seconds:.1f}s; records_to_batch on the lists: "
          f"{records / build_seconds:,.0f} rec/s)")
    schema = default_schema()
    for batch_records in (int(size) for size in arguments.batch_sizes.split(",")):
        batches = [whole.slice(start, batch_records) for start in range(0, records, batch_records)]
        results = [
            bench_codec("zstd-1", RecordSetCodec(schema, compression_level=1), batches, arguments.repeat),
            bench_codec("zstd-3", RecordSetCodec(schema, compression_level=3), batches, arguments.repeat),
            bench_codec("none", RecordSetCodec(schema, compress=False), batches, arguments.repeat),
            bench_arrow("arrow-zstd-1", 1, schema, batches, arguments.repeat),
            bench_arrow("arrow-zstd-3", 3, schema, batches, arguments.repeat),
        ]
        for result in results:
            print(result.line(records))
        decoded = [RecordSetCodec(schema).decode(RecordSetCodec(schema).encode(batch, 0))[1] for batch in batches]
        validate_seconds = best_seconds(lambda: [batch.validate(full=True) for batch in decoded], arguments.repeat)
        print(f"{'':13} of which validate(full=True): {1e3 * validate_seconds:.1f} ms for all {records:,} records")
        print()


if __name__ == "__main__":
    main()
