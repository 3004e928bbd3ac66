"""`python -m tools.cli ...` is the `dlog` command (bookie processes are started this way)."""

from tools.cli.app import main

main()
