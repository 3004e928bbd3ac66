"""What operators see of auto-recovery: the cluster's status and the marked ledgers (for
`dlog autorecovery`, the HTTP admin `/api/v1/autorecovery/...` and the status page), and the
HTTP routes that serve them on a bookie or a `dlog autorecovery` process."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.clock import wall_ms
from bookkeeper.errors import DlogError
from bookkeeper.jsonbody import BadBody, read_json

LIST_LIMIT_MAX = 10_000


async def cluster_status(store: RecoveryStore) -> dict[str, Any]:
    """`{"enabled", "auditor", "underreplicated", "repairing", "audit"}`."""
    return {"enabled": await store.enabled(), "auditor": await store.auditor(),
            "underreplicated": await store.count_marks(),
            "repairing": {str(ledger_id): worker for ledger_id, worker in (await store.locks()).items()},
            "audit": await store.audit_state()}


async def underreplicated(store: RecoveryStore, limit: int = 1000) -> list[dict[str, Any]]:
    """One object per marked ledger, in ledger order: `ledger`, `missing` bookies and the rest."""
    locks = await store.locks()
    result = []
    for mark in await store.marks(limit):
        result.append({"ledger": mark.ledger_id, "missing": mark.bookies,
                       "reasons": {m.bookie: m.reason.value for m in mark.missing},
                       "since_ms": mark.ctime_ms,
                       "replacements": [{"fragment": first, "bookie": old, "replacement": new}
                                        for first, old, new in mark.targets],
                       "progress": dict(mark.progress), "error": mark.error or None,
                       "worker": locks.get(mark.ledger_id)})
    return result


# ---------------------------------------------------------------------------------- HTTP

STORE_KEY: web.AppKey[Callable[[], RecoveryStore | None]] = web.AppKey("recovery_store")
LOCAL_KEY: web.AppKey[Callable[[], dict[str, Any] | None]] = web.AppKey("recovery_local")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _store(request: web.Request) -> RecoveryStore:
    store = request.app[STORE_KEY]()
    if store is None:
        raise web.HTTPServiceUnavailable(
            text=json.dumps({"error": "auto-recovery needs ZooKeeper (start the bookie with --zk)"}),
            content_type="application/json")
    return store


async def _status(request: web.Request) -> web.Response:
    try:
        status = await cluster_status(_store(request))
    except DlogError as exc:
        return _error(503, f"auto-recovery status unavailable: {exc}")
    status["local"] = request.app[LOCAL_KEY]()
    return web.json_response(status)


async def _list(request: web.Request) -> web.Response:
    try:
        limit = int(request.query.get("limit", "1000"))
    except ValueError:
        return _error(400, "limit must be an integer, e.g. ?limit=100")
    if not 1 <= limit <= LIST_LIMIT_MAX:
        return _error(400, f"limit must be in 1..{LIST_LIMIT_MAX}, got {limit}")
    try:
        return web.json_response({"ledgers": await underreplicated(_store(request), limit)})
    except DlogError as exc:
        return _error(503, f"cannot list under-replicated ledgers: {exc}")


async def _trigger(request: web.Request) -> web.Response:
    body: Any = {}
    if request.can_read_body:
        try:
            body = await read_json(request)
        except BadBody as exc:
            return _error(400, f'{exc}; send JSON like {{"replica_check": true}}, or no body')
    if not isinstance(body, dict) or set(body) - {"replica_check"} or not isinstance(
            body.get("replica_check", False), bool):
        return _error(400, f'body must be {{"replica_check": true|false}} or empty, got {body!r}')
    replica_check = bool(body.get("replica_check", False))
    try:
        await _store(request).trigger_audit(replica_check, wall_ms())
    except DlogError as exc:
        return _error(503, f"audit not triggered: {exc}")
    return web.json_response({"triggered": True, "replica_check": replica_check})


def _switch(enabled: bool) -> Callable[[web.Request], Any]:
    async def handler(request: web.Request) -> web.Response:
        store = _store(request)
        try:
            await store.set_enabled(enabled)
            return web.json_response({"enabled": await store.enabled()})
        except DlogError as exc:
            return _error(503, f"auto-recovery not {'enabled' if enabled else 'disabled'}: {exc}")

    return handler


def add_routes(app: web.Application, store: Callable[[], RecoveryStore | None],
               local: Callable[[], dict[str, Any] | None]) -> None:
    app[STORE_KEY] = store
    app[LOCAL_KEY] = local
    app.router.add_get("/api/v1/autorecovery/status", _status)
    app.router.add_get("/api/v1/autorecovery/list_underreplicated", _list)
    app.router.add_post("/api/v1/autorecovery/trigger_audit", _trigger)
    app.router.add_post("/api/v1/autorecovery/enable", _switch(True))
    app.router.add_post("/api/v1/autorecovery/disable", _switch(False))
