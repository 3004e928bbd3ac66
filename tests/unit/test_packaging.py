"""What `pip install dlog` puts into site-packages (issue 23 item 6): only dlog's own top-level names,
no `tools` or `spark` package that would shadow or be shadowed by another project's."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def test_the_wheel_ships_only_dlog_prefixed_top_level_names(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=240)
    [wheel] = tmp_path.glob("dlog-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        tops = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith((".dist-info",
                                                                                                 ".data"))}
        entry_points = next(archive.read(name).decode() for name in names if name.endswith("entry_points.txt"))
    assert tops == {"bookkeeper", "dlog", "dlog_spark", "dlog_tools", "pyspark_dlog.py"}, tops
    assert "dlog = dlog_tools.cli:main" in entry_points
    assert "dlog_tools/ui_static/" in "\n".join(names)  # the status page's files travel with it
