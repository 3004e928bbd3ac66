"""The bookie's guard without sockets: AUTH first or the connection closes, expired tokens end the
connection (expiry and quota refreshes go by the guard's clock), each request is authorized against
its ledger's namespace (looked up once, requests waiting in order), a ledger without metadata is
refused, and lookups are bounded."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper.bookie.guard import QUOTA_REFRESH_S, Guard, ServerSecurity
from bookkeeper.clock import SYSTEM_CLOCK, Clock, ManualClock, wall_ms
from bookkeeper.errors import NoSuchLedgerError
from bookkeeper.protocol.wire import (
    AddRequest,
    AuthMechanism,
    AuthRequest,
    BookieInfoRequest,
    ReadRequest,
    ResponseDecoder,
    Status,
)
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


def make_guard(namespaces: dict[int, str | None], known: set[int] = frozenset(), pending_max: int = 100,
               clock: Clock = SYSTEM_CLOCK):
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
                  pending_max=pending_max, clock=clock)
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
    clock = ManualClock(wall_ms=wall_ms())
    guard, ran, _ = make_guard({7: "orders"}, known={7}, clock=clock)
    connection = FakeConnection()
    auth(guard, connection, ["consume:orders"], ttl_s=60)
    guard.dispatch(ReadRequest(29, 7, 0), connection)
    await asyncio.sleep(0.01)
    assert ran == [29]
    clock.advance(61)  # on the guard's clock only: the token outlived its 60 s
    guard.dispatch(ReadRequest(30, 7, 0), connection)
    assert connection.answers[-1].status == Status.UNAUTHENTICATED and connection.closing and ran == [29]


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


async def test_over_its_stored_quota_a_namespace_gets_no_new_data_and_only_the_cluster_copies():
    """Recovery adds of a producer count like any add (a RECOVERY_ADD can carry new entries: issue
    20 put 8 MiB past a quota so); re-replication by bookies and admins' copies go on. A quota
    raised later lets the namespace in again without a restart."""
    from bookkeeper.security.quota import Quota

    ran = []
    quotas = {"ns": Quota(stored_bytes_max=1000)}

    def handler(request, connection) -> None:
        ran.append(request.request_id)
        connection.request_done()

    async def lookup(ledger_id: int) -> str | None:
        return "ns"

    async def quota(namespace: str) -> Quota:
        return quotas[namespace]

    clock = ManualClock(wall_ms=wall_ms())
    guard = Guard(ServerSecurity(token_key=KEY), {AddRequest: handler}, lookup, lambda ledger_id: False,
                  quota_lookup=quota, clock=clock)
    producer, bookie = FakeConnection(), FakeConnection()
    auth(guard, producer, ["produce:ns"])
    auth(guard, bookie, ["bookie"])
    guard.set_stored_usage({"ns": 1000})
    guard.dispatch(AddRequest(2, 7, 0, b"k" * 32, b"e" * 100), producer)  # goes on: the quota is not read yet
    for _ in range(100):  # the guard reads the quota in the background after that first add
        if guard.over_quota("ns", 7) is not None:
            break
        await asyncio.sleep(0.01)
    guard.dispatch(AddRequest(3, 7, 1, b"k" * 32, b"e" * 100), producer)
    guard.dispatch(AddRequest(4, 7, 2, b"k" * 32, b"e" * 100, recovery=True), producer)
    guard.dispatch(AddRequest(5, 7, 0, b"k" * 32, b"e" * 100, recovery=True), bookie)
    assert ran == [2, 5]  # the producer's new entry and its "recovery" add refused; the bookie's copy went on
    refused = {answer.request_id: answer for answer in producer.answers if getattr(answer, "request_id", 0) in (3, 4)}
    assert refused[3].status == Status.QUOTA_EXCEEDED and "stored_bytes_max 1000" in refused[3].message
    assert refused[4].status == Status.QUOTA_EXCEEDED
    quotas["ns"] = Quota(stored_bytes_max=10_000)
    clock.advance(QUOTA_REFRESH_S + 1)  # the cached quota is older than its refresh interval:
    guard.dispatch(AddRequest(6, 7, 1, b"k" * 32, b"e" * 100), producer)  # the next add reads it again
    for _ in range(100):
        if guard.over_quota("ns", 7) is None:
            break
        await asyncio.sleep(0.01)
    guard.dispatch(AddRequest(7, 7, 1, b"k" * 32, b"e" * 100), producer)
    assert ran[-1] == 7
