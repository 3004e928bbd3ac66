"""`dlog bench compare`: the same writes and catch-up reads on dlog and on its peers, Redis Streams
(Debian's redis-server, `appendonly yes`, `appendfsync always`) and NATS JetStream (`dlog_tools.bench.nats`:
`sync_interval: always`, one server and a cluster of three with R3), as ratios dlog / peer."""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bookkeeper.clock import monotonic_s, perf_s
from bookkeeper.errors import DlogError, known
from dlog_tools.bench.common import (
    DLOG_DURABILITY,
    DLOG_NO_FSYNC,
    event_values,
    mb_per_s,
    percentiles,
    ratio,
    run_streams,
    stored_totals,
)
from dlog_tools.bench.streams import offer_run, read_run, sequential_run
from dlog_tools.cluster import LocalCluster, die_with_parent, free_port

ENSURE_REDIS = "scripts/ensure-redis.sh"
REDIS_READ_COUNT = 10_000  # entries per XREAD, as dlog reads ranges of entries
REDIS_READ_REQUESTS_MIN = 100  # repeats of the C client's XRANGE, so that even a small run is timed


def _check_redis() -> str:
    """The redis-server path; refuses clearly when the server or the client package is missing."""
    server = shutil.which("redis-server")
    try:
        import redis  # noqa: F401
    except ImportError:
        raise DlogError("dlog bench compare needs the Python package redis in this environment: install the "
                        f"bench extra with pip install 'dlog[bench]' (or run {ENSURE_REDIS}, which also "
                        "installs redis-server)") from None
    if server is None:
        raise DlogError(f"dlog bench compare needs Debian's redis-server on PATH: run {ENSURE_REDIS}")
    return server


@contextmanager
def redis_server(server: str, directory: Path, fsync: bool) -> Iterator[int]:
    """Our own redis-server on a free loopback port, AOF with fsync on every write (or never);
    stopped by its pid at the end. Yields the port."""
    import redis

    port = free_port()
    log_path = directory / "redis.log"
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--appendonly", "yes",
         "--appendfsync", "always" if fsync else "no", "--save", "", "--dir", str(directory),
         "--daemonize", "no", "--logfile", str(log_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent)
    try:
        deadline = monotonic_s() + 15
        client = redis.Redis(host="127.0.0.1", port=port)
        while True:
            if process.poll() is not None:
                log = log_path.read_text()[-2000:] if log_path.exists() else ""
                raise DlogError(f"redis-server exited with status {process.returncode}: {log}")
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if monotonic_s() > deadline:
                    raise DlogError(f"redis-server did not answer on port {port} within 15 s") from None
                time.sleep(0.05)
        client.close()
        yield port
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _redis_py_label() -> str:
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    return f"redis-py {redis.__version__}" + (" + hiredis" if HIREDIS_AVAILABLE else " (no hiredis)")


async def _redis_runs(port: int, directory: Path, values: list[bytes], batch_records: int,
                      in_flight: int) -> list[dict[str, Any]]:
    """XADD pipelines of `batch_records`, `in_flight` at once over as many connections, then
    XREAD catch-up from the start, with the ordinary Python client."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port, max_connections=in_flight + 1)
    semaphore = asyncio.Semaphore(in_flight)

    async def pipeline(chunk: list[bytes]) -> None:
        async with semaphore:
            pipe = client.pipeline(transaction=False)
            for value in chunk:
                pipe.xadd("events", {b"v": value})
            await pipe.execute()

    raw_bytes = sum(map(len, values))
    started = perf_s()
    await asyncio.gather(*(pipeline(values[start: start + batch_records])
                           for start in range(0, len(values), batch_records)))
    write_s = perf_s() - started
    stored_records = await client.xlen("events")
    memory_bytes = known(await client.memory_usage("events", samples=0), "redis holds the stream just written")
    # Redis 7 keeps a multi-part AOF: a base file (RDB after an automatic rewrite) plus increments
    aof_bytes = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file()
                    and path.name != "redis.log")

    started = perf_s()
    last_id, read, read_bytes = b"0-0", 0, 0
    pages: list[list[Any]] = []
    while read < stored_records:
        answer: Any = await client.xread({"events": last_id}, count=REDIS_READ_COUNT)  # [[name, [(id, fields)]]]
        if not answer:
            raise DlogError(f"redis XREAD returned nothing after {read} of {stored_records} entries")
        entries = answer[0][1]
        pages.append(entries)
        read += len(entries)
        read_bytes += sum(len(fields[b"v"]) for _, fields in entries)
        last_id = entries[-1][0]
    read_s = perf_s() - started
    await client.aclose()
    # pipelines run concurrently, so their chunks may land in any order: compare as multisets
    read_values = sorted(fields[b"v"] for entries in pages for _, fields in entries)
    if read_values != sorted(values):
        raise DlogError(f"redis read back other values than were written ({len(read_values)} read, "
                        f"{len(values)} written)")
    client_label = _redis_py_label()
    return [{"system": "redis", "client": client_label, "run": "write", "records": len(values),
             "stored_records": stored_records, "records_per_s": round(len(values) / write_s),
             "mb_per_s": mb_per_s(raw_bytes, write_s), "stored_as": "AOF files on disk",
             "stored_mb": round(aof_bytes / 1e6, 1), "compression_ratio": ratio(raw_bytes, aof_bytes),
             "memory_mb": round(memory_bytes / 1e6, 1)},
            {"system": "redis", "client": client_label, "run": "read", "records": read,
             "records_per_s": round(read / read_s), "mb_per_s": mb_per_s(read_bytes, read_s),
             "as": f"XREAD COUNT {REDIS_READ_COUNT}"}]


async def _redis_sequential(port: int, values: list[bytes]) -> dict[str, Any]:
    """One XADD at a time, each awaited before the next (a producer that needs each reply)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port)
    latencies = []
    started = perf_s()
    for value in values:
        sent = perf_s()
        await client.xadd("sequential", {b"v": value})
        latencies.append(perf_s() - sent)
    elapsed_s = perf_s() - started
    await client.aclose()
    return {"system": "redis", "client": _redis_py_label(), "run": "sequential write",
            "records": len(values), "records_per_s": round(len(values) / elapsed_s),
            **percentiles(latencies)}


