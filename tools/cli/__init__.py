"""The operator CLI: the `dlog` command, one module per command group (`tools.cli.app` adds them to
the group). `main` is the console script's entry point."""

from tools.cli.app import main

__all__ = ["main"]
