"""Operator tooling that ships with dlog: the `dlog` command (`dlog_tools.cli`, one module per command
group), local clusters of real processes (`dlog_tools.cluster`, used by `dlog standalone`), the status
page (`dlog_tools.ui`), export, configuration files and units, and the benchmarks (`dlog_tools.bench`, whose
one front end is `dlog bench`). It may import bookkeeper, dlog and spark; they never import it.
"""
