"""Auto-recovery in one process: an auditor candidate and a replication worker sharing one ledger
client. A bookie runs one on its own ZooKeeper session (the default); `dlog autorecovery` runs one
as a process of its own (`run_process`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

from prometheus_client import CollectorRegistry

from bookkeeper.autorecovery.auditor import Auditor
from bookkeeper.autorecovery.metrics import RecoveryMetrics
from bookkeeper.autorecovery.settings import RecoverySettings
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.autorecovery.worker import ReplicationWorker
from bookkeeper.client.bookkeeper import BookKeeper
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.meta.zkstore import ZooKeeperMetadataStore
from bookkeeper.security.settings import SecuritySettings

log = logging.getLogger(__name__)


class AutoRecovery:
    def __init__(self, zk: AsyncZooKeeper, root: str, settings: RecoverySettings, identity: str, *,
                 registry: CollectorRegistry | None = None, clock: Clock = SYSTEM_CLOCK,
                 add_timeout_s: float = 5.0, read_timeout_s: float = 5.0,
                 security: SecuritySettings | None = None) -> None:
        """`security`: how to reach the bookies (TLS, token or client certificate); None: read
        from $DLOG_CONFIG / $DLOG_TOKEN as any client does."""
        self.zk = zk
        self.root = root
        self.settings = settings
        self.identity = identity
        self.clock = clock
        self.store = RecoveryStore(zk, root)
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.metrics = RecoveryMetrics(settings, self.registry)
        self.enabled = asyncio.Event()
        self.client = BookKeeper(store=ZooKeeperMetadataStore(zk, root), add_timeout_s=add_timeout_s,
                                 read_timeout_s=read_timeout_s, security=security)
        self.auditor: Auditor | None = None
        self.worker: ReplicationWorker | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stops: list[Any] = []

    async def start(self) -> AutoRecovery:
        await self.store.ensure_layout()
        await self.client.start()
        self._stops.append(self.store.watch_enabled(self._on_enabled))
        if self.settings.auditor:
            self.auditor = Auditor(self.client, self.store, self.settings, self.identity, self.metrics,
                                   self.enabled, clock=self.clock)
            self._tasks.append(asyncio.ensure_future(self.auditor.run()))
        if self.settings.workers:
            self.worker = ReplicationWorker(self.client, self.store, self.settings, self.identity,
                                            self.metrics, clock=self.clock, rng=random.Random())
            self._stops.append(self.store.watch_marks(self.worker.wake))
            self._tasks.append(asyncio.ensure_future(self.worker.run(self.enabled)))
        log.info("auto-recovery %s started (auditor candidate: %s, worker: %s)", self.identity,
                 self.settings.auditor, self.settings.workers)
        return self

    def _on_enabled(self, enabled: bool) -> None:
        if enabled:
            self.enabled.set()
        else:
            self.enabled.clear()
        log.info("auto-recovery %s", "enabled" if enabled else "disabled by an operator")
        if self.auditor is not None:
            self.auditor.kick()
        if self.worker is not None:
            self.worker.wake()

    async def stop(self) -> None:
        for stop in self._stops:
            stop()
        self._stops.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.client.close()

    def local_status(self) -> dict[str, Any]:
        """This process's part: whether it is the auditor, what its worker repairs."""
        return {"identity": self.identity, "is_auditor": bool(self.auditor and self.auditor.leading),
                "worker": self.worker is not None,
                "repairing": self.worker.current if self.worker is not None else None,
                "entries_copied": self.metrics.entries_copied, "bytes_copied": self.metrics.bytes_copied,
                "ledgers_repaired": self.metrics.ledgers_repaired}
