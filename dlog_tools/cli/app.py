"""The `dlog` command group. Each command group lives in its own module of this package and is
added here, so command modules never import each other (nor this one)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from dlog_tools.cli.autorecovery import autorecovery, decommission_command
from dlog_tools.cli.bench import bench
from dlog_tools.cli.bookie import bookie
from dlog_tools.cli.compact import compact_command
from dlog_tools.cli.health import cluster, ping_command
from dlog_tools.cli.ledger import ledger
from dlog_tools.cli.quota import quota
from dlog_tools.cli.read import read_command
from dlog_tools.cli.records import export_command, truncate_command, write_command
from dlog_tools.cli.retention import retention
from dlog_tools.cli.serve import serve
from dlog_tools.cli.standalone import standalone, ui_command
from dlog_tools.cli.stream import stream
from dlog_tools.cli.subscription import subscription
from dlog_tools.cli.tier import offload_command, tier
from dlog_tools.cli.token import token

NO_ARGS_IS_HELP: tuple[type[click.UsageError], ...] = tuple(
    kind for kind in [getattr(click.exceptions, "NoArgsIsHelpError", None)] if kind is not None)


class OneLineErrors(click.Group):
    """The `dlog` group, whose usage errors (a missing argument, a bad option value, an unknown
    command) are one line on stderr like every other error: `dlog read: missing argument 'NAME'
    (dlog read -h for help)`, exit status 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        if not standalone_mode:  # the caller handles click's exceptions itself
            return super().main(args, prog_name, complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  windows_expand_args=windows_expand_args, **extra)
        except NO_ARGS_IS_HELP as exc:  # `dlog stream`: the group's help, as click prints it
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx is not None else "dlog"
            message = exc.format_message().rstrip(".")
            click.echo(f"{command}: {message[:1].lower()}{message[1:]} ({command} -h for help)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"dlog: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        if isinstance(result, int) and not isinstance(result, bool) and result:  # ctx.exit(N)
            sys.exit(result)
        return result


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dlog")
def main() -> None:
    """dlog: a replicated log service on the design of Apache BookKeeper and DistributedLog."""
    # commands report failures in one line of their own; kazoo's connection chatter is noise there
    # (a bookie process turns its logging back on in bookkeeper.bookie.main)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


for command in (bookie, ledger, stream, subscription, write_command, read_command, truncate_command,
                retention, export_command, cluster, ping_command, standalone, ui_command, bench, token,
                quota, autorecovery, serve, tier, offload_command, compact_command):
    main.add_command(command)
bookie.add_command(decommission_command)
