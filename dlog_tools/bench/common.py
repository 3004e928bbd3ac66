"""What the bench modes share: local clusters, realistic values, percentiles, memory figures,
and the header every stream result carries. Measured, never asserted."""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bookkeeper.clock import process_s
from bookkeeper.errors import DlogError
from bookkeeper.runtime import tune_garbage_collector
from dlog_tools.bench.profile import Profiler
from dlog_tools.cluster import LocalCluster

PASSWORD = b"bench"
NAMESPACE = "bench"
DLOG_DURABILITY = "E3/Qw2/Qa2 on 3 bookie processes, fdatasync on each bookie, one disk"
DLOG_NO_FSYNC = "E3/Qw2/Qa2 on 3 bookie processes, NO fsync (not durable), one disk"


def event_payload(index: int, size: int) -> bytes:
    """A realistic record: a JSON-like event, padded or cut to `size` bytes (not all zeros)."""
    rng = random.Random(index)
    text = json.dumps({"ts": 1700000000000 + index, "user": f"u{rng.randrange(100000)}",
                       "action": rng.choice(["view", "click", "buy", "share"]),
                       "item": rng.randrange(10**6), "session": f"{rng.getrandbits(48):012x}"})
    while len(text) < size:
        text += " " + text
    return text[:size].encode()


def event_values(count: int, size: int = 100) -> list[bytes]:
    """`count` distinct realistic values: JSON-like events with random users, actions, items and
    session ids (what compresses is what real events share: field names, not whole records).
    The last 8 bytes are the value's index, so a reader can tell which write a value came from."""
    rng = random.Random(7)
    actions = [b"view", b"click", b"buy", b"share", b"search", b"scroll"]
    values = []
    for index in range(count):
        value = (b'{"ts":%d,"user":"u%06d","action":"%s","item":%d,"session":"%012x"}'
                 % (1700000000000 + index, rng.randrange(10**6), rng.choice(actions),
                    rng.randrange(10**7), rng.getrandbits(48)))
        values.append((value + b" " * size)[: size - 8] + b"%08d" % index)
    return values


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) another process has used so far, from /proc/<pid>/stat; 0 when
    it cannot be read (not Linux, or the process is gone: the figure leaves it out)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by this process and by the cluster's bookie processes between `start()` and
    `per_op(count)`: figures per operation that a busy machine does not move, where wall-clock rates
    move by 2x (the bookies' from /proc/<pid>/stat, user + system)."""

    def __init__(self, cluster: LocalCluster | None = None) -> None:
        self._pids = [bookie.pid for bookie in cluster.bookies if bookie.pid] if cluster else []
        self._client_s = 0.0
        self._bookies_s = 0.0

    def _bookie_cpu_s(self) -> float:
        return sum(process_cpu_s(pid) for pid in self._pids)

    def start(self) -> CpuMeter:
        self._client_s, self._bookies_s = process_s(), self._bookie_cpu_s()
        return self

    def per_op(self, count: int) -> dict[str, float]:
        """Microseconds of CPU per operation: this client's, and all bookies' together."""
        client_s = process_s() - self._client_s
        figures = {"client_cpu_us_per_op": round(client_s / max(count, 1) * 1e6, 2)}
        if self._pids:
            bookies_s = self._bookie_cpu_s() - self._bookies_s
            figures["bookies_cpu_us_per_op"] = round(bookies_s / max(count, 1) * 1e6, 2)
        return figures


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 3)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "p999_ms": at(0.999),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 3)}


