"""docs/cli.md is exactly what the commands' --help says today (regenerate: python -m dlog_tools.clidoc)."""

from __future__ import annotations

from pathlib import Path

from dlog_tools.clidoc import render


def test_the_cli_reference_matches_the_commands():
    documented = Path("docs/cli.md").read_text()
    assert documented == render(), "docs/cli.md is stale: run `python -m dlog_tools.clidoc > docs/cli.md`"


def test_every_command_is_in_the_reference():
    text = render()
    for command in ("dlog standalone", "dlog bookie start", "dlog bookie list", "dlog stream create",
                    "dlog write", "dlog read", "dlog truncate", "dlog retention apply", "dlog export",
                    "dlog ledger recover", "dlog bench bookie", "dlog ui", "dlog offload", "dlog tier set",
                    "dlog tier status", "dlog tier daemon", "dlog tier iceberg", "dlog bench tier"):
        assert f"`{command}`" in text, command
