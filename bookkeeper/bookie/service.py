"""One bookie: storage, journal, server, admin endpoint, ZooKeeper identity and the periodic work.

Start-up order matters. Storage opens and the journal replays from the last checkpoint's mark
before the port opens, so no request sees a half-recovered bookie; the cookie is checked before
anything is served; registration comes last, so clients only find a bookie that is ready.
Checkpoints and garbage collection share one lock: both move entries between the write cache,
entry logs and the index, and never run at the same time.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bookkeeper.autorecovery.service import AutoRecovery
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.bookie import gc
from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.config import BookieConfig
from bookkeeper.bookie.guard import NAMESPACE_CACHE_MAX, Guard, ServerSecurity
from bookkeeper.bookie.http import make_app
from bookkeeper.bookie.journal import Journal
from bookkeeper.bookie.ledgers import LedgerMetadataAccess
from bookkeeper.bookie.metrics import BookieMetrics
from bookkeeper.bookie.probes import LatencyProbes
from bookkeeper.bookie.registration import Registration, check_cookie, ensure_cluster
from bookkeeper.bookie.server import BookieServer
from bookkeeper.bookie.storage import LedgerStorage, allocated_bytes
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import DlogError, ForbiddenError, MetadataError, NoSuchLedgerError
from bookkeeper.meta import layout
from bookkeeper.meta.acl import TOMBSTONE
from bookkeeper.meta.usage import USAGE_LOOKUPS_MAX, Usage, cluster_usage, publish_usage
from bookkeeper.protocol.create import CreateLedgerRequest
from bookkeeper.protocol.wire import BookieInfoResponse, BookieState
from bookkeeper.security.quota import STREAMS_RANKED_MAX, UNLIMITED, Quota
from bookkeeper.security.settings import SecuritySettings
from bookkeeper.security.tls import ClientTls
from bookkeeper.security.tokens import create_token

if TYPE_CHECKING:
    from bookkeeper.meta.zk import AsyncZooKeeper

log = logging.getLogger(__name__)
PRIVATE_DIR_MODE = 0o700  # the bookie's data is its user's only (files 0600: bookie/main.py)


def next_read_only(read_only: bool, usage: float, threshold: float, low_water_mark: float) -> bool:
    """Disk-driven read-only state with hysteresis: on above the threshold, off below the lwm."""
    if usage >= threshold:
        return True
    if usage < low_water_mark:
        return False
    return read_only


class BookieService:
    def __init__(self, config: BookieConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: what the bookie's timing decisions (GC grace, connection silence, token expiry,
        quota pacing) and its published usage times are measured on."""
        self.config = config
        self.clock = clock
        self.data_dir = Path(config.data_dir)
        self.fatal_error: BaseException | None = None
        self.metrics = BookieMetrics(self)
        self._ledger_streams: dict[int, str | None] = {}  # ledger -> stream its metadata names
        self.storage = LedgerStorage(config.ledgers_dir, entry_log_bytes_max=config.entry_log_bytes_max,
                                     write_cache_bytes_max=config.write_cache_bytes_max,
                                     entry_log_flush_bytes=config.entry_log_flush_bytes)
        self.journal = Journal(config.journal_dir, file_bytes_max=config.journal_file_bytes_max,
                               prealloc_bytes=config.journal_prealloc_bytes,
                               group_bytes_max=config.journal_group_bytes_max,
                               group_wait_us=config.journal_group_wait_us,
                               buffered_bytes_max=config.journal_buffered_bytes_max,
                               sync=config.journal_sync, on_commit=self._on_journal_commit,
                               on_fatal=self._on_fatal)
        # --latency-probes: the core appends through a timing wrapper; without, the journal itself
        self.probes = LatencyProbes(self.metrics.registry) if config.latency_probes else None
        self.core = BookieCore(self.journal if self.probes is None else self.probes.timed(self.journal),
                               self.storage, long_poll_waiters_max=config.long_poll_waiters_max)
        self.core.read_range_bytes_max = config.limits.entry_bytes_max
        security = config.security
        self.guard: Guard | None = None
        if security.tls is not None or security.token_key is not None:
            self.guard = Guard(security, {}, self._ledger_namespace if config.zk else None,
                               self.core.has_ledger,
                               quota_lookup=self._namespace_quota if config.zk else None,
                               stream_of=self._ledger_streams.get, clock=clock)
        self.server = BookieServer(self.core, config.limits, self._info,
                                   journal_full=lambda: self.journal.full, guard=self.guard,
                                   tls=security.tls.context() if security.tls is not None else None,
                                   clock=clock)
        self.ledgers = LedgerMetadataAccess(None, config.zk_root)  # its ZooKeeper comes with the cookie check
        self.server.handlers[CreateLedgerRequest] = self.ledgers.on_create_ledger
        self.port = config.port
        self.http_port: int | None = None
        self.bookie_id = config.bookie_id or f"{config.host}:{config.port}"
        self.zk: AsyncZooKeeper | None = None  # only with config.zk
        self.registration: Registration | None = None
        self.autorecovery: AutoRecovery | None = None
        self.recovery_store: RecoveryStore | None = None  # for the admin endpoint, with or without
        self._manual_read_only = False
        self._disk_read_only = False
        self._maintenance = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._http_runner: web.AppRunner | None = None
        self._stopped = asyncio.Event()
        self._stopping = False
        self.replayed_records = 0
        self._storage_open = False
        # when GC first saw each ledger (in memory: after a restart every ledger starts its grace
        # period again, which only delays collection)
        self._first_seen_s: dict[int, float] = {}
        self._unwatch_cookie: Any = None
        self._usage_namespaces: dict[int, str | None] = {}  # ledger -> namespace, for publish_usage

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        for directory in (self.data_dir, self.config.journal_dir, self.config.ledgers_dir):
            directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        self.data_dir.chmod(PRIVATE_DIR_MODE)  # one an older version made (0755) becomes private too
        if self.config.zk:
            await self._check_identity(self.config.zk)
        await asyncio.to_thread(self._recover_storage)
        self._storage_open = True
        self.metrics.time_gc_pauses()
        await self.journal.open_for_append()
        await self.checkpoint()
        self.port = await self.server.start(self.config.host, self.config.port)
        if self.config.bookie_id is None:
            self.bookie_id = f"{self.config.host}:{self.port}"
        if self.config.http_port is not None:
            await self._start_http()
        self._check_disk()
        if self.zk is not None:
            await self._register()
            await self._start_autorecovery()
        self._tasks = [asyncio.create_task(self._periodic(self.config.checkpoint_interval_s,
                                                          self.checkpoint), name="checkpoint"),
                       asyncio.create_task(self._periodic(self.config.disk_check_interval_s,
                                                          self._disk_check), name="disk-check")]
        if self.config.gc_interval_s > 0 and self.zk is not None:
            self._tasks.append(asyncio.create_task(
                self._periodic(self.config.gc_interval_s, self.collect_garbage), name="gc"))
        if self.config.usage_interval_s > 0 and self.zk is not None and self.guard is not None:
            self._tasks.append(asyncio.create_task(
                self._periodic(self.config.usage_interval_s, self.publish_usage), name="usage"))
        if self.probes is not None:
            self._tasks.append(asyncio.create_task(self.probes.measure_loop_lag(), name="loop-lag"))
        log.info("bookie %s ready: port %d, http %s, data %s (replayed %d journal records)",
                 self.bookie_id, self.port, self.http_port, self.data_dir, self.replayed_records)

    async def _check_identity(self, zk_hosts: str) -> None:
        if self.config.bookie_id is None and self.config.port == 0:
            raise DlogError("a bookie registered in ZooKeeper needs a fixed --port or a --bookie-id: "
                            "its cookie ties the data directory to that identity")
        from bookkeeper.meta.acl import AclPolicy
        from bookkeeper.meta.zk import AsyncZooKeeper  # kazoo only when registering

        auth = None
        policy = None
        if self.config.zk_user and self.config.zk_password:
            auth = [("digest", f"{self.config.zk_user}:{self.config.zk_password}")]
            policy = AclPolicy.for_identity(self.config.zk_user, self.config.zk_password,
                                            self.config.zk_root)
        self.zk = AsyncZooKeeper(zk_hosts, session_timeout_s=self.config.zk_session_timeout_s,
                                 auth=auth, acl_policy=policy)
        await self.zk.start()
        instance_id = await ensure_cluster(self.zk, self.config.zk_root)
        await check_cookie(self.zk, self.config.zk_root, self.bookie_id, self.data_dir, instance_id)
        self.ledgers.zk = self.zk
        await self.ledgers.start()

    def _recover_storage(self) -> None:
        self.storage.open()
        mark = self.storage.load_mark()
        self.replayed_records = self.journal.replay(mark, self.core.replay_record)

    async def _ledger_namespace(self, ledger_id: int) -> str | None:
        """The namespace a ledger's metadata names (None: none), as far as its ACL vouches for it;
        NoSuchLedgerError without metadata, ForbiddenError when the ACL cannot vouch."""
        namespace, stream = await self.ledgers.namespace_and_stream(ledger_id)
        streams = self._ledger_streams  # for the guard's streams_max backstop (bounded like its cache)
        if ledger_id not in streams and len(streams) >= NAMESPACE_CACHE_MAX:
            streams.pop(next(iter(streams)))
        streams[ledger_id] = stream
        return namespace

    async def _namespace_quota(self, namespace: str) -> Quota:
        assert self.zk is not None
        found = await self.zk.get_or_none(layout.quota_path(self.config.zk_root, namespace))
        return Quota.from_bytes(found[0]) if found is not None else UNLIMITED

    async def _start_http(self) -> None:
        self._http_runner = web.AppRunner(make_app(self), access_log=None)
        await self._http_runner.setup()
        tls = self.config.security.tls
        site = web.TCPSite(self._http_runner, self.config.host, self.config.http_port,
                           ssl_context=tls.context() if tls is not None else None)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.http_port = sockets[0].getsockname()[1]

    async def _register(self) -> None:
        assert self.zk is not None
        self.registration = Registration(self.zk, self.config.zk_root, self.bookie_id)
        await self.registration.register(self._registration_info())

        def on_state(state: str) -> None:
            if state == "connected" and self.registration is not None:
                asyncio.get_running_loop().create_task(self._reregister())

        self.zk.add_state_listener(on_state)

    async def _start_autorecovery(self) -> None:
        assert self.zk is not None
        self.recovery_store = RecoveryStore(self.zk, self.config.zk_root)
        self._unwatch_cookie = self.zk.watch_data(layout.cookie_path(self.config.zk_root, self.bookie_id),
                                                  self._on_cookie)
        settings = self.config.autorecovery
        if settings is None or not (settings.auditor or settings.workers):
            return
        self.autorecovery = AutoRecovery(self.zk, self.config.zk_root, settings, self.bookie_id,
                                         registry=self.metrics.registry, clock=self.clock,
                                         security=peer_security(self.config.security, self.bookie_id))
        await self.autorecovery.start()

    def _on_cookie(self, data: bytes | None, version: int) -> None:
        """Decommissioning removes the cookie once nothing needs this bookie: stop serving, so it
        cannot take new entries it would never be asked for again."""
        if data is None and not self._stopping:
            log.warning("bookie %s: its cookie was removed from ZooKeeper (decommissioned); stopping",
                        self.bookie_id)
            asyncio.get_running_loop().create_task(self.stop())

    async def _reregister(self) -> None:
        try:
            if self.registration is not None:
                await self.registration.reregister()
        except MetadataError as exc:
            log.warning("could not re-register after reconnecting: %s", exc)

    def _registration_info(self) -> dict[str, Any]:
        return {"id": self.bookie_id, "address": f"{self.config.host}:{self.port}",
                "http": self.http_url, "state": self.state_name, "rack": self.config.rack}

    async def stop(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            await self._shutdown()
        finally:
            self.metrics.stop_timing_gc_pauses()
            self._stopped.set()  # only now: serve() returns, and asyncio.run cancels what is left

    async def _shutdown(self) -> None:
        if self._unwatch_cookie is not None:
            self._unwatch_cookie()
        await self.ledgers.stop()
        if self.autorecovery is not None:
            await self.autorecovery.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.registration is not None:
            try:
                await self.registration.unregister()
            except MetadataError as exc:
                log.warning("could not unregister: %s", exc)
        await self.server.stop()
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self._storage_open:  # a bookie refused at the cookie check never opened its storage
            await self.journal.close()
            if self.fatal_error is None:
                await self.checkpoint()
            self.storage.close()
        if self.zk is not None:
            await self.zk.close()
        log.info("bookie %s stopped", self.bookie_id)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def _on_fatal(self, error: BaseException) -> None:
        """The journal cannot write: nothing more may be acknowledged; stop serving."""
        log.critical("journal failed, bookie stops: %s", error)
        self.fatal_error = error
        asyncio.get_running_loop().create_task(self.stop())

    def _on_journal_commit(self, records: int, size_bytes: int, seconds: float) -> None:
        self.metrics.on_journal_commit(records, size_bytes, seconds)
        if self.probes is not None:
            self.probes.on_commit(seconds)
        if self.server.paused:
            self.server.resume_paused()
        if self.storage.write_cache_bytes > self.config.write_cache_bytes_max and not self._maintenance.locked():
            asyncio.get_running_loop().create_task(self.checkpoint())

    # ------------------------------------------------------------------ periodic work

    async def _periodic(self, interval_s: float, work: Any) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await work()
            except (DlogError, OSError) as exc:
                log.warning("%s failed: %s", getattr(work, "__name__", work), exc)

    async def publish_usage(self) -> None:
        """Publish the bytes this bookie stores per namespace and take the cluster's totals, which
        the guard checks against each namespace's stored_bytes_max (bookkeeper/meta/usage.py)."""
        assert self.zk is not None and self.guard is not None
        stored = self.storage.stored_bytes()
        if stored is None:
            await asyncio.to_thread(self.storage.count_stored_bytes)
            stored = self.storage.stored_bytes() or {}
        namespaces = self._usage_namespaces
        for gone in namespaces.keys() - stored.keys():
            del namespaces[gone]
        lookups = 0
        usage = Usage()
        for ledger_id, size_bytes in stored.items():
            if ledger_id not in namespaces:
                if lookups >= USAGE_LOOKUPS_MAX:
                    continue  # the rest next time: a round reads at most this much metadata
                lookups += 1
                try:
                    namespaces[ledger_id] = await self._ledger_namespace(ledger_id)
                except (NoSuchLedgerError, ForbiddenError):
                    namespaces[ledger_id] = None  # deleted (GC takes it), or no namespace can be believed
                except DlogError:
                    continue
            namespace = namespaces[ledger_id]
            if namespace is None:
                continue
            usage.bytes[namespace] = usage.bytes.get(namespace, 0) + size_bytes
            stream = self._ledger_streams.get(ledger_id)
            if stream is not None:
                streams = usage.streams.setdefault(namespace, {})
                if len(streams) < STREAMS_RANKED_MAX or stream in streams:
                    streams[stream] = min(ledger_id, streams.get(stream, ledger_id))
        await publish_usage(self.zk, self.config.zk_root, self.bookie_id, usage, self.clock.wall_ms())
        cluster = await cluster_usage(self.zk, self.config.zk_root)
        self.guard.set_stored_usage(cluster.bytes)
        self.guard.stream_slots.set_cluster(cluster.streams)

    async def checkpoint(self) -> None:
        """Make the write cache durable in entry logs and index, then advance the journal mark."""
        async with self._maintenance:
            if self.fatal_error is not None:
                return
            mark = self.journal.mark()
            snapshot = self.storage.begin_checkpoint()
            try:
                await asyncio.to_thread(self.storage.flush_checkpoint, snapshot)
                await asyncio.to_thread(self.storage.save_mark, mark)
            finally:
                self.storage.end_checkpoint(snapshot)
            self.journal.release_before(mark)
            self.metrics.checkpoints_total += 1

    async def collect_garbage(self) -> dict[str, Any]:
        """Drop ledgers whose metadata is gone, then compact entry logs. "Gone" is decided on an
        up-to-date view (a ZooKeeper sync first: a lagging follower may not know a ledger created
        a moment ago) and never for a ledger this bookie first saw less than `gc_grace_s` ago
        (bookkeeper/bookie/gc.py); the lookup is made twice, the second time under the lock."""
        if self.zk is None:
            raise DlogError("garbage collection needs ZooKeeper (start the bookie with --zk)")
        deleted: list[int] = []
        kept_by_grace = 0
        started = self.clock.monotonic_s()
        for ledger_id in sorted(self.storage.ledger_ids()):
            path = layout.ledger_path(self.config.zk_root, ledger_id)
            if await self._metadata_live(path):
                continue
            if not self._may_collect(ledger_id, exists=False):
                kept_by_grace += 1
                continue
            async with self._maintenance:
                # look again right before deleting: never act on a listing that may be stale
                if await self._metadata_live(path):
                    continue
                self.storage.delete_ledger(ledger_id)
                self.core.forget_ledger(ledger_id)
                self._first_seen_s.pop(ledger_id, None)
                if self.guard is not None:
                    self.guard.forget(ledger_id)
            deleted.append(ledger_id)
            await self._remove_tombstone(path)
        async with self._maintenance:
            reclaimed = await asyncio.to_thread(self.storage.compact,
                                                self.config.compaction_live_fraction)
        self.metrics.gc_ledgers_deleted_total += len(deleted)
        self.metrics.gc_reclaimed_bytes_total += reclaimed
        self.metrics.gc_ledgers_kept_by_grace = kept_by_grace
        if deleted or reclaimed:
            log.info("gc: deleted %d ledgers, reclaimed %d bytes", len(deleted), reclaimed)
        return {"deleted_ledgers": deleted, "reclaimed_bytes": reclaimed, "kept_by_grace": kept_by_grace,
                "seconds": round(self.clock.monotonic_s() - started, 3)}

    async def _metadata_live(self, path: str) -> bool:
        """Metadata exists and is not a deletion tombstone (bookkeeper/meta/acl.py), as an up-to-date
        view says: a sync first, since a lagging follower may not know a ledger created a moment ago."""
        assert self.zk is not None
        if gc.SYNC_BEFORE_CHECK:
            await self.zk.sync(path)
        found = await self.zk.get_or_none(path)
        return found is not None and found[0] != TOMBSTONE

    def _may_collect(self, ledger_id: int, exists: bool) -> bool:
        now_s = self.clock.monotonic_s()
        first_seen_s = self._first_seen_s.setdefault(ledger_id, now_s)
        return gc.may_collect(exists=exists, first_seen_s=first_seen_s, now_s=now_s,
                              grace_s=self.config.gc_grace_s)

    async def _remove_tombstone(self, path: str) -> None:
        """A client without delete rights left a tombstone: remove the node once it is collected
        here (other bookies then find no metadata and collect too)."""
        assert self.zk is not None
        found = await self.zk.get_or_none(path)
        if found is not None and found[0] == TOMBSTONE:
            try:
                await self.zk.delete(path, found[1])
            except MetadataError as exc:
                log.info("could not remove the tombstone %s: %s", path, exc)

    # ------------------------------------------------------------------ disk and state

    def disk_usage(self) -> dict[str, Any]:
        usage = shutil.disk_usage(self.data_dir)
        return {"total_bytes": usage.total, "free_bytes": usage.free,
                "used_bytes": usage.total - usage.free,
                "usage": round((usage.total - usage.free) / usage.total, 4) if usage.total else 0.0}

    def _check_disk(self) -> bool:
        """Update the disk-driven read-only flag; True when the bookie state changed."""
        before = self.core.read_only
        self._disk_read_only = next_read_only(self._disk_read_only, self.disk_usage()["usage"],
                                              self.config.disk_usage_threshold,
                                              self.config.disk_usage_lwm)
        self._apply_read_only()
        return before != self.core.read_only

    async def _disk_check(self) -> None:
        if self._check_disk() and self.registration is not None:
            await self.registration.update(state=self.state_name)
        if self.registration is not None:
            await self.registration.reregister()

    def _apply_read_only(self) -> None:
        reasons = []
        if self._manual_read_only:
            reasons.append("set by an operator")
        if self._disk_read_only:
            reasons.append(f"disk usage {self.disk_usage()['usage']:.1%} passed "
                           f"{self.config.disk_usage_threshold:.0%}")
        self.core.read_only = bool(reasons)
        self.core.read_only_reason = "; ".join(reasons)

    async def set_manual_read_only(self, read_only: bool) -> None:
        self._manual_read_only = read_only
        self._apply_read_only()
        if self.registration is not None:
            await self.registration.update(state=self.state_name)

    @property
    def state_name(self) -> str:
        return "read_only" if self.core.read_only else "writable"

    def state_summary(self) -> dict[str, Any]:
        return {"state": self.state_name, "reason": self.core.read_only_reason,
                "manual_read_only": self._manual_read_only, "disk_read_only": self._disk_read_only}

    @property
    def http_url(self) -> str | None:
        scheme = "https" if self.config.security.tls is not None else "http"
        return None if self.http_port is None else f"{scheme}://{self.config.host}:{self.http_port}"

    def describe(self) -> dict[str, Any]:
        return {"id": self.bookie_id, "address": f"{self.config.host}:{self.port}",
                "http": self.http_url, "state": self.state_name, "rack": self.config.rack,
                "data_dir": str(self.data_dir), "disk": self.disk_usage(), "directories": self.directories(),
                "ledgers": len(self.storage.ledger_ids()),
                "write_cache_bytes": self.storage.write_cache_bytes,
                "unflushed_bytes": self.storage.unflushed_bytes,
                "ledger_storage_bytes": self.storage.disk_bytes(),
                "replayed_records": self.replayed_records}

    def directories(self) -> dict[str, dict[str, Any]]:
        """This bookie's own directories, where they are and the bytes each takes on disk (the file
        system's usage, `disk`, is shared with whatever else lives on it)."""
        return {name: {"path": str(path), "bytes": allocated_bytes(path)} for name, path in (
            ("journal", self.config.journal_dir), ("entry_logs", self.storage.entry_log_dir),
            ("index", self.storage.index_dir))}

    def _info(self) -> BookieInfoResponse:
        disk = self.disk_usage()
        state = BookieState.READ_ONLY if self.core.read_only else BookieState.WRITABLE
        return BookieInfoResponse(0, disk["free_bytes"], disk["total_bytes"], state, self.bookie_id)


def peer_security(security: ServerSecurity, bookie_id: str) -> SecuritySettings:
    """How this bookie's auto-recovery reaches the other bookies of a cluster secured like it:
    its own certificate for TLS (and as a client certificate), and with an HS256 token key a token
    of the `bookie` role it signs itself; with a public-key token key (it cannot sign) the
    certificate authenticates, so it must carry the `dlog-role=bookie` unit (docs/security.md).
    An open bookie reaches its peers without security."""
    token = None
    key = security.token_key
    if key is not None and key.algorithm == "HS256":
        token = create_token(key, f"bookie {bookie_id}", ["bookie"])
    tls = security.tls
    client_tls = None
    if tls is not None:
        # the certificate goes along where it must (mutual TLS required) or is the only identity;
        # a server-only certificate (no clientAuth usage) would otherwise break the handshake
        present = tls.require_client_cert or token is None
        client_tls = ClientTls(ca_file=tls.ca_file, cert_file=tls.cert_file if present else None,
                               key_file=tls.key_file if present else None)
    return SecuritySettings(tls=client_tls, token=token, source=f"bookie {bookie_id}")