@contextmanager
def local_cluster(bookies: int, bookie_args: list[str] | None = None,
                  secure: bool = False, profiler: Profiler | None = None) -> Iterator[LocalCluster]:
    """A cluster in a scratch directory; `secure`: TLS bookies requiring tokens, ZooKeeper ACLs,
    and the bench namespace provisioned (what `dlog standalone --secure` runs); `profiler`
    (--profile): the client and every bookie profiled while the cluster runs."""
    with tempfile.TemporaryDirectory(prefix="dlog-bench-") as directory:
        secure_dir = None
        if secure:
            from dlog_tools.secure import create

            secure_dir = create(Path(directory) / "secure")
        cluster = LocalCluster(directory, bookies=bookies, bookie_args=bookie_args, secure=secure_dir)
        cluster.start()
        try:
            if secure_dir is not None:
                from dlog_tools.secure import provision_namespace

                asyncio.run(provision_namespace(cluster.zk_address, secure_dir.admin_settings(), NAMESPACE))
            if profiler is not None:
                profiler.attach(cluster)
            try:
                yield cluster
            finally:
                if profiler is not None:
                    profiler.detach()
        finally:
            cluster.stop()


def client_security(cluster: LocalCluster, *, admin: bool = False) -> Any:
    """The bench client's security settings: none on an open cluster; on a secure one a producer
    and consumer of the bench namespace (or an admin, for ledgers of no namespace)."""
    from bookkeeper.security.settings import NO_SECURITY

    secure = cluster.secure
    if secure is None:
        return NO_SECURITY
    if admin:
        return secure.admin_settings()
    return secure.client_settings(NAMESPACE, [f"produce:{NAMESPACE}", f"consume:{NAMESPACE}"], subject="bench")


def bookie_args(fsync: bool) -> list[str]:
    return [] if fsync else ["--no-fsync"]


def stream_header(mode: str, fsync: bool, secure: bool = False) -> dict[str, Any]:
    return {"mode": mode, "fsync": fsync, "bookies": 3, "quorum": "E3/Qw2/Qa2",
            "durability": DLOG_DURABILITY if fsync else DLOG_NO_FSYNC,
            **({"security": "TLS + token auth + authorization + ZooKeeper ACLs"} if secure else {})}


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / max(denominator, 1), 2)


def mb_per_s(byte_count: int, elapsed_s: float) -> float:
    return round(byte_count / elapsed_s / 1e6, 1)


async def stored_totals(ns: Any, stream: str) -> dict[str, int]:
    """Records, entries and bytes of a stream's completed segments (close its writer first)."""
    listing = await ns.store.segments(stream)
    segments = [s for s in listing.segments if not s.is_in_progress]
    return {"records": sum(s.records for s in segments),
            "entries": sum(s.last_entry - s.first_entry + 1 for s in segments),
            "bytes": sum(s.bytes for s in segments), "segments": len(segments)}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) * 1024 / 1e6, 1)
    raise DlogError(f"/proc/self/status has no {field} line: the memory figures need Linux")


def rss_mb() -> float:
    """This process's resident set now (VmRSS), in MB."""
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """This process's largest resident set (VmHWM) since start or since `reset_peak_rss()`."""
    return _status_mb("VmHWM")


def reset_peak_rss() -> bool:
    """Start VmHWM afresh (Linux >= 4.0), so a peak says what came after, not imports at start;
    False where the kernel refuses (the peak then covers the whole process)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def run_streams(fsync: bool, action: Any, secure: bool = False, profiler: Profiler | None = None,
                bookie_probes: bool = False, **namespace_options: Any) -> Any:
    """Start a 3-bookie cluster, open the bench namespace (with `namespace_options`), and run
    `action(ns, cluster)` in it (`profiler`: see local_cluster; `bookie_probes`: the bookies run
    with --latency-probes). The bench
    process tunes its cycle collector as a bookie does, and as docs/operations.md recommends for
    a client that keeps many writers or records in flight."""
    from dlog import Namespace

    tune_garbage_collector()

    async def go(cluster: LocalCluster) -> Any:
        async with Namespace(cluster.zk_address, NAMESPACE, security=client_security(cluster),
                             **namespace_options) as ns:
            return await action(ns, cluster)

    args = bookie_args(fsync) + (["--latency-probes"] if bookie_probes else [])
    with local_cluster(3, args, secure=secure, profiler=profiler) as cluster:
        return asyncio.run(go(cluster))
