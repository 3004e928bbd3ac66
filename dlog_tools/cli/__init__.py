"""The operator CLI: the `dlog` command, one module per command group (`dlog_tools.cli.app` adds them to
the group). `main` is the console script's entry point."""

from dlog_tools.cli.app import main

__all__ = ["main"]
