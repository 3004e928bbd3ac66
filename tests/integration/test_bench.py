"""Every `dlog bench` mode runs on a tiny size and reports figures that add up (never timed)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAS_REDIS = shutil.which("redis-server") is not None and importlib.util.find_spec("redis") is not None
NO_REDIS = "needs redis-server and the redis package: run scripts/ensure-redis.sh"
NO_MATPLOTLIB = "needs matplotlib: pip install 'dlog[bench]'"


def run_bench(*arguments: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bench", *arguments, "--json"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run_without(module: str, *arguments: str) -> subprocess.CompletedProcess:
    """The CLI in a process where `module` cannot be imported, as if it were not installed."""
    code = f"import sys; sys.modules[{module!r}] = None; from dlog_tools.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, "bench", *arguments], capture_output=True,
                          text=True, timeout=60)


def assert_latencies(run: dict) -> None:
    assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["p999_ms"]


def assert_mb_per_s_matches(run: dict, record_bytes: int = 100) -> None:
    expected = run["records_per_s"] * record_bytes / 1e6
    assert abs(run["mb_per_s"] - expected) <= 0.1 + expected * 0.01, run


def test_bench_bookie_reports_each_run():
    result = run_bench("bookie", "--entries", "300", "--size", "100", "--in-flight", "1",
                       "--in-flight", "8")
    assert result["mode"] == "bookie" and result["fsync"] is True
    assert [(run["in_flight"], run["entries"]) for run in result["runs"]] == [(1, 300), (8, 300)]
    for run in result["runs"]:
        assert run["adds_per_s"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"] <= run["p999_ms"]


def test_bench_bookie_runs_add_batch_frames_beside_single_adds():
    result = run_bench("bookie", "--entries", "400", "--size", "100", "--in-flight", "8", "--batch", "4")
    assert [(run["frame"], run["entries"]) for run in result["runs"]] == [("ADD", 400), ("ADD_BATCH of 4", 400)]
    for run in result["runs"]:
        assert run["adds_per_s"] > 0 and run["bookie_cpu_us_per_add"] >= 0


def test_bench_ledger_batches_and_measures_the_tail_during_a_checkpoint():
    # the tail run outlasts the bookies' 10 s checkpoint interval, so each of the 3 bookies
    # checkpoints at least once while it runs, and the bench must count those checkpoints
    result = run_bench("ledger", "--entries", "300", "--batch", "50", "--latency-entries", "10",
                       "--rate", "20", "--checkpoint-entries", "500", "--checkpoint-seconds", "12")
    runs = {run["run"]: run for run in result["runs"]}
    assert runs["throughput"]["batch_entries"] == 50 and runs["throughput"]["appends_per_s"] > 0
    assert runs["throughput"]["client_cpu_us_per_op"] > 0 and "bookies_cpu_us_per_op" in runs["throughput"]
    during = runs["tail during checkpoint"]
    assert during["entries"] == 240 and during["checkpointed_entries"] == 500 and during["checkpoints"] >= 3
    assert_latencies(during)


def test_bench_ledger_reports_throughput_latency_and_tail():
    result = run_bench("ledger", "--entries", "300", "--latency-entries", "30", "--rate", "200")
    assert result["quorum"] == "E3/Qw2/Qa2" and result["fsync"] is True
    runs = {run["run"]: run for run in result["runs"]}
    assert runs["throughput"]["entries"] == 300 and runs["throughput"]["appends_per_s"] > 0
    assert runs["sequential"]["entry_bytes"] == 1024
    assert runs["tail"]["entries"] == 30 and runs["tail"]["p50_ms"] <= runs["tail"]["p99_ms"]


def test_bench_refuses_a_bad_size_with_one_clear_line():
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bench", "bookie", "--size", "12 parsecs"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "bad size '12 parsecs'" in result.stderr and "64KiB" in result.stderr


def test_bench_streams_reports_writes_reads_and_tail():
    result = run_bench("streams", "--records", "2000", "--batch-records", "500", "--tail-rate", "200",
                       "--tail-seconds", "0.5")
    runs = {run["run"]: run for run in result["runs"]}
    assert set(runs) == {"write_batch", "write", "read", "tail"}
    assert runs["read"]["records"] == 2000 and runs["write_batch"]["compression_ratio"] > 1
    assert runs["tail"]["records"] == 100 and runs["tail"]["p50_ms"] <= runs["tail"]["p99_ms"]


def test_bench_write_reports_write_batch_and_per_record_writes():
    result = run_bench("write", "--records", "2000", "--batch-records", "500", "--write-records", "1000",
                       "--sequential-records", "200")
    assert result["mode"] == "write" and result["fsync"] is True and "fdatasync" in result["durability"]
    runs = {run["run"]: run for run in result["runs"]}
    assert set(runs) == {"write_batch", "write", "write_nowait_gathered", "offer", "sequential"}
    sequential = runs["sequential"]
    assert sequential["records"] == 200 and 0 < sequential["p50_ms"] <= sequential["p99_ms"]
    batch, single, offered = runs["write_batch"], runs["write"], runs["offer"]
    gathered = runs["write_nowait_gathered"]
    assert gathered["gathered_every"] == 5_000 and gathered["records_per_s"] > 0
    assert batch["records"] == batch["stored_records"] == 2000 and batch["entries"] == 4
    for run in (single, offered, gathered):
        assert run["records"] == run["stored_records"] == 1000 and run["entries"] >= 1
        assert run["compression_ratio"] > 0 and run["client_cpu_us_per_op"] > 0
    assert batch["compression_ratio"] > 1
    for run in (batch, single, offered):
        assert run["records_per_s"] > 0
        assert_mb_per_s_matches(run)


def test_bench_write_spreads_per_record_writes_over_streams():
    result = run_bench("write", "--records", "600", "--batch-records", "300", "--write-records", "600",
                       "--streams", "3")
    spread = [run for run in result["runs"] if run["run"] == "spread"]
    assert [(run["api"], run["streams"]) for run in spread] == [("write_nowait", 3), ("offer", 3)]
    for run in spread:
        assert run["records"] == run["stored_records"] == 600 and run["entries"] >= 3


def test_bench_read_reads_back_every_record_of_the_closed_segment():
    result = run_bench("read", "--records", "2000", "--batch-records", "500")
    written, read = result["runs"]
    assert written["run"] == "write_batch (setup)" and read["run"] == "read"
    assert read["records"] == written["stored_records"] == 2000
    assert read["entries"] == written["entries"] == 4 and read["segments"] == 1
    assert read["as"] == "arrow batches" and read["compression_ratio"] == written["compression_ratio"] > 1
    assert_mb_per_s_matches(read)


def test_bench_tail_reports_latency_percentiles_at_the_offered_rate():
    result = run_bench("tail", "--rate", "200", "--seconds", "0.5")
    assert result["fsync"] is True and result["seconds_per_rate"] == 0.5
    [run] = result["runs"]
    assert run["records"] == 100 and run["rate_per_s"] == 200 and run["achieved_per_s"] > 0
    assert run["records_per_entry"] >= 1 and run["compression_ratio"] > 0
    assert_latencies(run)


def test_bench_scale_spreads_the_same_records_and_reports_reader_memory():
    result = run_bench("scale", "--records", "600", "--streams", "1", "--streams", "3",
                       "--backlog-records", "3000", "--backlog-batch-records", "100")
    assert result["fsync"] is True
    assert [run["streams"] for run in result["runs"]] == [1, 3]
    for run in result["runs"]:
        assert run["records"] == run["stored_records"] == 600 and run["records_per_s"] > 0
        assert run["entries"] >= run["streams"]
        assert run["records_per_entry"] == round(600 / run["entries"], 1)
    [memory] = result["memory"]
    assert memory["records"] == memory["records_read"] == 3000 and memory["entries"] == 30
    assert memory["rss_before_mb"] > 0 and memory["read_ahead_entries"] == 256
    assert memory["rss_peak_mb"] >= max(memory["rss_behind_mb"], memory["rss_after_mb"])


def test_bench_limits_reports_synced_writes_and_loopback_round_trips(tmp_path: Path):
    result = run_bench("limits", "--dir", str(tmp_path), "--journal-writes", "50",
                       "--sequential-size", "4MiB", "--round-trips", "200")
    assert result["fsync"] is True and result["directory"] == str(tmp_path.resolve())
    runs = result["runs"]
    assert [run["operations"] for run in runs] == [50, 50, 4, 200]
    assert "fallocated" in runs[0]["run"] and "zero-filled" in runs[1]["run"]
    for run in runs:
        assert run["per_s"] > 0
        assert_latencies(run)
    assert list(tmp_path.iterdir()) == []  # the test files are removed


@pytest.mark.skipif(not HAS_REDIS, reason=NO_REDIS)
def test_bench_compare_runs_the_same_workload_on_dlog_redis_and_nats():
    result = run_bench("compare", "--records", "3000", "--batch-records", "500", "--in-flight", "2",
                       "--sequential-records", "100")
    assert result["fsync"] is True and "appendfsync always" in result["redis"]
    assert "no replication" in result["redis"] and "E3/Qw2/Qa2" in result["dlog"]
    assert "sync_interval always" in result["nats"]
    runs = {(run["system"], run["client"], run["run"]): run for run in result["runs"]}
    dlog_write = runs["dlog", "dlog (Python)", "write"]
    assert dlog_write["stored_records"] == 3000 and dlog_write["compression_ratio"] > 1
    for peer in ("redis", "nats"):
        writes = [run for key, run in runs.items() if key[0] == peer and key[2] == "write"]
        assert any(run.get("stored_records") == 3000 for run in writes), peer
    nats_clients = {key[1] for key in runs if key[0] == "nats"}
    assert len(nats_clients) == 2 and any("3 servers R3" in client for client in nats_clients)
    for key, run in runs.items():
        assert run["records_per_s"] > 0
        if key[2] == "read" and key[1] != "redis-benchmark (C)":
            assert run["records"] == 3000
    pairs = {(ratio["peer"], ratio["run"], ratio["peer_run"]) for ratio in result["ratios"]}
    for peer in ("redis", "nats"):
        assert {(run, peer_run) for name, run, peer_run in pairs if name == peer} == {
            ("write", "write"), ("read", "read"), ("sequential write", "sequential write"),
            ("per-record write (offer)", "write")}  # per-record writes against the peers' pipelines
    assert runs["dlog", "dlog (Python)", "sequential write"]["records"] == 100
    for ratio in result["ratios"]:
        dlog = runs["dlog", "dlog (Python)", ratio["run"]]["records_per_s"]
        peer = runs[ratio["peer"], ratio["peer_client"], ratio["peer_run"]]["records_per_s"]
        assert ratio["dlog_over_peer"] == round(dlog / peer, 2)


@pytest.mark.skipif(not HAS_REDIS, reason=NO_REDIS)
def test_bench_compare_of_a_run_too_short_to_time_reports_no_figure_instead_of_a_traceback(tmp_path: Path):
    # redis-benchmark reports an infinite rate for a run too short to time (seen with --records 100)
    fake = tmp_path / "redis-benchmark"
    fake.write_text("#!/bin/sh\necho '\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\","
                    "\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"'\n"
                    "echo '\"XADD\",\"inf\",\"0.0\",\"0.0\",\"0.0\",\"0.0\",\"0.0\",\"0.0\"'\n")
    fake.chmod(0o755)
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bench", "compare", "--records", "100", "--json",
                             "--peers", "redis"],
                            capture_output=True, text=True, timeout=180,
                            env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    untimed = [run for run in json.loads(result.stdout)["runs"] if run["client"] == "redis-benchmark (C)"]
    assert len(untimed) == 2 and all(run["records_per_s"] is None and "too short" in run["note"] for run in untimed)


def test_bench_compare_without_the_redis_client_names_the_script_to_run():
    result = run_without("redis", "compare", "--records", "100")
    assert result.returncode == 1
    assert "pip install 'dlog[bench]'" in result.stderr and "scripts/ensure-redis.sh" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_bench_compare_without_the_nats_client_says_how_to_get_it_before_running_anything():
    result = run_without("nats", "compare", "--records", "100", "--peers", "nats")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "nats-py" in result.stderr and "dlog[bench]" in result.stderr


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason=NO_MATPLOTLIB)
@pytest.mark.parametrize("arguments, png", [
    (("ledger", "--entries", "300", "--latency-entries", "30", "--rate", "200", "--rates", "100"),
     "ledger-tail-latency.png"),
    (("tail", "--rate", "200", "--seconds", "0.3", "--rates", "100"), "stream-tail-latency.png"),
    (("scale", "--records", "300", "--streams", "1", "--streams", "2", "--backlog-records", "500",
      "--backlog-batch-records", "100"), "scale.png"),
])
def test_bench_plot_writes_a_png_chart(tmp_path: Path, arguments: tuple[str, ...], png: str):
    result = run_bench(*arguments, "--plot", str(tmp_path / "charts"))
    assert result["plots"] == [str(tmp_path / "charts" / png)]
    assert (tmp_path / "charts" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if arguments[0] != "scale":
        assert sorted(run["rate_per_s"] for run in result["runs"] if run["run"] == "tail") == [100, 200]


def test_bench_plot_without_matplotlib_refuses_before_measuring(tmp_path: Path):
    result = run_without("matplotlib", "tail", "--plot", str(tmp_path))
    assert result.returncode == 1
    assert "--plot needs matplotlib" in result.stderr and "pip install 'dlog[bench]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_bench_recovery_reports_rate_time_and_writer_latency():
    result = run_bench("recovery", "--size", "1MiB", "--entry-size", "4KiB", "--writer-seconds", "1",
                       "--writer-rate", "50")
    assert result["mode"] == "recovery" and result["quorum"] == "E3/Qw2/Qa2"
    assert result["victim_bytes"] >= 2**20 and result["victim_entries"] * 4096 == result["victim_bytes"]
    # everything the lost bookie held was copied (and the baseline writer's ledger, if it used it)
    assert result["entries_copied"] >= result["victim_entries"] and result["bytes_copied"] >= result["victim_bytes"]
    assert 0 < result["detect_s"] <= result["loss_to_full_replication_s"]
    expected = result["entries_copied"] / result["recovery_s"]  # recovery_s is rounded to 10 ms
    assert abs(result["entries_per_s"] - expected) <= 1 + 0.05 * expected, result
    runs = {run["run"]: run for run in result["runs"]}
    assert runs["writer without recovery"]["appends"] >= 40 and runs["writer during recovery"]["appends"] >= 1
    for run in runs.values():
        assert_latencies(run)


def test_bench_kafka_reports_offer_produce_latency_fetch_and_failover_side_by_side():
    pytest.importorskip("confluent_kafka")
    result = run_bench("kafka", "--records", "500", "--producers", "2", "--latency-producers", "3",
                       "--latency-rate", "20", "--latency-seconds", "0.5", "--session-timeout", "2")
    assert result["mode"] == "kafka" and result["fsync"] is True and result["quorum"] == "E3/Qw2/Qa2"
    runs = {run["run"]: run for run in result["runs"]}
    assert list(runs) == ["offer", "kafka_produce", "kafka_latency", "kafka_fetch", "failover"]
    assert runs["offer"]["records"] == 500 and runs["offer"]["records_per_s"] > 0
    assert runs["kafka_produce"]["records"] == 500 and runs["kafka_produce"]["failed"] == 0
    assert runs["kafka_produce"]["clients"] == 2
    assert result["kafka_vs_offer"] == round(runs["kafka_produce"]["records_per_s"] / runs["offer"]["records_per_s"], 2)
    latency = runs["kafka_latency"]
    assert latency["records"] == 3 * 10 and latency["failed"] == 0
    assert_latencies(latency)
    assert runs["kafka_fetch"]["records"] == 501  # the produce run's records and its warm-up record
    for name in ("kafka_produce", "kafka_latency", "kafka_fetch"):
        assert runs[name]["server_cpu_us_per_record"] >= 0, runs[name]
    failover = runs["failover"]
    # the new owner takes the stream only after the killed one's session expired
    assert failover["failover_s"] is not None and failover["failover_s"] >= 1.0 and failover["failed"] == 0
    assert set(result["targets"]) == {"kafka_produce_records_per_s", "kafka_vs_offer", "latency_p99_ms",
                                      "fetch_records_per_s"}


@pytest.mark.parametrize("tier", ["file", "moto"])
def test_bench_tier_reports_offload_reads_from_both_copies_and_bytes_per_record(tier: str):
    result = run_bench("tier", "--records", "3000", "--segments", "3", "--batch-records", "500", "--tier", tier)
    assert result["mode"] == "tier" and result["records"] == 3000 and result["segments"] == 3
    assert result["bookie_copies"] == 2 and 0 < result["tier_bytes_per_record"] < result["bookie_bytes_per_record"]
    runs = {run["run"]: run for run in result["runs"]}
    assert runs["offload"]["records"] == 3000 and runs["offload"]["segments"] == 3
    reads = [run for run in result["runs"] if run["run"].startswith("read from")]
    assert [run["prefer"] for run in reads] == ["bookies", "tier", "tier"]
    assert all(run["records"] == 3000 and run["records_per_s"] > 0 for run in reads)
