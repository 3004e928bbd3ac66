"""Seeded runs of the real stream layer on simulated time keep L1-L7, V4 (dense, stable stream
positions), liveness, and the serving tier's exactly-once idempotent produce across server kills
(no duplicate, no loss per producer), and issue 25's named producers whose writers are killed and
resend through new ones (the same per producer), under every fault (a ledger deleted under a live
writer among them), replay exactly, and catch each of issue 11's eleven bugs, and those found or
feared since, when it is planted back."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.harness.seeds import map_seeds
from tests.harness.streamsim.plants import NAMES, PLANTS, planted
from tests.harness.streamsim.simulation import StreamRunResult, StreamSimulation, run

# about 40 s here on two processes (quiet machine); together they inject every fault kind (checked below: seed
# 43 is the first with a failed ledger among the seeds after 39)
FIXED_SEEDS = [*range(0, 40), 43]
ROOT = Path(__file__).resolve().parents[2]


def drawing_nothing_global(run_once):
    """Run it and check it drew nothing from the process-wide random generator: a replay must not
    depend on what else ran in the process first (the Spark sink's commit retries once did)."""
    state = random.getstate()
    result = run_once()
    assert random.getstate() == state, "the run drew from the global random generator: replays are not exact"
    return result


def fixed_run(seed: int) -> tuple[StreamRunResult, Counter[str]]:
    simulation = StreamSimulation(seed)
    result = drawing_nothing_global(simulation.run)
    kinds = Counter(str(event.get("kind")) for event in simulation.history.events if event["f"] == "fault")
    kinds.update({f"event {event['f']}": 1 for event in simulation.history.events})
    kinds["rebuilt with producers"] = sum(1 for event in simulation.history.events
                                          if event["f"] == "served_take" and event["producers"] > 0)
    kinds["resent batches"] = sum(1 for event in simulation.history.events
                                  if event["f"] == "producer_ack" and event["sends"] > 1)
    kinds["named resent batches"] = sum(1 for event in simulation.history.events
                                        if event["f"] == "named_ack" and event["sends"] > 1)
    return result, kinds


@pytest.fixture(scope="module")
def fixed_runs() -> list[tuple[StreamRunResult, Counter[str]]]:
    return map_seeds(fixed_run, FIXED_SEEDS)


def test_every_fixed_seed_keeps_every_promise(fixed_runs):
    failing = [result for result, _ in fixed_runs if result.anomalies]
    assert not failing, "\n\n".join(result.text for result in failing[:3])


def test_the_fixed_seeds_inject_every_fault_and_routine_operation(fixed_runs):
    faults: Counter[str] = Counter()
    for result, kinds in fixed_runs:
        faults.update(result.faults)
        faults.update(kinds)
    for kind in ("ledger_failure", "kill_writer", "session_expiry", "metadata blips", "metadata_delay", "delete_ledger",
                 "truncate", "retention", "sink_commit", "event writer_died", "event truncation_done",
                 "event reader_stop", "kill_server", "event served_take", "event producer_ack", "event served_final",
                 "kill_named_writer", "event named_ack", "event named_final"):
        assert faults[kind] > 0, f"no {kind!r} in the fixed seeds: {dict(faults)}"
    assert sum(result.writes_ok for result, _ in fixed_runs) > 20_000
    # the servers: owners killed, and new owners that rebuilt their producers from the stream
    assert sum(kinds["rebuilt with producers"] for _, kinds in fixed_runs) > 5
    assert sum(kinds["resent batches"] for _, kinds in fixed_runs) > 20
    # the named producer: writers killed, batches sent again through a new writer
    assert sum(kinds["named resent batches"] for _, kinds in fixed_runs) > 10


# Seeds beyond the fixed ones where exploration found a bug, kept as regressions.
FOUND_SEEDS = [
    264,  # the Spark sink's commit crashed (InvariantError) when a writer rolled between its seal and append
]


@pytest.mark.parametrize("seed", FOUND_SEEDS)
def test_a_seed_that_found_a_bug_keeps_every_promise(seed):
    assert run(seed).anomalies == []


def test_a_seed_replays_exactly_whatever_the_hash_seed():
    assert run(11).fingerprint == run(11).fingerprint != run(12).fingerprint
    outputs = []
    for hash_seed in ("1", "2"):
        environment = dict(os.environ, PYTHONHASHSEED=hash_seed)
        done = subprocess.run([sys.executable, "-m", "tests.harness.streamsim", "--seed", "11"], cwd=ROOT,
                              env=environment, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    assert "fingerprint" in outputs[0] and outputs[0] == outputs[1]


# Seeds where each planted bug breaks a promise (found with `python -m tests.harness.streamsim
# --seeds 60 --plant NAME`; if the simulator changes how it draws, find new ones the same way).
PLANTED = [
    ("lost-cas-is-takeover", 2),
    ("reader-misses-roll", 1),
    ("held-entry-not-woken", 19),
    ("waiters-not-woken", 17),
    ("buffered-left-pending", 0),
    ("reader-ignores-truncation", 3),
    ("retention-takes-last-completed", 4),
    ("entries-ignore-roll-size", 2),
    ("batch-columns-not-filled", 1),
    ("records-wait-for-linger", 0),
    ("gc-without-sync", 2),
    ("metadata-errors-not-retried", 51),
    ("roll-timer-crash", 406),
    ("created-after-close-committed", 229),
    ("deleted-ledger-acknowledged", 12),
    ("roll-positions-from-entries", 0),
    ("dedup-not-rebuilt", 3),
    ("named-dedup-not-rebuilt", 4),
]


def test_every_plant_has_a_seed():
    assert sorted(name for name, _ in PLANTED) == sorted(NAMES)


def planted_run(case: tuple[str, int]) -> tuple[set[str], list[str], str]:
    plant, seed = case
    with planted(plant):
        result = drawing_nothing_global(lambda: run(seed))
    return {anomaly.kind for anomaly in result.report.anomalies}, result.anomalies[:5], result.text


@pytest.fixture(scope="module")
def planted_runs() -> dict[tuple[str, int], tuple[set[str], list[str], str]]:
    return dict(zip(PLANTED, map_seeds(planted_run, PLANTED), strict=True))


@pytest.mark.parametrize("plant, seed", PLANTED)
def test_the_checker_catches_a_planted_bug(plant, seed, planted_runs):
    kinds, anomalies, text = planted_runs[(plant, seed)]
    assert PLANTS[plant].kind in kinds, anomalies
    assert f"python -m tests.harness.streamsim --seed {seed}" in text
    if seed not in FIXED_SEEDS:
        assert run(seed).anomalies == []  # the same seed without the plant is fine
