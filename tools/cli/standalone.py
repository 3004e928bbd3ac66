"""`dlog standalone` and `dlog ui`: a local development cluster, and the cluster status page."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from bookkeeper.errors import DlogError

from tools.autorecovery_options import delay_option
from tools.cli.common import fails_cleanly, zk_option


ZK_PORT_DEFAULT = 2181


@click.command()
@click.option("--dir", "directory", default="dlog-standalone", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="where ZooKeeper and bookies keep data")
@click.option("--bookies", default=3, show_default=True, type=click.IntRange(0, 32))
@click.option("--zk-port", default=None, type=click.IntRange(0, 65535), help="ZooKeeper client port",
              show_default=f"the port of the last start in --dir, else {ZK_PORT_DEFAULT}")
@click.option("--ui-port", default=0, show_default=True, type=click.IntRange(-1, 65535),
              help="status page port on 127.0.0.1 (0: any free port, -1: no status page)")
@delay_option
@fails_cleanly
def standalone(directory: Path, bookies: int, zk_port: int | None, ui_port: int,
               lost_bookie_recovery_delay: int) -> None:
    """ZooKeeper plus N bookie processes in the foreground, for development; Ctrl-C stops all.

    A directory runs one cluster at a time (a second start on it is refused), every part must
    listen on its own port (one that another process holds is named and refused), and
    `cluster.json` changes only after a start that succeeded."""
    from tools.cluster import LocalCluster, load_state

    stop = _stop_on_signals()
    if zk_port is None:
        zk_port = load_state(directory).get("zk_port") or ZK_PORT_DEFAULT
    cluster = LocalCluster(directory, bookies=bookies, zk_port=zk_port,
                           bookie_args=["--lost-bookie-recovery-delay", f"{lost_bookie_recovery_delay}ms"])
    try:
        cluster.start()
    except DlogError as exc:  # a bookie's failure comes with its log's tail: the first line says it
        raise type(exc)(str(exc).splitlines()[0]) from exc
    ui = None
    try:
        ui_url = None
        if ui_port >= 0:
            ui, ui_url = _start_ui(cluster, ui_port)
        _print_ready(cluster, ui_url)
        _supervise(cluster, stop)
    finally:
        if ui is not None:
            ui.stop()
        cluster.stop()
        click.echo("dlog standalone stopped")


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _start_ui(cluster: Any, port: int) -> tuple[Any, str]:
    from tools.ui import UiOptions, UiThread

    ui = UiThread(UiOptions(cluster.zk_address, cluster.zk_root), port=port)
    return ui, ui.start()


def _print_ready(cluster: Any, ui_url: str | None) -> None:
    addresses = ",".join(bookie.address for bookie in cluster.bookies) or "-"
    click.echo(f"dlog standalone ready zk={cluster.zk_address} bookies={addresses} dir={cluster.directory}")
    if ui_url is not None:
        click.echo(f"  ui {ui_url}")
    for bookie in cluster.bookies:
        click.echo(f"  bookie {bookie.address} admin {bookie.http} data {bookie.data_dir}")
    sys.stdout.flush()


def _supervise(cluster: Any, stop: threading.Event) -> None:
    """Until a signal: report each bookie that exits (it is not restarted)."""
    while not stop.wait(0.5):
        for bookie in cluster.bookies:
            if bookie.process is not None and not bookie.running and not bookie.exit_reported:
                click.echo(f"bookie {bookie.address} exited with status {bookie.process.returncode}", err=True)
                bookie.exit_reported = True


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

