"""`dlog standalone` and `dlog ui`: a local development cluster, and the cluster status page."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bookkeeper.errors import DlogError
from dlog_tools.bookie_settings import delay_option
from dlog_tools.cli.common import fails_cleanly, zk_option
from dlog_tools.units import DURATION

if TYPE_CHECKING:
    from dlog_tools.cluster import ServeProcess

ZK_PORT_DEFAULT = 2181
UI_PORT_DEFAULT = 8080


@click.command()
@click.option("--dir", "directory", default="dlog-standalone", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="where ZooKeeper and bookies keep data")
@click.option("--bookies", default=3, show_default=True, type=click.IntRange(0, 32))
@click.option("--zk-port", default=None, type=click.IntRange(0, 65535), help="ZooKeeper client port",
              show_default=f"the port of the last start in --dir, else {ZK_PORT_DEFAULT}")
@click.option("--ui-port", default=None, type=click.IntRange(-1, 65535),
              help="status page port on 127.0.0.1 (0: any free port, -1: no status page)",
              show_default=f"the port of the last start in --dir, else {UI_PORT_DEFAULT}")
@click.option("--kafka-port", default=0, show_default=True, type=click.IntRange(-1, 65535),
              help="Kafka port of the one `dlog serve` server it runs on 127.0.0.1, topics auto-created "
                   "(0: any free port, -1: no server)")
@click.option("--secure", is_flag=True, help="TLS and tokens on bookies and admin endpoints, ZooKeeper "
              "credentials and ACLs; makes a CA, certificates, an admin token and client.toml under "
              "DIR/secure/")
@click.option("--policy-check-interval", "policy_interval_ms", type=DURATION, default="1min", show_default=True,
              help="look at each stream's retention at least this often (a stream with an age limit is "
                   "looked at every quarter of it, at least every second)")
@click.option("--offload/--no-offload", default=True, show_default=True,
              help="offload streams with a tier by themselves (--no-offload: only `dlog offload` and "
                   "`dlog tier daemon` do)")
@delay_option
@fails_cleanly
def standalone(directory: Path, bookies: int, zk_port: int | None, ui_port: int | None, kafka_port: int,
               secure: bool, policy_interval_ms: int, offload: bool, lost_bookie_recovery_delay: int) -> None:
    """ZooKeeper plus N bookie processes in the foreground, for development; Ctrl-C stops all.

    Streams' retention policies are applied by themselves while it runs (about every quarter of
    a stream's retention age, at least every second, and at least every --policy-check-interval),
    and streams with a tier are offloaded on their policy's schedule (unless --no-offload).

    A directory runs one cluster at a time (a second start on it is refused), every part must
    listen on its own port (one that another process holds is named and refused), and
    `cluster.json` changes only after a start that succeeded."""
    from dlog_tools.cluster import LocalCluster, ServeProcess, load_state

    stop = _stop_on_signals()
    if zk_port is None:
        zk_port = load_state(directory).get("zk_port") or ZK_PORT_DEFAULT
    if ui_port is None:
        ui_port = load_state(directory).get("ui_port") or UI_PORT_DEFAULT
    secure_dir = _secure_dir(directory, secure)
    cluster = LocalCluster(directory, bookies=bookies, zk_port=zk_port, secure=secure_dir,
                           bookie_args=["--lost-bookie-recovery-delay", f"{lost_bookie_recovery_delay}ms"])
    _check_ui_port(cluster, ui_port)
    client_toml = None
    if secure_dir is not None:
        from dlog_tools.secure import write_admin_config

        client_toml = write_admin_config(secure_dir, cluster.zk_address)
    try:
        cluster.start()
        if client_toml is not None:
            _provision_default_namespace(cluster, client_toml)
    except DlogError as exc:  # a bookie's failure comes with its log's tail: the first line says it
        cluster.stop()
        raise type(exc)(str(exc).splitlines()[0]) from exc
    ui = policies = None
    server: ServeProcess | None = None
    try:
        ui_url = None
        if ui_port >= 0:
            ui, ui_url = _start_ui(cluster, ui_port, client_toml)
        policies = _start_policies(cluster, policy_interval_ms, client_toml, offload)
        if kafka_port >= 0 and bookies > 0:
            server = ServeProcess.start(cluster, "default", Path(directory).resolve() / "serve.log",
                                        kafka_port=kafka_port, secure=secure_dir, client_toml=client_toml)
        _print_ready(cluster, ui_url, client_toml, server)
        _supervise(cluster, stop, server)
    finally:
        if policies is not None:
            policies.stop()
        if ui is not None:
            ui.stop()
        if server is not None:
            server.stop()
        cluster.stop()
        click.echo("dlog standalone stopped")


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _secure_dir(directory: Path, secure: bool) -> Any:
    """The secure material of `directory` (made on the first --secure start), or None."""
    from bookkeeper.errors import ConfigError

    path = Path(directory) / "secure"
    if not secure:
        if path.exists():
            raise ConfigError(f"{directory} holds a secure cluster ({path} exists): start it with --secure")
        return None
    from dlog_tools.secure import create

    return create(path)


def _provision_default_namespace(cluster: Any, client_toml: Path) -> None:
    import asyncio

    from bookkeeper.security.settings import load_client_settings
    from dlog_tools.secure import provision_namespace

    asyncio.run(provision_namespace(cluster.zk_address, load_client_settings(client_toml), "default",
                                    bookkeeper_root=cluster.zk_root))


def _check_ui_port(cluster: Any, port: int) -> None:
    """Before anything starts: the status page's port (a remembered one too) is free. When it is
    not, a cluster already running from this directory (which holds it) is what to say, if so."""
    from bookkeeper.meta.ports import port_bindable, port_in_use

    if port > 0 and not port_bindable("127.0.0.1", port):
        cluster.lock.acquire()  # DirectoryInUseError names that cluster's pid
        cluster.lock.release()
        raise port_in_use("127.0.0.1", port, "the status page",
                          "pass --ui-port with another port (0: any free port; -1: no status page)")


def _start_ui(cluster: Any, port: int, client_toml: Path | None = None) -> tuple[Any, str]:
    """Serve the status page on `port` (0: any free one) and remember the port it got in
    cluster.json, as the ZooKeeper port is: a restart keeps the page's URL."""
    from bookkeeper.security.settings import NO_SECURITY, load_client_settings
    from dlog_tools.ui import UiOptions, UiThread

    security = load_client_settings(client_toml) if client_toml is not None else NO_SECURITY
    ui = UiThread(UiOptions(cluster.zk_address, cluster.zk_root, security=security), port=port)
    url = ui.start()
    cluster.remember_ui_port(int(url.rstrip("/").rsplit(":", 1)[1]))
    return ui, url


