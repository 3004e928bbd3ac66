"""The bookie's HTTP admin endpoint (aiohttp), served from the bookie's own event loop.

With token authentication on (the bookie's `--token-key`), every path but the open ones
(`--http-open-paths`, default /health and /metrics) needs `Authorization: Bearer <token>`:
reading needs any valid token, changing state (read-only switch, GC) the admin role. Bad bodies
get 400 with one line, never 500: invalid UTF-8, a charset other than UTF-8, malformed or deeply
nested JSON.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from bookkeeper.autorecovery.service import AutoRecovery
from bookkeeper.autorecovery.status import add_routes as add_autorecovery_routes
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.config import BookieConfig
from bookkeeper.bookie.metrics import BookieMetrics
from bookkeeper.bookie.storage import LedgerStorage
from bookkeeper.errors import AuthenticationError, DlogError
from bookkeeper.jsonbody import JSON_BODY_BYTES_MAX, BadBody, read_json
from bookkeeper.security.authz import Action, decide
from bookkeeper.security.tokens import TokenVerifier

LEDGER_PAGE_MAX = 10_000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdministeredBookie(Protocol):
    """What the admin endpoint reads and steers of a bookie (service.py's BookieService)."""

    config: BookieConfig
    bookie_id: str
    fatal_error: BaseException | None
    metrics: BookieMetrics
    core: BookieCore
    storage: LedgerStorage
    recovery_store: RecoveryStore | None
    autorecovery: AutoRecovery | None

    def describe(self) -> dict[str, Any]: ...

    def state_summary(self) -> dict[str, Any]: ...

    async def set_manual_read_only(self, read_only: bool) -> None: ...

    async def collect_garbage(self) -> dict[str, Any]: ...


SERVICE_KEY: web.AppKey[AdministeredBookie] = web.AppKey("service")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    if service.fatal_error is not None:
        return web.json_response({"status": "failed", "reason": str(service.fatal_error)},
                                 status=503)
    return web.json_response({"status": "ok", "bookie_id": service.bookie_id})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def info(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE_KEY].describe())


async def get_state(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE_KEY].state_summary())


async def put_state(request: web.Request) -> web.Response:
    try:
        body: Any = await read_json(request)
    except BadBody as exc:
        return _error(400, f'{exc}; send JSON like {{"read_only": true}}')
    if not isinstance(body, dict) or not isinstance(body.get("read_only"), bool) or len(body) != 1:
        return _error(400, f'body must be {{"read_only": true|false}}, got {body!r}')
    service = request.app[SERVICE_KEY]
    await service.set_manual_read_only(body["read_only"])
    return web.json_response(service.state_summary())


async def ledgers(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    try:
        limit = int(request.query.get("limit", "1000"))
        after = int(request.query.get("after", "-1"))
    except ValueError:
        return _error(400, "limit and after must be integers, e.g. ?limit=100&after=42")
    if not 1 <= limit <= LEDGER_PAGE_MAX:
        return _error(400, f"limit must be in 1..{LEDGER_PAGE_MAX}, got {limit}")
    ids = sorted(ledger_id for ledger_id in service.storage.ledger_ids() if ledger_id > after)
    page = [service.core.ledger_summary(ledger_id) for ledger_id in ids[:limit]]
    return web.json_response({"ledgers": [item for item in page if item is not None],
                              "more": len(ids) > limit})


async def run_gc(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    try:
        report = await service.collect_garbage()
    except DlogError as exc:
        return _error(503, f"garbage collection did not run: {exc}")
    return web.json_response(report)


def bearer_middleware(verifier: TokenVerifier, open_paths: tuple[str, ...]) -> Any:
    """Bearer tokens on every path but `open_paths`: GET needs a valid token, anything else the
    admin role (bookie state, GC)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized("send Authorization: Bearer <token> (see dlog token create)")
        try:
            principal = verifier.verify(token.strip())
        except AuthenticationError as exc:
            return _unauthorized(str(exc))
        action = Action.INFO if request.method in ("GET", "HEAD") else Action.BOOKIE_ADMIN
        reason = decide(principal, action)
        if reason is not None:
            return _error(403, reason)
        return await handler(request)

    return check


def _unauthorized(message: str) -> web.Response:
    response = _error(401, message)
    response.headers["WWW-Authenticate"] = 'Bearer realm="dlog"'
    return response


def make_app(service: AdministeredBookie) -> web.Application:
    middlewares = []
    key = service.config.security.token_key
    if key is not None:
        middlewares.append(bearer_middleware(TokenVerifier(key), service.config.http_open_paths))
    app = web.Application(middlewares=middlewares, client_max_size=JSON_BODY_BYTES_MAX)
    app[SERVICE_KEY] = service
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/bookie/info", info)
    app.router.add_get("/api/v1/bookie/state", get_state)
    app.router.add_put("/api/v1/bookie/state", put_state)
    app.router.add_get("/api/v1/ledgers", ledgers)
    app.router.add_post("/api/v1/gc", run_gc)
    add_autorecovery_routes(
        app, lambda: service.recovery_store,
        lambda: service.autorecovery.local_status() if service.autorecovery is not None else None)
    return app
