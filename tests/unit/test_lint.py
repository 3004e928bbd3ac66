"""The shipped code passes ruff and mypy as pyproject.toml configures them (ruff's rules; mypy strict
on bookkeeper.protocol, dlog.core, dlog.segments and dlog.serve, its default mode elsewhere), so
`make test` fails on what either finds. Both run from the venv this test runs in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("bookkeeper", "dlog", "dlog_spark", "dlog_tools", "pyspark_dlog.py")
BIN = Path(sys.executable).parent


def run(tool: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    executable = BIN / tool
    if not executable.exists():
        pytest.fail(f"{tool} is not installed next to {sys.executable}: make install (it is in the test extra)")
    return subprocess.run([str(executable), *arguments], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_in_the_shipped_code():
    result = run("ruff", "check", "--no-cache", *SHIPPED)
    assert result.returncode == 0, f"ruff check {' '.join(SHIPPED)}:\n{result.stdout}{result.stderr}"


def test_mypy_finds_nothing_in_the_shipped_code():
    # the files to check come from [tool.mypy] in pyproject.toml, so a plain `mypy` agrees with this
    result = run("mypy")
    assert result.returncode == 0, f"mypy:\n{result.stdout}{result.stderr}"
    checked = result.stdout.rsplit(" found in ", 1)[-1]
    assert int(checked.split()[0]) >= 150, result.stdout  # it did check the shipped modules


def test_mypy_is_strict_where_configured(tmp_path):
    """A function without annotations passes in dlog/ but is refused in dlog/core (strict)."""
    config = tmp_path / "pyproject.toml"
    config.write_text((ROOT / "pyproject.toml").read_text().replace(
        'files = ["bookkeeper", "dlog", "dlog_spark", "dlog_tools", "pyspark_dlog.py"]', "files = []"))
    for package in ("dlog", "dlog/core"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "untyped.py").write_text("def f(x):\n    return x\n")
    result = subprocess.run([str(BIN / "mypy"), "--config-file", str(config),
                             "dlog/untyped.py", "dlog/core/untyped.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    refused = [line for line in result.stdout.splitlines() if "error:" in line]
    assert [line.split(":")[0] for line in refused] == ["dlog/core/untyped.py"], result.stdout
