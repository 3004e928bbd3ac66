"""`dlog standalone` and `dlog ui`: a local development cluster, and the cluster status page."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click

from tools.cli.common import fails_cleanly, zk_option


@click.command()
@click.option("--dir", "directory", default="dlog-standalone", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="where ZooKeeper and bookies keep data")
@click.option("--bookies", default=3, show_default=True, type=click.IntRange(0, 32))
@click.option("--zk-port", default=2181, show_default=True, type=click.IntRange(0, 65535))
@click.option("--ui-port", default=0, show_default=True, type=click.IntRange(-1, 65535),
              help="status page port on 127.0.0.1 (0: any free port, -1: no status page)")
@fails_cleanly
def standalone(directory: Path, bookies: int, zk_port: int, ui_port: int) -> None:
    """ZooKeeper plus N bookie processes in the foreground, for development; Ctrl-C stops all."""
    from tools.cluster import LocalCluster
    from tools.ui import UiOptions, UiThread

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    cluster = LocalCluster(directory, bookies=bookies, zk_port=zk_port)
    ui = None if ui_port < 0 else UiThread(UiOptions(cluster.zk_address, cluster.zk_root), port=ui_port)
    try:
        cluster.start()
        ui_url = ui.start() if ui is not None else None
        addresses = ",".join(bookie.address for bookie in cluster.bookies) or "-"
        click.echo(f"dlog standalone ready zk={cluster.zk_address} bookies={addresses} "
                   f"dir={cluster.directory}", nl=True)
        if ui_url is not None:
            click.echo(f"  ui {ui_url}")
        for bookie in cluster.bookies:
            click.echo(f"  bookie {bookie.address} admin {bookie.http} data {bookie.data_dir}")
        sys.stdout.flush()
        while not stop.wait(0.5):
            for bookie in cluster.bookies:
                if bookie.process is not None and not bookie.running and not bookie.exit_reported:
                    click.echo(f"bookie {bookie.address} exited with status "
                               f"{bookie.process.returncode}", err=True)
                    bookie.exit_reported = True
    finally:
        if ui is not None:
            ui.stop()
        cluster.stop()
        click.echo("dlog standalone stopped")



@click.command("ui")
@zk_option
@click.option("--namespace-root", default="/dlog", show_default=True,
              help="ZooKeeper node whose children are the namespaces")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="port to listen on (0: any free port)")
@fails_cleanly
def ui_command(zk: str, zk_root: str, namespace_root: str, host: str, port: int) -> None:
    """Serve the cluster status page (bookies, stream segments, subscription lag) until Ctrl-C."""
    from tools.ui import UiOptions, serve

    def on_ready(url: str) -> None:
        click.echo(f"dlog ui serving {url} (Ctrl-C stops it)")
        sys.stdout.flush()

    serve(UiOptions(zk, zk_root, namespace_root), host, port, on_ready)