def _start_policies(cluster: Any, interval_max_ms: int, client_toml: Path | None = None,
                    offload: bool = True) -> Any:
    """Retention and offloading (every stream's policies) applied on their schedule, as a broker would."""
    from bookkeeper.security.settings import NO_SECURITY, load_client_settings
    from dlog.core.policies import PolicyLimits
    from dlog_tools.config import tier_options
    from dlog_tools.policies import PolicyThread

    security = load_client_settings(client_toml) if client_toml is not None else NO_SECURITY
    policies = PolicyThread(cluster.zk_address, bookkeeper_root=cluster.zk_root, security=security,
                            limits=PolicyLimits.at_most_every(interval_max_ms), offload=offload,
                            tier_options=tier_options())
    policies.start()
    return policies


def _print_ready(cluster: Any, ui_url: str | None, client_toml: Path | None = None,
                 server: ServeProcess | None = None) -> None:
    addresses = ",".join(bookie.address for bookie in cluster.bookies) or "-"
    kafka = f" kafka={server.kafka}" if server is not None else ""
    click.echo(f"dlog standalone ready zk={cluster.zk_address} bookies={addresses} dir={cluster.directory}{kafka}")
    if client_toml is not None and server is not None:
        click.echo(f"  Kafka clients: security.protocol=SASL_SSL, CA {client_toml.parent / 'ca.pem'}, SASL PLAIN "
                   "(a dlog token as password) or OAUTHBEARER (the token)")
    if client_toml is not None:
        click.echo(f"  client config {client_toml} (dlog --config {client_toml} ..., or "
                   f"export DLOG_CONFIG={client_toml}); admin token in {client_toml.parent / 'admin.token'}")
    if ui_url is not None:
        click.echo(f"  ui {ui_url}")
    for bookie in cluster.bookies:
        click.echo(f"  bookie {bookie.address} admin {bookie.http} data {bookie.data_dir}")
    sys.stdout.flush()


def _supervise(cluster: Any, stop: threading.Event, server: ServeProcess | None = None) -> None:
    """Until a signal: report each bookie and the server that exits (neither is restarted)."""
    while not stop.wait(0.5):
        if server is not None and not server.exit_reported and server.process.poll() is not None:
            click.echo(f"dlog serve exited with status {server.process.returncode}; see {server.log_path}", err=True)
            server.exit_reported = True
        for bookie in cluster.bookies:
            if bookie.process is not None and not bookie.running and not bookie.exit_reported:
                click.echo(f"bookie {bookie.address} exited with status {bookie.process.returncode}", err=True)
                bookie.exit_reported = True


@click.command("ui")
@zk_option
@click.option("--namespace-root", default="/dlog", show_default=True,
              help="ZooKeeper node whose children are the namespaces")
@click.option("--namespace", "namespaces", multiple=True, metavar="NAME",
              help="show only this namespace (repeat for more); default: every one, the first 50 by name")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=UI_PORT_DEFAULT, show_default=True, type=click.IntRange(0, 65535),
              help="port to listen on (0: any free port)")
@click.option("--insecure-plaintext", is_flag=True, help="serve the page (plaintext, no login) on a "
              "non-loopback --host anyway")
@fails_cleanly
def ui_command(zk: str, zk_root: str, namespace_root: str, namespaces: tuple[str, ...], host: str, port: int,
               insecure_plaintext: bool) -> None:
    """Serve the cluster status page (health, bookies, stream segments, subscription lag) until
    Ctrl-C; /?q=TEXT shows only the streams whose name contains TEXT. With --config (an admin's
    client.toml) it reads a secure cluster."""
    from bookkeeper.errors import ConfigError
    from bookkeeper.security.settings import load_client_settings
    from bookkeeper.security.tls import is_loopback
    from dlog_tools.ui import UiOptions, serve

    if not is_loopback(host) and not insecure_plaintext:
        raise ConfigError(f"the status page has no TLS and no login: serve it on 127.0.0.1, or pass "
                          f"--insecure-plaintext to serve it on {host} anyway")

    def on_ready(url: str) -> None:
        click.echo(f"dlog ui serving {url} (Ctrl-C stops it)")
        sys.stdout.flush()

    serve(UiOptions(zk, zk_root, namespace_root, security=load_client_settings(), namespaces=namespaces),
          host, port, on_ready)

