"""The `dlog` command group. Each command group lives in its own module of this package and is
added here, so command modules never import each other (nor this one)."""

from __future__ import annotations

import logging

import click

from tools.cli.autorecovery import autorecovery, decommission_command
from tools.cli.bench import bench
from tools.cli.bookie import bookie
from tools.cli.health import cluster, ping_command
from tools.cli.ledger import ledger
from tools.cli.quota import quota
from tools.cli.read import read_command
from tools.cli.records import export_command, truncate_command, write_command
from tools.cli.retention import retention
from tools.cli.serve import serve
from tools.cli.standalone import standalone, ui_command
from tools.cli.stream import stream
from tools.cli.subscription import subscription
from tools.cli.token import token


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dlog")
def main() -> None:
    """dlog: a replicated log service on the design of Apache BookKeeper and DistributedLog."""
    # commands report failures in one line of their own; kazoo's connection chatter is noise there
    # (a bookie process turns its logging back on in bookkeeper.bookie.main)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


for command in (bookie, ledger, stream, subscription, write_command, read_command, truncate_command,
                retention, export_command, cluster, ping_command, standalone, ui_command, bench, token,
                quota, autorecovery, serve):
    main.add_command(command)
bookie.add_command(decommission_command)
