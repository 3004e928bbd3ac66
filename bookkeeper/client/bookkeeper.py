"""The client facade: create, open (with or without recovery), delete and list ledgers.

    async with BookKeeper(zk="127.0.0.1:2181") as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        entry_id = await lh.append(b"payload")
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        entries = await rh.read(0, rh.last_add_confirmed)
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

from bookkeeper.client.connection import ConnectSecurity, Dial
from bookkeeper.client.ledger import LedgerHandle, ReadHandle, RecoveryDriver
from bookkeeper.client.placement import choose_ensemble
from bookkeeper.client.pool import BookiePool
from bookkeeper.client.settings import ClientSettings, DriverContext
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import (
    AuthenticationError,
    ConfigError,
    DlogError,
    ForbiddenError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from bookkeeper.meta import layout
from bookkeeper.meta.store import BookieInfo, MetadataStore
from bookkeeper.protocol.entry import Digest, DigestType, master_key
from bookkeeper.protocol.metadata import LedgerMetadata, check_quorum, password_hash
from bookkeeper.protocol.recovery import RecoveryOp
from bookkeeper.protocol.writer import LedgerWriter
from bookkeeper.retry import Backoff, retry
from bookkeeper.security.settings import SecuritySettings, load_client_settings

log = logging.getLogger(__name__)
RECOVERY_RETRY = Backoff(attempts_max=5, delay_s_first=0.2, delay_s_max=2.0)
CREATE_RETRY = Backoff(attempts_max=10, delay_s_first=0.05, delay_s_max=1.0, deadline_s=30.0)


class BookKeeper:
    # what runs one recovery attempt of `open_ledger` (the ledger simulator sets one that records each)
    recovery_driver: type[RecoveryDriver] = RecoveryDriver

    def __init__(self, zk: str | None = None, *, root: str = layout.DEFAULT_ROOT,
                 store: MetadataStore | None = None, rng: random.Random | None = None,
                 add_timeout_s: float = 5.0, read_timeout_s: float = 5.0,
                 speculative_read_ms: int = 500, explicit_lac_interval_ms: int = 50,
                 eager_lac: bool = True,
                 tick_interval_s: float = 0.05, pending_adds_max: int = 10_000,
                 zk_timeout_s: float = 10.0, security: SecuritySettings | None = None,
                 clock: Clock = SYSTEM_CLOCK, dial: Dial | None = None) -> None:
        """`security`: TLS, token and ZooKeeper credentials; default: read from $DLOG_CONFIG
        (client.toml) and $DLOG_TOKEN when set, else none (an open cluster on loopback).
        `rng`, `clock` and `dial` (how bookies are connected to, TCP by default) are the seams a
        simulation replaces: every random draw, time reading and connection goes through them."""
        if zk is None and store is None:
            raise ConfigError("BookKeeper needs zk='host:port' or a metadata store")
        self._zk = zk
        self._root = root
        self.store: MetadataStore = store  # type: ignore[assignment]  # set in start() if None
        self.rng = rng or random.Random()
        self.clock = clock
        self.settings = ClientSettings(add_timeout_s, read_timeout_s, speculative_read_ms,
                                       explicit_lac_interval_ms, eager_lac, tick_interval_s,
                                       pending_adds_max, zk_timeout_s)
        self.security = security if security is not None else load_client_settings()
        self.pool = BookiePool(self._address_of, timeout_s=max(add_timeout_s, read_timeout_s) + 1,
                               security=connect_security(self.security), clock=clock, dial=dial)
        self.context: DriverContext = None  # type: ignore[assignment]  # set in start()
        self._bookies: dict[str, BookieInfo] = {}
        self._writable_watchers: list[Callable[[list[str]], None]] = []
        self._unwatch: Callable[[], None] | None = None

    async def start(self) -> BookKeeper:
        if self.store is None:
            from bookkeeper.meta.acl import zk_options
            from bookkeeper.meta.zkstore import ZooKeeperMetadataStore

            self.store = await ZooKeeperMetadataStore.connect(self._zk, self._root,
                                                              timeout_s=self.settings.zk_timeout_s,
                                                              **zk_options(self.security, self._root))
        self.context = DriverContext(self.pool, self.store, self.settings, self.watch_writable,
                                     self.clock, self.rng.random)
        self._unwatch = self.store.watch_bookies(self._on_bookies)
        self._on_bookies(await self.store.bookies())
        if self.pool.security.authenticates and self._bookies:
            await self._check_credentials()
        return self

    async def _check_credentials(self) -> None:
        """Connect to one bookie now, so bad TLS settings or a refused token fail here with the
        bookie's reason instead of as bookie failures later (the connection is kept for use)."""
        from bookkeeper.protocol.wire import BookieInfoRequest

        bookie_id = sorted(self._bookies)[0]
        try:
            await self.pool.send(bookie_id, BookieInfoRequest(self.pool.next_request_id()))
        except (AuthenticationError, ForbiddenError):
            await self.close()
            raise
        except DlogError as exc:  # unreachable: writes will route around it
            log.debug("credential check with bookie %s failed: %s", bookie_id, exc)

    async def close(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
        await self.pool.close()
        await self.store.close()

    async def __aenter__(self) -> BookKeeper:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ bookies

    def _on_bookies(self, bookies: list[BookieInfo]) -> None:
        self._bookies = {info.bookie_id: info for info in bookies}
        writable = self.writable_bookies()
        for watcher in list(self._writable_watchers):
            watcher(writable)

    def _address_of(self, bookie_id: str) -> str:
        info = self._bookies.get(bookie_id)
        return info.address if info is not None else bookie_id

    def writable_bookies(self) -> list[str]:
        return sorted(bookie_id for bookie_id, info in self._bookies.items() if info.writable)

    def watch_writable(self, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        self._writable_watchers.append(callback)
        return lambda: self._writable_watchers.remove(callback)

    # ------------------------------------------------------------------ ledgers

    async def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
                            password: bytes = b"", digest: DigestType = DigestType.CRC32C,
                            custom: dict[str, str] | None = None,
                            bookies: Sequence[str] | None = None) -> LedgerHandle:
        """A new ledger on `ensemble` bookies chosen by placement, or on exactly `bookies` (ids) when
        given (`dlog cluster check` writes through each bookie that way)."""
        check_quorum(ensemble, write_quorum, ack_quorum)
        if bookies is not None:
            if len(set(bookies)) != ensemble:
                raise ConfigError(f"an ensemble of {ensemble} needs {ensemble} distinct bookies, got {list(bookies)}")
            bookies = tuple(bookies)
        else:
            bookies = choose_ensemble(self._bookies.values(), ensemble, self.rng)
        metadata = LedgerMetadata(ensemble, write_quorum, ack_quorum, ((0, bookies),),
                                  digest_type=digest, password_hash=password_hash(password),
                                  ctime_ms=self.clock.wall_ms(),
                                  custom=tuple(sorted((custom or {}).items())),
                                  master_key=master_key(password).hex())
        writers = self.store.ledger_writers(dict(metadata.custom).get("namespace"))
        if writers is None:
            ledger_id, version = await self.store.create_ledger(metadata)
        else:
            ledger_id, version = await self._create_through_bookie(metadata, writers, bookies)
        writer = LedgerWriter(ledger_id, metadata, version, Digest.for_ledger(digest, password),
                              available_bookies=self.writable_bookies(), rng=self.rng,
                              add_timeout_ms=self.settings.add_timeout_ms,
                              explicit_lac_interval_ms=self.settings.explicit_lac_interval_ms,
                              eager_lac=self.settings.eager_lac)
        return LedgerHandle(self.context, ledger_id, writer, master_key(password))

    async def _create_through_bookie(self, metadata: LedgerMetadata, writers: list[str],
                                     ensemble: Sequence[str]) -> tuple[int, int]:
        """With ZooKeeper ACLs only bookies and admins create ledger nodes (acl.py): a bookie of the
        ensemble (or any other writable one) creates it, after checking our role. A bookie that is
        unreachable or busy is passed over; a refusal (forbidden, bad metadata) is final."""
        from bookkeeper.protocol.create import CreateLedgerRequest

        data = metadata.to_bytes()
        candidates = list(dict.fromkeys([*ensemble, *self.writable_bookies()]))

        async def attempt() -> tuple[int, int]:
            failure: DlogError = NotEnoughBookiesError("no bookie is registered to create the ledger")
            for bookie_id in candidates:
                request = CreateLedgerRequest(self.pool.next_request_id(), data, tuple(writers))
                try:
                    response = await self.pool.send(bookie_id, request)
                except DlogError as exc:
                    if not exc.retryable:
                        raise
                    failure = exc
                    continue
                return response.ledger_id, 0
            raise failure

        return await retry(attempt, CREATE_RETRY, what="ledger creation through a bookie",
                           rng=self.rng.random, clock=self.clock)

    async def open_ledger(self, ledger_id: int, *, password: bytes = b"",
                          recovery: bool = True) -> ReadHandle:
        """Open for reading. With recovery the ledger is fenced and sealed first (A6); without, it
        is read up to its LAC and can be tailed."""
        _check_ledger_id(ledger_id)
        metadata, version = await self.store.read_ledger(ledger_id)
        if metadata.password_hash and metadata.password_hash != password_hash(password):
            raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
        digest = Digest.for_ledger(metadata.digest_type, password)
        if recovery and not metadata.is_closed:
            metadata, version = await self._recover(ledger_id, metadata, version, digest, password)
        handle = ReadHandle(self.context, ledger_id, metadata, version, digest, master_key(password))
        if not metadata.is_closed:
            await handle.read_lac()
        return handle

    async def _recover(self, ledger_id: int, metadata: LedgerMetadata, version: int, digest: Digest,
                       password: bytes) -> tuple[LedgerMetadata, int]:
        """Recovery attempts until one decides where the ledger ends (LedgerRecoveryError: too many
        bookies unreachable to decide, so try again with fresh metadata)."""
        first = True

        async def attempt() -> tuple[LedgerMetadata, int]:
            nonlocal first, metadata, version
            if not first:
                metadata, version = await self.store.read_ledger(ledger_id)
            first = False
            op = RecoveryOp(ledger_id, metadata, version, digest,
                            available_bookies=self.writable_bookies(), rng=self.rng,
                            read_timeout_ms=self.settings.read_timeout_ms,
                            add_timeout_ms=self.settings.add_timeout_ms)
            finished = await self.recovery_driver(self.context, ledger_id, op, master_key(password)).recover()
            if finished.error is not None or finished.metadata is None:
                raise finished.error or LedgerRecoveryError(f"recovery of ledger {ledger_id} failed")
            return finished.metadata, finished.version

        return await retry(attempt, RECOVERY_RETRY, what=f"recovery of ledger {ledger_id}",
                           rng=self.rng.random, clock=self.clock)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies reclaim its data by garbage collection."""
        _check_ledger_id(ledger_id)
        await self.store.delete_ledger(ledger_id)

    async def list_ledgers(self) -> list[int]:
        return await self.store.list_ledgers()

    async def ledger_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        _check_ledger_id(ledger_id)
        return await self.store.read_ledger(ledger_id)


def connect_security(settings: SecuritySettings) -> ConnectSecurity:
    """How the pool reaches bookies for these settings: TLS context built once, token for AUTH
    (a client certificate authenticates when there is no token)."""
    tls = settings.tls.context() if settings.tls is not None else None
    certificate_auth = (settings.token is None and settings.tls is not None
                        and settings.tls.cert_file is not None)
    return ConnectSecurity(tls, settings.token, certificate_auth)


def _check_ledger_id(ledger_id: object) -> None:
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or not 0 <= ledger_id <= layout.LEDGER_ID_MAX:
        raise ConfigError(f"ledger id must be an integer in 0..{layout.LEDGER_ID_MAX}, got {ledger_id!r}")
