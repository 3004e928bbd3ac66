"""The benchmarks behind `dlog bench MODE` (its one front end, `dlog_tools.cli.bench`): each mode starts
what it needs (a local cluster of real processes, fsync on) and returns one dict of figures.
Measured, never asserted: the figures go into docs/benchmarks.md with the command that made them.
"""
