"""Operator tooling that ships with dlog: the `dlog` command (`tools.cli`, one module per command
group), local clusters of real processes (`tools.cluster`, used by `dlog standalone`), the status
page (`tools.ui`), export, configuration files and units, and the benchmarks (`tools.bench`, whose
one front end is `dlog bench`). It may import bookkeeper, dlog and spark; they never import it.
"""
