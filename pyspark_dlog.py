"""Spark's auto-discovery hook for the "dlog" data source.

Spark 4 runs `pyspark.sql.worker.lookup_data_sources` once per session: it lists the top-level
modules on `sys.path` (`pkgutil.iter_modules`), imports those named `pyspark_*` and registers
each one's `DefaultSource` under `DefaultSource.name()`. This module is that hook; the data
source itself lives in `spark/source.py`.
"""

from spark.source import DlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
