"""`dlog serve` and `dlog serve list`: a serving-tier server (streams to Kafka clients), and the
servers of a namespace with the streams each owns (docs/serving.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from typing import Any

import click

from dlog_tools.cli.common import cluster_options, fails_cleanly, json_option, print_table, run_namespace
from dlog_tools.units import DURATION, SIZE, format_time_ms

KAFKA_PORT_DEFAULT = 9092


@click.group("serve", invoke_without_command=True)
@cluster_options
@click.option("--kafka-port", default=KAFKA_PORT_DEFAULT, show_default=True, type=click.IntRange(0, 65535),
              help="port for Kafka clients (0: any free port)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address the Kafka port listens on")
@click.option("--advertised-host", default=None, show_default="--host",
              help="host clients are told to connect to (Metadata, FindCoordinator)")
@click.option("--id", "server_id", default=None, type=click.IntRange(0, 2**31 - 1),
              show_default="the lowest id no live server has", help="server id (the Kafka node id)")
@click.option("--session-timeout", default="6s", show_default=True, type=DURATION,
              help="ZooKeeper session timeout: a killed server's streams move after it")
@click.option("--auto-create-topics/--no-auto-create-topics", default=False, show_default=True,
              help="create a topic (one stream) on its first produce or metadata request")
@click.option("--ensemble", default=3, show_default=True, type=click.IntRange(1, 64),
              help="of the streams the server creates")
@click.option("--write-quorum", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--ack-quorum", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--tls-cert", default=None, help="PEM certificate: the Kafka port speaks TLS (SSL, SASL_SSL)")
@click.option("--tls-key", default=None, help="PEM private key of --tls-cert")
@click.option("--token-key", default=None,
              help="key that verifies dlog tokens (an HS256 secret file or a PEM public key): clients must "
                   "authenticate with SASL PLAIN (the token as password) or OAUTHBEARER (the token)")
@click.option("--allow-anonymous", is_flag=True,
              help="with --token-key: clients that skip SASL act as admin (asked for by name)")
@click.option("--insecure-plaintext", is_flag=True, help="serve without TLS on a non-loopback --host (asked for "
              "by name)")
@click.option("--auth-timeout", default="10s", show_default=True, type=DURATION,
              help="a connection's TLS handshake and SASL authentication end within this, or it is closed")
@click.option("--dedup-replay-bytes", default="8MiB", show_default=True, type=SIZE,
              help="per stream: records made durable between two stores of the producer dedup snapshot, "
                   "about what a new owner replays after a kill")
@click.option("--admin-port", default=-1, show_default=True, type=click.IntRange(-1, 65535),
              help="admin endpoint (/metrics: counters and every limit with its use; /health); 0: any free "
                   "port, -1: none")
@click.option("--admin-host", default="127.0.0.1", show_default=True,
              help="address of the admin endpoint (loopback only: it has no TLS nor tokens)")
@click.option("--offload/--no-offload", default=True, show_default=True,
              help="offload owned streams with a tier on their policy's schedule (--no-offload: leave it to "
                   "`dlog offload` and `dlog tier daemon`)")
@click.pass_context
@fails_cleanly
def serve(ctx: click.Context, cluster: tuple[str, str, str], kafka_port: int, host: str,
          advertised_host: str | None, server_id: int | None, session_timeout: int, auto_create_topics: bool,
          ensemble: int, write_quorum: int, ack_quorum: int, tls_cert: str | None, tls_key: str | None,
          token_key: str | None, allow_anonymous: bool, insecure_plaintext: bool, auth_timeout: int,
          dedup_replay_bytes: int, admin_port: int, admin_host: str, offload: bool) -> None:
    """Serve the namespace's streams to Kafka clients until SIGTERM or Ctrl-C, which hands the
    streams over cleanly. Prints `dlog serve ready id=ID kafka=HOST:PORT` once it accepts clients
    (with ` admin=URL` after it when it serves an admin endpoint).

    On a secure cluster give it the bookies' --tls-cert, --tls-key and --token-key: clients then
    connect with SASL_SSL (docs/serving.md, "Security")."""
    if ctx.invoked_subcommand is not None:
        return
    from dlog.server import ServerSettings
    from dlog.server.metrics import check_admin_host
    from dlog_tools.bookie_settings import server_security

    if admin_port >= 0:
        check_admin_host(admin_host)
    security = server_security(host, tls_cert, tls_key, None, False, token_key, allow_anonymous, insecure_plaintext,
                               what="a Kafka server")
    settings = ServerSettings(server_id=server_id, host=host, kafka_port=kafka_port, advertised_host=advertised_host,
                              session_timeout_s=session_timeout / 1000, auto_create_topics=auto_create_topics,
                              ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                              tls=security.tls, token_key=security.token_key,
                              allow_anonymous=security.allow_anonymous, auth_timeout_s=auth_timeout / 1000,
                              dedup_replay_bytes_max=dedup_replay_bytes, offload=offload)
    run_server(cluster, settings, admin=(admin_host, admin_port) if admin_port >= 0 else None)


def run_server(cluster: tuple[str, str, str], settings: Any, admin: tuple[str, int] | None = None) -> None:
    """Run one server in the foreground: the ready line, then until SIGTERM or SIGINT; `admin`:
    (host, port) of its admin endpoint (port 0: any free one)."""
    from bookkeeper.meta.zk import refuse_unreachable
    from bookkeeper.runtime import tune_garbage_collector
    from dlog import Namespace
    from dlog.server import KafkaServer
    from dlog.server.metrics import AdminEndpoint
    from dlog_tools.config import client_options, tier_options, zk_timeout_s

    zk, zk_root, namespace = cluster
    reach_tier = tier_options()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # the CLI silences it for one-line errors

    async def go() -> None:
        # as a bookie's: the tail's records and every request's objects are freed by reference
        # counting; the cycle collector's frequent passes over them only cost (docs/operations.md)
        tune_garbage_collector()
        await refuse_unreachable(zk)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with Namespace(zk, namespace, bookkeeper_root=zk_root, zk_timeout_s=zk_timeout_s(),
                             zk_session_timeout_s=settings.session_timeout_s, tier_options=reach_tier,
                             **client_options()) as ns:
            server = await KafkaServer(ns, settings).start()
            endpoint = AdminEndpoint(server)
            try:
                shown = "" if admin is None else f" admin={await endpoint.start(*admin)}"
                click.echo(f"dlog serve ready id={server.server_id} kafka={server.address}{shown}")
                sys.stdout.flush()
                await stop.wait()
            finally:
                await endpoint.stop()
                await server.stop()
        click.echo("dlog serve stopped")

    asyncio.run(go())


@serve.command("list")
@cluster_options
@json_option
@fails_cleanly
def serve_list(cluster: tuple[str, str, str], as_json: bool) -> None:
    """The live servers of the namespace and the streams each owns."""

    async def action(ns: Any) -> list[dict[str, Any]]:
        from dlog.server.registry import read_servers

        servers = await read_servers(ns.zk, ns.root)
        owned: dict[int, list[str]] = {server_id: [] for server_id in servers}
        for stream in await ns.list_streams():
            holder = await ns.store.lock_holder(stream)
            if holder and isinstance(holder.get("server"), int) and holder["server"] in owned:
                owned[holder["server"]].append(stream)
        return [{"id": info.server_id, "kafka": info.kafka, "pid": info.pid, "started_ms": info.started_ms,
                 "streams": sorted(owned[info.server_id])} for _, info in sorted(servers.items())]

    found = run_namespace(cluster, action)
    if as_json:
        click.echo(json.dumps({"servers": found}, sort_keys=True))
        return
    if not found:
        click.echo("no servers")
        return
    print_table(["id", "kafka", "pid", "started", "streams"],
                [{**row, "started": format_time_ms(row["started_ms"]), "streams": " ".join(row["streams"]) or "-"}
                 for row in found])
