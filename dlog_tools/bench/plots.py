"""Charts of bench results (PNG, matplotlib on the Agg backend): tail latency against offered
rate, and throughput against stream count with a lagging reader's memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bookkeeper.errors import DlogError

MATPLOTLIB_MISSING = ("--plot needs matplotlib, which is not installed in this environment: "
                      "install the bench extra with pip install 'dlog[bench]', or run without --plot")


def pyplot_module() -> Any:
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
    pyplot = pyplot_module()
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
    pyplot = pyplot_module()
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


def plot_dir_checked(plot_dir: Path | None) -> Path | None:
    """Check --plot before measuring: matplotlib importable, directory creatable."""
    if plot_dir is None:
        return None
    pyplot_module()
    plot_dir.mkdir(parents=True, exist_ok=True)
    return plot_dir
