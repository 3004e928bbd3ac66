"""`dlog bench ... --profile DIR` writes flame graphs of the client and of each bookie, and
`dlog bench tail --explain` shows the stages of the write-to-tail latency (never timed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlog_tools.bench.profile import Profiler


def run_bench(*arguments: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bench", *arguments, "--json"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def profiled_tail(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One small tail run with both options (one cluster for the two tests that read it)."""
    tmp_path = tmp_path_factory.mktemp("tail")
    return run_bench("tail", "--rate", "200", "--seconds", "1", "--explain", "--profile",
                     str(tmp_path / "profiles")), tmp_path


def test_bench_tail_profile_writes_a_flame_graph_per_process(profiled_tail: tuple[dict, Path]):
    result, tmp_path = profiled_tail
    roles = ["bookie-0", "bookie-1", "bookie-2", "client"]
    if "profile_notes" in result:  # py-spy could not attach here: the client fell back to cProfile
        assert "cProfile" in result["profile_notes"] and result["profiles"]["client"].endswith("client.pstats")
        assert "_stream_tail" in (tmp_path / "profiles" / "client-top.txt").read_text()
        return
    assert result["profiler"].startswith("py-spy") and sorted(result["profiles"]) == roles
    for role in roles:
        svg = (tmp_path / "profiles" / f"{role}.svg").read_text()
        assert result["profiles"][role] == str(tmp_path / "profiles" / f"{role}.svg")
        assert svg.lstrip().startswith(("<?xml", "<svg")) and svg.rstrip().endswith("</svg>")
        # each names the code that ran in that process: the bench's tail loop, the bookie's modules
        # (every stack of a bookie's loop starts in bookkeeper/bookie/main.py, its writer thread's
        # in journal.py)
        expected = "dlog_tools/bench/streams.py" if role == "client" else "bookkeeper/bookie/"
        assert expected in svg, role


def test_profiler_without_py_spy_profiles_the_client_with_cprofile(tmp_path: Path, monkeypatch):
    import dlog_tools.bench.profile as profile

    class NoBookies:
        bookies: list = []

    def busy_dlog_function() -> int:
        return sum(range(10_000))

    monkeypatch.setattr(profile, "py_spy_path", lambda: None)
    profiler = Profiler(tmp_path)
    profiler.attach(NoBookies())  # type: ignore[arg-type]
    busy_dlog_function()
    profiler.detach()
    summary = profiler.summary()
    assert summary["profiler"] == "cProfile" and summary["profiles"] == {"client": str(tmp_path / "client.pstats")}
    assert "py-spy is not installed" in summary["profile_notes"]
    assert "busy_dlog_function" in (tmp_path / "client-top.txt").read_text()


def test_bench_profile_refuses_a_path_it_cannot_create_in_one_line(tmp_path: Path):
    (tmp_path / "file").write_text("")
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bench", "tail", "--profile",
                             str(tmp_path / "file" / "profiles")], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "--profile" in result.stderr


def test_bench_tail_explain_shows_every_stage_with_figures(profiled_tail: tuple[dict, Path]):
    result, _ = profiled_tail
    [run] = result["runs"]
    stages = {row["stage"]: row for row in result["explain"]}
    end_to_end = stages["end to end: write() call -> tailing reader has it"]
    # the end-to-end row is the run's own figure, beside its parts
    assert (end_to_end["p50_ms"], end_to_end["p99_ms"]) == (run["p50_ms"], run["p99_ms"])
    assert end_to_end["samples"] == run["records"] == 200
    for name in ("write() call -> acknowledged (its future done)",
                 "acknowledged -> tailing reader has it (long-poll wake-up)"):
        assert stages[name]["samples"] == 200 and stages[name]["p50_ms"] <= stages[name]["p99_ms"]
    write_ack = stages["write() call -> acknowledged (its future done)"]
    assert 0 < write_ack["p50_ms"] <= end_to_end["p99_ms"]
    # the bookies ran with --latency-probes: each entry was journalled by its write quorum of 2
    # (records_per_entry is rounded, hence the margin)
    durable = stages["  bookie: journal append -> durable, per record"]
    assert durable["samples"] >= 2 * 0.9 * run["records"] / run["records_per_entry"]
    for name in ("  bookie: journal append -> durable, per record",
                 "    of it: its group's write + fdatasync, per group",
                 "    of it: queue (waiting for the group's write, the loop's callback)"):
        assert stages[name]["samples"] > 0 and 0 <= stages[name]["p50_ms"] <= stages[name]["p99_ms"], name
    rest = stages["  the rest: client batching, send, loopback, bookie dispatch, answer"]
    assert rest["p50_ms"] == round(write_ack["p50_ms"] - durable["p50_ms"], 3)
    # the probes ran all along (a loaded machine and the profiler make each turn late, so fewer
    # than one a millisecond)
    for name in ("client event-loop lag", "bookie event-loop lag"):
        assert stages[name]["samples"] > 10 and 0 <= stages[name]["p50_ms"] <= stages[name]["p99_ms"], name
    assert {"client cycle-collector pauses", "bookie cycle-collector pauses"} <= set(stages)


def test_bench_ledger_explain_splits_each_tail_run_into_the_same_stages():
    result = run_bench("ledger", "--entries", "100", "--latency-entries", "100", "--rate", "200", "--explain")
    tail = next(run for run in result["runs"] if run["run"] == "tail")
    stages = {row["stage"]: row for row in result["explain"] if row["run"] == "tail"}
    end_to_end = stages["end to end: append_async() call -> tailing reader has it"]
    assert (end_to_end["p50_ms"], end_to_end["p99_ms"], end_to_end["samples"]) == (tail["p50_ms"], tail["p99_ms"], 100)
    acknowledged = stages["append_async() call -> acknowledged (its future done)"]
    assert acknowledged["samples"] == 100 and 0 < acknowledged["p50_ms"] <= acknowledged["p99_ms"]
    # each entry is in one journal record on each bookie of its write quorum of 2, and each bookie
    # journals the ledger's key once; a loop late by a whole interval sends two appends in one
    # frame, journalled as one record, so fewer records than 2 x 100 can cover them all
    durable = stages["  bookie: journal append -> durable, per record"]
    assert 0 < durable["samples"] <= 2 * 100 + 3
    assert stages["bookie event-loop lag"]["samples"] > 0
