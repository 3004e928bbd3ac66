"""The README works as printed: its quick-start commands and its Python example, saved as a file and
run twice (the second run finds the stream there), against a cluster with the README's defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import readme_blocks
from dlog_tools.cluster import LocalCluster

PROJECT = Path(__file__).resolve().parent.parent.parent
README_ZK = "127.0.0.1:2181"  # what the README connects to; the tests' cluster listens elsewhere


@pytest.fixture(scope="module")
def readme_cluster(tmp_path_factory):
    """Its own ZooKeeper, so the README's default roots (/bookkeeper, namespace default) are ours."""
    cluster = LocalCluster(tmp_path_factory.mktemp("readme"), bookies=3)
    cluster.start()
    yield cluster
    cluster.stop()


def test_the_quick_start_commands_work_as_printed(readme_cluster):
    block = next(body for body in readme_blocks("") if "dlog stream create" in body)
    commands = [line.split("  #")[0].strip() for line in block.splitlines()
                if line.strip() and "dlog standalone" not in line]  # the cluster runs already
    assert len(commands) == 4
    outputs = [subprocess.run(command, shell=True, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "DLOG_ZK": readme_cluster.zk_address})
               for command in commands]
    assert all(result.returncode == 0 and result.stderr == "" for result in outputs), outputs
    assert [json.loads(line)["value"] for line in outputs[2].stdout.splitlines()] == ["hello", "world"]
    assert outputs[3].stdout == "clicks: retention_age off -> 7d\n"  # the standalone then applies it by itself


def test_the_python_example_runs_as_saved_and_again(readme_cluster, tmp_path):
    (code,) = [body for body in readme_blocks("python") if "from dlog import Namespace" in body]
    assert README_ZK in code
    script = tmp_path / "example.py"
    script.write_text(code.replace(README_ZK, readme_cluster.zk_address))
    for run in (1, 2):  # a second run must not fail because the stream exists
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                                cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == run and all(line.endswith(" b'{\"order\": 1}'") for line in lines), lines
