"""Spark's auto-discovery hook for the "dlog" data source.

Spark 4 runs `pyspark.sql.worker.lookup_data_sources` once per session: it lists the top-level
modules on `sys.path` (`pkgutil.iter_modules`), imports those named `pyspark_*` and registers
each one's `DefaultSource` under `DefaultSource.name()`. This module is that hook; the data
source itself lives in `dlog_spark/source.py`.

The hook runs in Spark's Python worker, which is `$PYSPARK_PYTHON` (else `python3` on the PATH).
When that interpreter finds this module but not what dlog needs (its dependencies live in another
environment), the import fails with a message saying which interpreter ran and that
`PYSPARK_PYTHON` must name the one dlog is installed in; a worker that does not find this module
at all cannot say anything (Spark reports the "dlog" data source as not found: docs/spark.md).
"""

import sys

try:
    from dlog_spark.source import DlogDataSource as DefaultSource
except ImportError as exc:
    raise ImportError(
        f"the dlog Spark data source cannot load in the Python worker {sys.executable} ({exc}): Spark's workers "
        "run $PYSPARK_PYTHON, else python3 on the PATH; export PYSPARK_PYTHON to the interpreter dlog is "
        "installed in (e.g. PYSPARK_PYTHON=$(pwd)/.venv/bin/python) before starting Spark"
    ) from exc

__all__ = ["DefaultSource"]
