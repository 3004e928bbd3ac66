"""The bookie's guard without sockets: AUTH first or the connection closes, expired tokens end the
connection, each request is authorized against its ledger's namespace (looked up once, requests
waiting in order), a ledger without metadata is refused, and lookups are bounded."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper.bookie.guard import Guard, ServerSecurity
from bookkeeper.errors import NoSuchLedgerError
from bookkeeper.protocol.wire import (AddRequest, AuthMechanism, AuthRequest, BookieInfoRequest,
                                      ReadRequest, ResponseDecoder, Status)
from bookkeeper.security.tokens import TokenKey, create_token

KEY = TokenKey("HS256", b"g" * 32)


class FakeConnection:
    def __init__(self) -> None:
        self.principal = None
        self.closed = False
        self.closing = False
        self.answers = []
        self.done = 0
        self.peer = "test:1"

    def send(self, frame: bytes) -> None:
        decoder = ResponseDecoder()
        decoder.receive_data(frame)
        self.answers.append(decoder.next_message())

    def request_done(self) -> None:
        self.done += 1

    def close_after_answer(self) -> None:
        self.closing = True

    def peer_certificate(self):
        return None

    def throttle(self, delay_s: float) -> None:
        pass


def make_guard(namespaces: dict[int, str | None], known: set[int] = frozenset(), pending_max: int = 100):
    ran = []
    lookups = []

    async def lookup(ledger_id: int) -> str | None:
        lookups.append(ledger_id)
        await asyncio.sleep(0)
        if ledger_id not in namespaces:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        return namespaces[ledger_id]

    def handler(request, connection) -> None:
        ran.append(request.request_id)
        connection.request_done()

    handlers = {AddRequest: handler, ReadRequest: handler, BookieInfoRequest: handler}
    guard = Guard(ServerSecurity(token_key=KEY), handlers, lookup, lambda ledger_id: ledger_id in known,
                  pending_max=pending_max)
    return guard, ran, lookups


def auth(guard: Guard, connection: FakeConnection, roles: list[str], **token_options) -> None:
    token = create_token(KEY, "p", roles, **token_options)
    guard.dispatch(AuthRequest(1, AuthMechanism.TOKEN, token.encode()), connection)


async def test_a_request_before_auth_is_refused_and_closes():
    guard, ran, _ = make_guard({})
    connection = FakeConnection()
    guard.dispatch(BookieInfoRequest(5), connection)
    assert connection.answers[0].status == Status.UNAUTHENTICATED and connection.closing
    assert ran == [] and connection.done == 1


async def test_requests_wait_for_one_lookup_in_order_then_are_authorized():
    guard, ran, lookups = make_guard({7: "orders"})
    connection = FakeConnection()
    auth(guard, connection, ["consume:orders"])
    for request_id in (10, 11, 12):
        guard.dispatch(ReadRequest(request_id, 7, 0), connection)
    assert ran == []
    await asyncio.sleep(0.01)
    assert ran == [10, 11, 12] and lookups == [7]
    guard.dispatch(ReadRequest(13, 7, 0), connection)  # cached: no second lookup
    assert ran == [10, 11, 12, 13] and lookups == [7]
    guard.dispatch(AddRequest(14, 7, 0, b"k" * 32, b""), connection)  # consume may not add
    assert connection.answers[-1].status == Status.FORBIDDEN and 14 not in ran


async def test_a_ledger_without_metadata_is_refused_even_for_an_admin():
    guard, ran, _ = make_guard({}, known=set())
    connection = FakeConnection()
    auth(guard, connection, ["admin"])
    guard.dispatch(AddRequest(20, 99, 0, b"k" * 32, b""), connection)
    guard.dispatch(ReadRequest(21, 99, -1, True, b"k" * 32), connection)
    await asyncio.sleep(0.01)
    assert ran == [] and [a.status for a in connection.answers[1:]] == [Status.NO_LEDGER] * 2
    guard.dispatch(ReadRequest(22, 99, 0), connection)  # a plain read of an admin needs no lookup
    assert ran == [22]


async def test_an_expired_token_ends_the_connection_at_its_next_request():
    import time

    guard, ran, _ = make_guard({7: "orders"})
    connection = FakeConnection()
    auth(guard, connection, ["consume:orders"], ttl_s=60)
    connection.principal = type(connection.principal)(connection.principal.name, connection.principal.roles,
                                                      time.time() - 1)
    guard.dispatch(ReadRequest(30, 7, 0), connection)
    assert connection.answers[-1].status == Status.UNAUTHENTICATED and connection.closing and ran == []


async def test_waiting_for_lookups_is_bounded():
    guard, ran, _ = make_guard({7: "orders"}, pending_max=2)
    connection = FakeConnection()
    auth(guard, connection, ["consume:orders"])
    for request_id in (40, 41, 42):
        guard.dispatch(ReadRequest(request_id, 7, 0), connection)
    assert connection.answers[-1].status == Status.TOO_MANY_REQUESTS
    await asyncio.sleep(0.01)
    assert ran == [40, 41]


@pytest.mark.parametrize("credentials", [b"", b"\xff\xfe", b"a.b.c"])
async def test_bad_credentials_are_refused_and_close(credentials):
    guard, _, _ = make_guard({})
    connection = FakeConnection()
    guard.dispatch(AuthRequest(1, AuthMechanism.TOKEN, credentials), connection)
    assert connection.answers[0].status == Status.UNAUTHENTICATED and connection.closing
    assert connection.principal is None


async def test_over_its_stored_quota_a_namespace_gets_no_new_data_but_recovery_adds_go_on():
    from bookkeeper.security.quota import Quota

    ran = []

    def handler(request, connection) -> None:
        ran.append(request.request_id)
        connection.request_done()

    async def lookup(ledger_id: int) -> str | None:
        return "ns"

    async def quota(namespace: str) -> Quota:
        return Quota(stored_bytes_max=1000)

    guard = Guard(ServerSecurity(token_key=KEY), {AddRequest: handler}, lookup, lambda ledger_id: False,
                  quota_lookup=quota)
    connection = FakeConnection()
    auth(guard, connection, ["produce:ns"])
    guard.set_stored_usage({"ns": 1000})
    guard.dispatch(AddRequest(2, 7, 0, b"k" * 32, b"e" * 100), connection)  # goes on: the quota is not read yet
    for _ in range(100):  # the guard reads the quota in the background after that first add
        if guard.over_quota("ns", 7) is not None:
            break
        await asyncio.sleep(0.01)
    guard.dispatch(AddRequest(3, 7, 1, b"k" * 32, b"e" * 100), connection)
    guard.dispatch(AddRequest(4, 7, 0, b"k" * 32, b"e" * 100, recovery=True), connection)
    assert ran == [2, 4]  # the new entry refused; the recovery add (data already counted) went on
    refused = [answer for answer in connection.answers if getattr(answer, "request_id", None) == 3]
    assert refused[0].status == Status.QUOTA_EXCEEDED and "stored_bytes_max 1000" in refused[0].message
