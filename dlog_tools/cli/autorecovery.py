"""`dlog autorecovery [status|list-underreplicated|trigger-audit|enable|disable]` and
`dlog bookie decommission ID`: run, watch and steer auto-recovery (docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from typing import Any

import click

from bookkeeper.errors import ConfigError, DlogError
from dlog_tools.bookie_settings import pop_recovery, recovery_options, recovery_settings
from dlog_tools.cli.common import (
    fails_cleanly,
    json_option,
    print_table,
    run_with_client,
    with_zk,
    zk_option,
)
from dlog_tools.units import DURATION, format_time_ms, plural


@click.group(invoke_without_command=True)
@zk_option
@click.option("--id", "identity", default=None,
              help="name of this process as auditor candidate and worker (default autorecovery-HOST-PID)")
@click.option("--zk-session-timeout", default=10.0, show_default=True, type=click.FloatRange(1, 60),
              help="seconds without ZooKeeper before this process's session (its ledger locks, its "
                   "auditor election) expires")
@click.option("--host", default="127.0.0.1", show_default=True, help="address of the admin endpoint")
@click.option("--http-port", default=-1, show_default=True, type=click.IntRange(-1, 65535),
              help="admin endpoint (/metrics, /health, /api/v1/autorecovery/...); 0: any free port, "
                   "-1: none")
@recovery_options
@click.pass_context
@fails_cleanly
def autorecovery(ctx: click.Context, **_: Any) -> None:
    """Run auto-recovery as a process of its own (an auditor candidate and a replication worker),
    until SIGINT or SIGTERM; or, with a subcommand, inspect and steer it. The --config file's
    [autorecovery] table may set any of these options (flags and DLOG_BOOKIE_* variables override it).

    Bookies run the same in their own process by default (`dlog bookie start --no-autorecovery`
    turns that off); one auditor is elected per cluster, every worker repairs marked ledgers."""
    if ctx.invoked_subcommand is not None:
        return
    from dlog_tools.config import layered_params

    params = layered_params(ctx, "autorecovery", "DLOG_BOOKIE_")
    settings = recovery_settings(pop_recovery(params))
    identity = params["identity"] or f"autorecovery-{socket.gethostname()}-{os.getpid()}"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    sys.exit(asyncio.run(_serve(params["zk"], params["zk_root"], params["zk_session_timeout"], settings,
                                identity, params["host"], params["http_port"])))


async def _serve(zk: str, zk_root: str, session_timeout_s: float, settings: Any, identity: str, host: str,
                 http_port: int) -> int:
    from aiohttp import web
    from prometheus_client import generate_latest

    from bookkeeper.autorecovery.service import AutoRecovery
    from bookkeeper.autorecovery.status import add_routes
    from bookkeeper.jsonbody import JSON_BODY_BYTES_MAX
    from bookkeeper.meta.acl import zk_options
    from bookkeeper.meta.zk import AsyncZooKeeper
    from bookkeeper.security.settings import load_client_settings
    from bookkeeper.security.tls import is_loopback
    from dlog_tools.config import zk_timeout_s

    if http_port >= 0 and not is_loopback(host):
        raise ConfigError(f"the admin endpoint of `dlog autorecovery` has no TLS nor tokens: serve it on a "
                          f"loopback --host (not {host}), or use a bookie's admin endpoint")
    # the process's own identity (client.toml: ZooKeeper credentials for ACLs; TLS and a token or
    # client certificate of the bookie or admin role for the bookies)
    security = load_client_settings()
    client = AsyncZooKeeper(zk, timeout_s=zk_timeout_s(), session_timeout_s=session_timeout_s,
                            **zk_options(security, zk_root))
    await client.start()
    recovery = AutoRecovery(client, zk_root, settings, identity, security=security)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = None
    try:
        await recovery.start()
        url = "-"
        if http_port >= 0:
            app = web.Application(client_max_size=JSON_BODY_BYTES_MAX)

            async def metrics(request: web.Request) -> web.Response:
                return web.Response(body=generate_latest(recovery.registry),
                                    headers={"Content-Type": "text/plain; version=0.0.4"})

            async def health(request: web.Request) -> web.Response:
                return web.json_response({"status": "ok", "id": identity})

            app.router.add_get("/metrics", metrics)
            app.router.add_get("/health", health)
            add_routes(app, lambda: recovery.store, recovery.local_status)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, http_port)
            await site.start()
            url = f"http://{host}:{runner.addresses[0][1]}"
        click.echo(f"autorecovery ready id={identity} http={url}")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await recovery.stop()
        if runner is not None:
            await runner.cleanup()
        await client.close()
    return 0


def _store_action(zk: str, zk_root: str, action: Any) -> Any:
    from bookkeeper.autorecovery.store import RecoveryStore

    return asyncio.run(with_zk(zk, lambda client: action(RecoveryStore(client, zk_root))))


@autorecovery.command("status")
@zk_option
@json_option
@fails_cleanly
def status_command(zk: str, zk_root: str, as_json: bool) -> None:
    """Enabled or not, the auditor, how many ledgers are under-replicated, who repairs what."""
    from bookkeeper.autorecovery.status import cluster_status

    status = _store_action(zk, zk_root, cluster_status)
    if as_json:
        click.echo(json.dumps(status, sort_keys=True))
        return
    audit = status["audit"]
    click.echo(f"{'enabled':16} {'yes' if status['enabled'] else 'NO (dlog autorecovery enable)'}")
    click.echo(f"{'auditor':16} {status['auditor'] or 'none elected'}")
    click.echo(f"{'underreplicated':16} {plural(status['underreplicated'], 'ledger')}")
    for ledger_id, worker in sorted(status["repairing"].items()):
        click.echo(f"{'repairing':16} ledger {ledger_id} by {worker}")
    for scan in ("ensembles", "replicas"):
        finished = audit.get(scan, {}).get("finished_ms")
        click.echo(f"{'last ' + scan + ' scan':16} {format_time_ms(finished, 'seconds') if finished else 'never'}")


@autorecovery.command("list-underreplicated")
@zk_option
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 10_000))
@json_option
@fails_cleanly
def list_command(zk: str, zk_root: str, limit: int, as_json: bool) -> None:
    """Ledgers marked under-replicated: the bookies missing, since when, repair progress."""
    from bookkeeper.autorecovery.status import underreplicated

    rows = _store_action(zk, zk_root, lambda store: underreplicated(store, limit))
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, sort_keys=True))
        return
    table = []
    for row in rows:
        progress = row["progress"]
        table.append({"ledger": row["ledger"],
                      "missing": ", ".join(f"{b} ({row['reasons'][b]})" for b in row["missing"]),
                      "since": format_time_ms(row["since_ms"], "seconds"), "worker": row["worker"],
                      "copied": (f"{progress['copied_entries']}/{progress['total_entries']}"
                                 if progress else None), "error": row["error"]})
    print_table(["ledger", "missing", "since", "worker", "copied", "error"], table)


@autorecovery.command("trigger-audit")
@zk_option
@click.option("--replica-check", is_flag=True, help="also check every replica's presence and checksum")
@json_option
@fails_cleanly
def trigger_command(zk: str, zk_root: str, replica_check: bool, as_json: bool) -> None:
    """Ask the auditor to check every ledger now (instead of at its next interval)."""
    from bookkeeper.clock import wall_ms

    _store_action(zk, zk_root, lambda store: store.trigger_audit(replica_check, wall_ms()))
    click.echo(json.dumps({"triggered": True, "replica_check": replica_check}) if as_json else
               f"audit requested{' with a replica check' if replica_check else ''}")


def _switch(enabled: bool) -> Any:
    @zk_option
    @json_option
    @fails_cleanly
    def command(zk: str, zk_root: str, as_json: bool) -> None:
        async def action(store: Any) -> None:
            await store.set_enabled(enabled)

        _store_action(zk, zk_root, action)
        click.echo(json.dumps({"enabled": enabled}) if as_json else
                   f"auto-recovery {'enabled' if enabled else 'disabled: nothing is marked or repaired'}")

    return command


autorecovery.command("enable", help="Let the auditor mark and the workers repair (the default).")(_switch(True))
autorecovery.command("disable", help="Stop marking and repairing (e.g. during maintenance); "
                                     "bookies gone meanwhile are audited once enabled again.")(_switch(False))


@click.command("decommission")
@click.argument("bookie_id")
@zk_option
@click.option("--timeout", default="1h", show_default=True, type=DURATION,
              help="give up waiting for re-replication after this long (the bookie stays as it is)")
@json_option
@fails_cleanly
def decommission_command(bookie_id: str, zk: str, zk_root: str, timeout: int, as_json: bool) -> None:
    """Retire a bookie: turn it read-only, re-replicate everything it holds elsewhere, wait until no
    ledger names it, then remove its cookie and registration (the bookie then stops).

    Refuses, with the reason, when the other writable bookies would be fewer than an ensemble size
    in use. Needs auto-recovery running (in the bookies or `dlog autorecovery`)."""
    from bookkeeper.autorecovery.decommission import Progress, decommission
    from bookkeeper.autorecovery.store import RecoveryStore

    async def set_read_only(url: str) -> None:
        await _http_put_json(url + "/api/v1/bookie/state", {"read_only": True})

    def progress(step: Progress) -> None:
        if not as_json:
            click.echo(f"{step.seconds:6.0f} s: {plural(step.remaining, 'ledger')} still name {bookie_id}", err=True)

    async def action(client: Any) -> dict[str, Any]:
        store = RecoveryStore(client.store.zk, zk_root)
        return await decommission(client, store, bookie_id, set_read_only=set_read_only,
                                  timeout_s=timeout / 1000, on_progress=progress)

    result = run_with_client(zk, zk_root, action)
    click.echo(json.dumps(result, sort_keys=True) if as_json else
               f"decommissioned {bookie_id}: {plural(result['ledgers'], 'ledger')} re-replicated in "
               f"{result['seconds']} s")


async def _http_put_json(url: str, body: dict[str, Any]) -> Any:
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
                session.put(url, json=body) as response:
            answer = await response.json()
            if response.status != 200:
                raise DlogError(f"{url} answered {response.status}: {answer.get('error', answer)}")
            return answer
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise DlogError(f"cannot reach {url}: {exc!r}") from exc
