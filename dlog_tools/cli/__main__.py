"""`python -m dlog_tools.cli ...` is the `dlog` command (bookie processes are started this way)."""

from dlog_tools.cli.app import main

main()
