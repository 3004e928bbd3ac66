"""`dlog bench MODE`: each mode measures (tools/bench.py) and this module presents the result: one
table per list of runs, or with `--json` one JSON object, and with `--plot DIR` PNG charts.

Every mode takes `--no-fsync` (figures without fdatasync, NOT durable; every result says which)
and `--json`. `--plot` needs matplotlib, which the project does not depend on; without it the
mode refuses before measuring anything.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import click

from bookkeeper.errors import DlogError
from tools.cli import SIZE, fails_cleanly, json_option, main

LEDGER_SWEEP_RATES = (500, 1000, 2000, 5000)
TAIL_SWEEP_RATES = (500, 1000, 2000, 5000, 10_000)
MATPLOTLIB_MISSING = ("--plot needs matplotlib, which is not installed in this environment: "
                      "install it with `.venv/bin/pip install matplotlib`, or run without --plot")


def print_bench(result: dict[str, Any], as_json: bool) -> None:
    """Scalars on one header line (mode, fsync, durability...), then a table per list of runs."""
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    tables = {key: value for key, value in result.items()
              if isinstance(value, list) and value and isinstance(value[0], dict)}
    header = {key: value for key, value in result.items() if key not in tables}
    click.echo(" ".join(f"{key}={value}" for key, value in header.items()))
    for key, rows in tables.items():
        if key != "runs":
            click.echo(key)
        _print_table(rows)


def _print_table(rows: list[dict[str, Any]]) -> None:
    """Every key of every row is a column; piped output is as wide as the table needs (rich
    would wrap it at 80 columns)."""
    from rich.console import Console
    from rich.table import Table

    columns: list[str] = []
    for row in rows:
        columns += [column for column in row if column not in columns]
    table = Table(*columns)
    for row in rows:
        table.add_row(*("" if row.get(column) is None else str(row.get(column)) for column in columns))
    Console(width=None if sys.stdout.isatty() else 240).print(table)


no_fsync_option = click.option("--no-fsync", is_flag=True, help="measure without fdatasync (NOT durable)")


def plot_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--plot", "plot_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
                        help="also write PNG charts into this directory (needs matplotlib)")(function)


def rates_option(default: Sequence[int]) -> Callable[..., Any]:
    shown = ", ".join(str(rate) for rate in default)
    return click.option("--rates", "sweep_rates", multiple=True, type=click.IntRange(1, 1_000_000),
                        help=f"offered rates for the latency chart (repeatable; with --plot, default {shown})")


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or a clear refusal."""
    try:
        import matplotlib
    except ImportError:
        raise DlogError(MATPLOTLIB_MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def _fsync_label(result: dict[str, Any]) -> str:
    return "fsync on" if result["fsync"] else "fsync OFF (not durable)"


def plot_latency(result: dict[str, Any], path: Path, title: str, rate_unit: str) -> Path:
    """Tail latency percentiles against the offered rate, one point per tail run."""
    pyplot = _pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator

    runs = sorted((run for run in result["runs"] if run["run"] == "tail"), key=lambda run: run["rate_per_s"])
    rates = [run["rate_per_s"] for run in runs]
    figure, axes = pyplot.subplots(figsize=(8, 5), dpi=110)
    for key, label, style in (("p50_ms", "p50", "o-"), ("p99_ms", "p99", "s-"), ("p999_ms", "p99.9", "^-")):
        axes.plot(rates, [run[key] for run in runs], style, label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(rates, [f"{rate:,}" for rate in rates])
    axes.minorticks_off()
    axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.set_xlabel(f"offered throughput ({rate_unit} per second, log scale)")
    axes.set_ylabel("latency (ms, log scale)")
    axes.set_title(f"{title}\n{result.get('quorum', '')}, {_fsync_label(result)}", fontsize=10)
    axes.grid(True, which="major", alpha=0.4)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return path


def plot_scale(result: dict[str, Any], path: Path) -> Path:
    """Records/s against stream count; beside it the lagging reader's RSS for each backlog."""
    pyplot = _pyplot()
    from matplotlib.ticker import FuncFormatter

    figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4.8), dpi=110)
    runs = result["runs"]
    counts = [run["streams"] for run in runs]
    left.plot(counts, [run["records_per_s"] for run in runs], "o-")
    for run in runs:
        left.annotate(f"{run['records_per_s']:,}", (run["streams"], run["records_per_s"]),
                      textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    left.set_xscale("log")
    left.set_xticks(counts, [f"{count:,}" for count in counts])
    left.minorticks_off()
    left.set_xlim(min(counts) / 2, max(counts) * 2)
    left.set_ylim(bottom=0, top=max(run["records_per_s"] for run in runs) * 1.15)
    left.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    left.set_xlabel("streams, each with its own writer (log scale)")
    left.set_ylabel("records per second (all streams)")
    left.set_title(f"{runs[0]['records']:,} records of {result['record_bytes']} B spread over N streams",
                   fontsize=10)
    left.grid(True, alpha=0.4)
    memory = result.get("memory", [])
    phases = (("rss_before_mb", "before"), ("rss_behind_mb", "behind"), ("rss_after_mb", "caught up"),
              ("rss_peak_mb", "peak after open"))
    width = 0.8 / len(phases)
    for offset, (key, label) in enumerate(phases):
        right.bar([index + offset * width for index in range(len(memory))], [run[key] for run in memory],
                  width, label=label)
    right.set_xticks([index + width * (len(phases) - 1) / 2 for index in range(len(memory))],
                     [f"{run['records']:,} records\n({run['backlog_mb']:,} MB of values)" for run in memory])
    right.set_xlabel("backlog the reader fell behind by")
    right.set_ylabel("reader process RSS (MB)")
    bound = (f"{memory[0]['read_ahead_entries']} entries / {memory[0].get('read_ahead_mb', '-')} MiB"
             if memory else "-")
    right.set_title(f"lagging reader memory (read-ahead {bound})", fontsize=10)
    right.set_ylim(0, max([run["rss_peak_mb"] for run in memory] + [1]) * 1.3)
    right.legend(fontsize=8, ncol=len(phases), loc="upper center")
    right.grid(True, axis="y", alpha=0.4)
    figure.suptitle(f"dlog scale, {result['quorum']}, {_fsync_label(result)}", fontsize=11)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return path


def _plot_dir(plot_dir: Path | None) -> Path | None:
    """Check --plot before measuring: matplotlib importable, directory creatable."""
    if plot_dir is None:
        return None
    _pyplot()
    plot_dir.mkdir(parents=True, exist_ok=True)
    return plot_dir


@main.group()
def bench() -> None:
    """Measure throughput and latency on a local cluster of real processes (fsync on)."""


@bench.command("bookie")
@click.option("--entries", default=200_000, show_default=True, type=click.IntRange(100))
@click.option("--size", "sizes", multiple=True, type=SIZE, help="entry payload size (repeatable; default 100 and 1KiB)")
@click.option("--in-flight", "in_flights", multiple=True, type=click.IntRange(1, 10_000),
              help="adds kept outstanding (repeatable; default 1 and 64)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_bookie_command(entries: int, sizes: tuple[int, ...], in_flights: tuple[int, ...],
                         no_fsync: bool, as_json: bool) -> None:
    """Raw adds against one bookie process."""
    from tools.bench import bench_bookie

    result = bench_bookie(entries, sizes or (100, 1024), in_flights or (1, 64), fsync=not no_fsync)
    print_bench(result, as_json)


@bench.command("ledger")
@click.option("--entries", default=100_000, show_default=True, type=click.IntRange(100))
@click.option("--in-flight", default=256, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--latency-entries", default=5_000, show_default=True, type=click.IntRange(10))
@click.option("--rate", default=1000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="appends per second offered in the tail-latency run")
@rates_option(LEDGER_SWEEP_RATES)
@plot_option
@no_fsync_option
@json_option
@fails_cleanly
def bench_ledger_command(entries: int, in_flight: int, latency_entries: int, rate: int,
                         sweep_rates: tuple[int, ...], plot_dir: Path | None, no_fsync: bool,
                         as_json: bool) -> None:
    """Appends through the ledger client at E3/Qw2/Qa2 on three bookie processes."""
    from tools.bench import bench_ledger

    plot_dir = _plot_dir(plot_dir)
    if plot_dir is not None and not sweep_rates:
        sweep_rates = LEDGER_SWEEP_RATES
    result = bench_ledger(entries, in_flight, latency_entries, rate, fsync=not no_fsync,
                          sweep_rates_per_s=sweep_rates)
    if plot_dir is not None:
        result["plots"] = [str(plot_latency(result, plot_dir / "ledger-tail-latency.png",
                                            "ledger append to tailing reader latency", "appends"))]
    print_bench(result, as_json)


@bench.command("streams")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--tail-rate", default=10_000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="records per second offered in the tail-latency run")
@click.option("--tail-seconds", default=5.0, show_default=True, type=click.FloatRange(0.1, 600))
@no_fsync_option
@json_option
@fails_cleanly
def bench_streams_command(records: int, batch_records: int, tail_rate: int, tail_seconds: float,
                          no_fsync: bool, as_json: bool) -> None:
    """The write, read and tail modes in one run, on one cluster (E3/Qw2/Qa2)."""
    from tools.bench_streams import bench_streams

    print_bench(bench_streams(records, batch_records, tail_rate, tail_seconds, fsync=not no_fsync), as_json)


@bench.command("write")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100),
              help="records written with write_batch")
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--write-records", default=300_000, show_default=True, type=click.IntRange(100),
              help="records written one by one with write() (at most --records)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_write_command(records: int, batch_records: int, write_records: int, no_fsync: bool,
                        as_json: bool) -> None:
    """Stream writes: write_batch() of Arrow batches and per-record write(), records/s and MB/s."""
    from tools.bench_streams import bench_write

    print_bench(bench_write(records, batch_records, write_records, fsync=not no_fsync), as_json)


