"""A short soak as a user runs it: `python -m tests.harness.chaos` with a fixed seed mixes every fault this
machine can inject for about a minute, then heals, reads back and checks the history (exit 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

SEED = 7
ROOT = Path(__file__).resolve().parents[2]


def test_a_one_minute_soak_with_a_fixed_seed_finds_no_anomaly(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.harness.chaos", "--seed", str(SEED), "--minutes", "1", "--rate", "200",
               "--dir", str(tmp_path / "chaos")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{output[-6000:]}"
    assert f"seed {SEED} passed" in output and "anomalies: 0" in output, output[-3000:]
    assert "faults injected: 0 " not in output, output[-3000:]


def test_bad_arguments_are_refused_with_a_clear_message() -> None:
    for arguments in (["--minutes", "1"], ["--seed", "x", "--minutes", "1"], ["--seed", "1", "--minutes", "0"]):
        result = subprocess.run([sys.executable, "-m", "tests.harness.chaos", *arguments], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "error:" in result.stderr, (arguments, result.stderr)
