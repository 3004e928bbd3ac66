"""Every `dlog bench` mode runs on a tiny size and reports figures that add up (never timed)."""

from __future__ import annotations

import json
import subprocess
import sys


def run_bench(*arguments: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "tools.cli", "bench", *arguments, "--json"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_bench_bookie_reports_each_run():
    result = run_bench("bookie", "--entries", "300", "--size", "100", "--in-flight", "1",
                       "--in-flight", "8")
    assert result["mode"] == "bookie" and result["fsync"] is True
    assert [(run["in_flight"], run["entries"]) for run in result["runs"]] == [(1, 300), (8, 300)]
    for run in result["runs"]:
        assert run["adds_per_s"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"] <= run["p999_ms"]


def test_bench_ledger_reports_throughput_latency_and_tail():
    result = run_bench("ledger", "--entries", "300", "--latency-entries", "30", "--rate", "200")
    assert result["quorum"] == "E3/Qw2/Qa2"
    runs = {run["run"]: run for run in result["runs"]}
    assert runs["throughput"]["entries"] == 300 and runs["throughput"]["appends_per_s"] > 0
    assert runs["sequential"]["entry_bytes"] == 1024
    assert runs["tail"]["entries"] == 30 and runs["tail"]["p50_ms"] <= runs["tail"]["p99_ms"]


def test_bench_refuses_a_bad_size_with_one_clear_line():
    result = subprocess.run([sys.executable, "-m", "tools.cli", "bench", "bookie", "--size", "12 parsecs"],
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
