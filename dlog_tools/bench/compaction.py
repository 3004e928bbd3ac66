"""`dlog bench compaction`: key compaction on a local cluster. Writes `records` records of 100
bytes (E3/Qw2/Qa2) over `keys` keys (each record's key drawn at random) across `segments`
segments (all completed), then in the same run: rebuilds the table (latest value per key) by
replaying the whole stream (`read_batch` until None), compacts it (`Compactor.run`: its rate in
records read per second), and rebuilds the table again from the compacted view
(`open_reader(compacted=True)`), checking both tables are the same."""

from __future__ import annotations

import math
import random
from typing import Any

from bookkeeper.clock import perf_s
from bookkeeper.errors import ConfigError
from dlog.compaction import Compactor
from dlog.segments.codec import records_to_batch
from dlog_tools.bench.common import CpuMeter, event_values, mb_per_s, run_streams, stream_header
from dlog_tools.cluster import LocalCluster

STREAM = "compaction"
READ_BATCH_RECORDS = 65536


async def _write(ns: Any, values: list[bytes], keys: list[bytes], segments: int, batch_records: int) -> dict[str, Any]:
    per_segment = math.ceil(len(values) / segments)
    await ns.create_stream(STREAM)
    started = perf_s()
    for first in range(0, len(values), per_segment):  # one writer per segment: its close seals it
        async with ns.open_writer(STREAM) as writer:
            for start in range(first, min(first + per_segment, len(values)), batch_records):
                end = min(start + batch_records, first + per_segment)
                await writer.write_batch(records_to_batch(values[start:end], keys[start:end]))
    elapsed_s = perf_s() - started
    return {"run": "write_batch (setup)", "records": len(values), "seconds": round(elapsed_s, 2),
            "records_per_s": round(len(values) / elapsed_s), "mb_per_s": mb_per_s(sum(map(len, values)), elapsed_s)}


async def _table(ns: Any, cluster: LocalCluster, run: str, compacted: bool) -> tuple[dict[str, Any], dict[Any, Any]]:
    """The latest value per key, read as an application rebuilding a table would."""
    meter = CpuMeter(cluster).start()
    table: dict[Any, Any] = {}
    records = 0
    async with ns.open_reader(STREAM, "earliest", follow=False, compacted=compacted) as reader:
        started = perf_s()
        while (batch := await reader.read_batch(READ_BATCH_RECORDS)) is not None:
            records += batch.num_rows
            table.update(zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=True))
        elapsed_s = perf_s() - started
    return {"run": run, "records": records, "keys": len(table), "seconds": round(elapsed_s, 2),
            "records_per_s": round(records / elapsed_s), **meter.per_op(records)}, table


async def _compact(ns: Any, cluster: LocalCluster) -> dict[str, Any]:
    meter = CpuMeter(cluster).start()
    started = perf_s()
    report = await Compactor(ns).run(STREAM)
    elapsed_s = perf_s() - started
    if report.ledger_id is None:
        raise ConfigError(f"the compaction did nothing: {report.skipped}")
    return {"run": "compact", "records": report.records_read, "keys": report.keys, "kept": report.records_kept,
            "segments": len(report.segments), "seconds": round(elapsed_s, 2),
            "records_per_s": round(report.records_read / elapsed_s), **meter.per_op(report.records_read)}


def bench_compaction(records: int = 1_000_000, keys: int = 100_000, segments: int = 4, batch_records: int = 10_000,
                     *, fsync: bool = True) -> dict[str, Any]:
    if keys > records:
        raise ConfigError(f"--keys {keys} is more than --records {records}: every key needs a record")
    values = event_values(records)
    rng = random.Random(25)
    drawn = [b"key-%08d" % index for index in range(keys)]  # every key at least once, then at random
    drawn += [b"key-%08d" % rng.randrange(keys) for _ in range(records - keys)]
    rng.shuffle(drawn)

    async def runs(ns: Any, cluster: LocalCluster) -> list[dict[str, Any]]:
        done = [await _write(ns, values, drawn, segments, batch_records)]
        replay, replayed = await _table(ns, cluster, "table by replaying the stream", compacted=False)
        done += [replay, await _compact(ns, cluster)]
        read, compacted = await _table(ns, cluster, "table from the compacted view", compacted=True)
        if compacted != replayed:
            raise ConfigError("the compacted view's table differs from the replayed one")
        done.append({**read, "vs_replay": round(replay["seconds"] / max(read["seconds"], 1e-3), 1)})
        return done

    return {**stream_header("compaction", fsync), "record_bytes": 100, "keys": keys,
            "runs": run_streams(fsync, runs)}