def _redis_benchmark(tool: str, port: int, arguments: list[str]) -> float | None:
    """Requests per second that redis-benchmark reports (its --csv line for the one test); None when
    the run was too short to time (it then reports an infinite rate)."""
    result = subprocess.run([tool, "-h", "127.0.0.1", "-p", str(port), "--csv", *arguments],
                            capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line and not line.startswith('"test"')]
    if result.returncode != 0 or not lines:
        raise DlogError(f"redis-benchmark failed ({result.returncode}): {result.stderr[-500:]}")
    # the test name echoes the command, quotes and commas included: count the 7 figures from the end
    rate = float(lines[-1].rstrip('"').split('","')[-7])
    return rate if math.isfinite(rate) and rate > 0 else None


def _redis_c_client_runs(port: int, value: bytes, records: int, batch_records: int,
                         in_flight: int) -> list[dict[str, Any]]:
    """The server's ceiling with Redis's own C client: the same pipeline depth and concurrency,
    one value repeated (Redis stores values as they are, so their content does not matter to it);
    reads repeat XRANGE of the first REDIS_READ_COUNT entries."""
    tool = shutil.which("redis-benchmark")
    if tool is None:
        return []
    write_per_s = _redis_benchmark(tool, port, ["-P", str(batch_records), "-c", str(in_flight),
                                                "-n", str(records), "XADD", "events-c", "*", "v", value.decode()])
    # the same XRANGE repeated: enough repeats to be timed, however few records were written
    requests = max(REDIS_READ_REQUESTS_MIN, records // REDIS_READ_COUNT)
    per_request = min(records, REDIS_READ_COUNT)
    read_per_s = _redis_benchmark(tool, port, ["-P", "1", "-c", "1", "-n", str(requests),
                                               "XRANGE", "events-c", "-", "+", "COUNT", str(REDIS_READ_COUNT)])
    client = "redis-benchmark (C)"
    return [{"system": "redis", "client": client, "run": "write", "records": records,
             **_rates(write_per_s, 1, len(value))},
            {"system": "redis", "client": client, "run": "read", "records": requests * per_request,
             **_rates(read_per_s, per_request, len(value)), "as": f"XRANGE - + COUNT {REDIS_READ_COUNT}, repeated"}]


def _rates(requests_per_s: float | None, records_per_request: int, value_bytes: int) -> dict[str, Any]:
    """records/s and MB/s, or None for both (with a note) when redis-benchmark could not time the run."""
    if requests_per_s is None:
        return {"records_per_s": None, "mb_per_s": None, "note": "too short to time: use more --records"}
    records_per_s = requests_per_s * records_per_request
    return {"records_per_s": round(records_per_s), "mb_per_s": round(records_per_s * value_bytes / 1e6, 1)}


async def _dlog_compare_runs(ns: Any, values: list[bytes], batch_records: int,
                             in_flight: int) -> list[dict[str, Any]]:
    """write_batch of the same values in the same chunks (a list of values per call, so building
    the Arrow batch is timed as Redis's command encoding is), then a catch-up read."""
    await ns.create_stream("compare")
    async with ns.open_writer("compare") as writer:
        started = perf_s()
        pending: list[asyncio.Future[Any]] = []
        for start in range(0, len(values), batch_records):
            pending.append(asyncio.ensure_future(writer.write_batch(values[start: start + batch_records])))
            if len(pending) >= in_flight:
                await pending.pop(0)
        await asyncio.gather(*pending)
        write_s = perf_s() - started
    raw_bytes = sum(map(len, values))
    stored = await stored_totals(ns, "compare")
    read = await read_run(ns, "compare")
    client = "dlog (Python)"
    return [{"system": "dlog", "client": client, "run": "write", "records": len(values),
             "stored_records": stored["records"], "records_per_s": round(len(values) / write_s),
             "mb_per_s": mb_per_s(raw_bytes, write_s), "stored_as": "zstd Arrow entries (each copy)",
             "stored_mb": round(stored["bytes"] / 1e6, 1), "compression_ratio": ratio(raw_bytes, stored["bytes"])},
            {"system": "dlog", "client": client, "run": "read", "records": read["records"],
             "records_per_s": read["records_per_s"], "mb_per_s": read["mb_per_s"], "as": "arrow batches"}]


def _ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """dlog/peer records per second for each run, against each peer and client measured; dlog's
    per-record writes (offer) are set against the peers' pipelined (asynchronous) writes."""
    dlog = {run["run"]: run for run in runs if run["system"] == "dlog"}
    peers = [run for run in runs if run["system"] != "dlog"]
    pairs = [(run["run"], run) for run in peers if run["run"] in dlog]
    pairs += [("per-record write (offer)", run) for run in peers
              if run["run"] == "write" and "per-record write (offer)" in dlog]
    return [{"run": name, "peer": run["system"], "peer_run": run["run"],
             "peer_client": run["client"], "dlog_records_per_s": dlog[name]["records_per_s"],
             "peer_records_per_s": run["records_per_s"],
             "dlog_over_peer": None if run["records_per_s"] is None
             else round(dlog[name]["records_per_s"] / max(run["records_per_s"], 1), 2)}
            for name, run in pairs]


def bench_compare(records: int = 1_000_000, batch_records: int = 1000, in_flight: int = 8,
                  fsync: bool = True, sequential_records: int = 2000,
                  peers: tuple[str, ...] = ("redis", "nats")) -> dict[str, Any]:
    """The same write and catch-up read workload on dlog and on each peer (Redis Streams, NATS
    JetStream), one after the other on this machine; figures side by side and as ratios dlog/peer."""
    from dlog_tools.bench.nats import check_nats, nats_description, nats_runs

    server = _check_redis() if "redis" in peers else None
    if "nats" in peers:
        check_nats()  # before anything runs: a missing peer is one line, not a failure at the end
    values = event_values(records)

    sequential = values[:sequential_records]

    async def dlog_side(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        runs = await _dlog_compare_runs(ns, values, batch_records, in_flight)
        offered = await offer_run(ns, "compare-offered", values)
        runs.append({"system": "dlog", "client": "dlog (Python)", "run": "per-record write (offer)",
                     **{key: offered[key] for key in ("records", "records_per_s", "mb_per_s",
                                                      "compression_ratio")}})
        if sequential:  # the same run as `dlog bench write`'s, named as the others here
            run = await sequential_run(ns, "sequential", sequential)
            runs.append({"system": "dlog", "client": "dlog (Python)", **run, "run": "sequential write"})
        return runs

    runs = run_streams(fsync, dlog_side)
    described: dict[str, str] = {}
    if server is not None:
        with tempfile.TemporaryDirectory(prefix="dlog-bench-redis-") as scratch, \
                redis_server(server, Path(scratch), fsync) as port:
            runs += asyncio.run(_redis_runs(port, Path(scratch), values, batch_records, in_flight))
            if sequential:
                runs.append(asyncio.run(_redis_sequential(port, sequential)))
            runs += _redis_c_client_runs(port, values[0], records, batch_records, in_flight)
        described["redis"] = ("redis-server, appendonly yes, appendfsync " + ("always" if fsync else "no (NOT durable)")
                              + ", single node, no replication; XADD pipelines, XREAD catch-up")
    if "nats" in peers:
        with tempfile.TemporaryDirectory(prefix="dlog-bench-nats-") as scratch:
            runs += nats_runs(values, batch_records, in_flight, sequential, fsync, Path(scratch))
        described["nats"] = nats_description(fsync)
    return {"mode": "compare", "fsync": fsync, "record_bytes": 100, "batch_records": batch_records,
            "in_flight": in_flight,
            "dlog": DLOG_DURABILITY if fsync else DLOG_NO_FSYNC, **described,
            "runs": runs, "ratios": _ratios(runs)}