@bench.command("read")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--batch-records", default=10_000, show_default=True, type=click.IntRange(1),
              help="records per written batch (one entry each, up to 3 MiB)")
@no_fsync_option
@json_option
@fails_cleanly
def bench_read_command(records: int, batch_records: int, no_fsync: bool, as_json: bool) -> None:
    """Catch-up read of a closed segment as Arrow batches."""
    from tools.bench_streams import bench_read

    print_bench(bench_read(records, batch_records, fsync=not no_fsync), as_json)


@bench.command("tail")
@click.option("--rate", default=10_000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="records per second offered")
@click.option("--seconds", default=5.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="how long each rate is offered")
@rates_option(TAIL_SWEEP_RATES)
@plot_option
@no_fsync_option
@json_option
@fails_cleanly
def bench_tail_command(rate: int, seconds: float, sweep_rates: tuple[int, ...], plot_dir: Path | None,
                       no_fsync: bool, as_json: bool) -> None:
    """Write-to-tailing-reader latency p50/p99/p99.9 at a fixed rate."""
    from tools.bench_streams import bench_tail

    plot_dir = _plot_dir(plot_dir)
    if plot_dir is not None and not sweep_rates:
        sweep_rates = TAIL_SWEEP_RATES
    result = bench_tail(rate, seconds, fsync=not no_fsync, sweep_rates_per_s=sweep_rates)
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
@no_fsync_option
@json_option
@fails_cleanly
def bench_scale_command(records: int, stream_counts: tuple[int, ...], backlog_records: tuple[int, ...],
                        backlog_batch_records: int, plot_dir: Path | None, no_fsync: bool,
                        as_json: bool) -> None:
    """The same write load over 1..1,000 streams; a lagging reader's memory behind a backlog."""
    from tools.bench_scale import bench_scale

    plot_dir = _plot_dir(plot_dir)
    result = bench_scale(records, stream_counts or (1, 10, 100, 1000),
                         backlog_records or (200_000, 2_000_000), backlog_batch_records, fsync=not no_fsync)
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
    from tools.bench_limits import bench_limits

    print_bench(bench_limits(directory, journal_writes, sequential_size, round_trips), as_json)


@bench.command("compare")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(100))
@click.option("--batch-records", default=1000, show_default=True, type=click.IntRange(1),
              help="records per write_batch call / XADDs per pipeline")
@click.option("--in-flight", default=8, show_default=True, type=click.IntRange(1, 256),
              help="batches (pipelines) outstanding on each side")
@no_fsync_option
@json_option
@fails_cleanly
def bench_compare_command(records: int, batch_records: int, in_flight: int, no_fsync: bool,
                          as_json: bool) -> None:
    """The same writes and catch-up reads on dlog and on Redis Streams (needs scripts/ensure-redis.sh)."""
    from tools.bench_compare import bench_compare

    print_bench(bench_compare(records, batch_records, in_flight, fsync=not no_fsync), as_json)
