"""Policies of every namespace, run from a background thread of a long-running process
(`dlog standalone`): one `dlog.policies.PolicyRunner` per namespace found under the namespace
root, on the one sync bridge's loop (`dlog.bridge.LoopThread`). `dlog tier daemon` runs the same
in its own loop (`PolicyThread.run`), offloading only, for the namespaces it is given or all.

Namespaces are looked for again every `limits.list_interval_ms`; at most `NAMESPACES_MAX` are run
(the rest are logged once). A namespace whose client cannot start (no credentials for it on a
secure cluster, say) is logged once and tried again at the next look.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bookkeeper.errors import DlogError, MetadataNotFoundError
from bookkeeper.security.settings import SecuritySettings
from dlog.bridge import LoopThread
from dlog.core.policies import PolicyLimits
from dlog.namespace import Namespace
from dlog.policies import PolicyRunner
from dlog.segments.tier import TierOptions

log = logging.getLogger(__name__)
NAMESPACES_MAX = 64
STOP_TIMEOUT_S = 10.0


class PolicyThread:
    """Runs the policies of a cluster's namespaces until stopped."""

    def __init__(self, zk: str, *, bookkeeper_root: str, security: SecuritySettings,
                 namespace_root: str = "/dlog", limits: PolicyLimits | None = None, retention: bool = True,
                 offload: bool = True, namespaces: list[str] | None = None,
                 tier_options: TierOptions | None = None) -> None:
        """`retention`, `offload`: which policies the runners apply; `namespaces`: only these
        (default: every namespace under the root); `tier_options`: how to reach an S3 tier."""
        self.zk, self.bookkeeper_root, self.security = zk, bookkeeper_root, security
        self.namespace_root = namespace_root
        self.limits = limits or PolicyLimits()
        self.retention, self.offload = retention, offload
        self.namespaces = namespaces
        self.tier_options = tier_options
        self.runners: dict[str, PolicyRunner] = {}
        self._bridge: LoopThread | None = None
        self._stop: asyncio.Event | None = None
        self._main: Any = None
        self._refused: set[str] = set()

    def start(self) -> None:
        self._bridge = LoopThread("dlog-policies")
        self._stop = asyncio.Event()
        self._main = self._bridge.submit(self.run(self._stop))

    def stop(self) -> None:
        if self._bridge is None or self._stop is None:
            return
        self._bridge.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._main.result(STOP_TIMEOUT_S)
        except Exception as exc:  # stopping: say what went wrong, end anyway
            log.warning("policy runners stopped with an error: %s", exc)
        self._bridge.stop()

    async def run(self, stop: asyncio.Event) -> None:
        """The runners, until `stop` is set (in the caller's loop)."""
        from bookkeeper.meta.acl import zk_options
        from bookkeeper.meta.zk import AsyncZooKeeper

        zk = AsyncZooKeeper(self.zk, **zk_options(self.security, self.bookkeeper_root,
                                                  namespace_root=self.namespace_root))
        await zk.start()
        tasks: list[asyncio.Task[None]] = []
        namespaces: list[Namespace] = []
        try:
            while not stop.is_set():
                for name in await self._new_namespaces(zk):
                    namespace = await self._start_namespace(name)
                    if namespace is not None:
                        namespaces.append(namespace)
                        runner = PolicyRunner(namespace, limits=self.limits, retention=self.retention,
                                              offload=self.offload)
                        self.runners[name] = runner
                        tasks.append(asyncio.get_running_loop().create_task(runner.run(stop)))
                try:
                    async with asyncio.timeout(self.limits.list_interval_ms / 1000):
                        await stop.wait()
                except TimeoutError:
                    pass
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for namespace in namespaces:
                await namespace.close()
            await zk.close()

    async def _new_namespaces(self, zk: Any) -> list[str]:
        try:
            names = sorted(await zk.children(self.namespace_root))
            if self.namespaces is not None:
                names = [name for name in names if name in self.namespaces]
        except MetadataNotFoundError:
            return []
        except DlogError as exc:
            log.warning("policy runners cannot list the namespaces under %s: %s", self.namespace_root, exc)
            return []
        if len(names) > NAMESPACES_MAX and "namespaces_max" not in self._refused:
            self._refused.add("namespaces_max")
            log.warning("policies run for the first %d of %d namespaces only (NAMESPACES_MAX)",
                        NAMESPACES_MAX, len(names))
        return [name for name in names[:NAMESPACES_MAX] if name not in self.runners]

    async def _start_namespace(self, name: str) -> Namespace | None:
        namespace = Namespace(self.zk, name, root=self.namespace_root, bookkeeper_root=self.bookkeeper_root,
                              security=self.security, create=False,  # a runner creates nothing
                              tier_options=self.tier_options)
        try:
            return await namespace.start()
        except DlogError as exc:
            if name not in self._refused:
                self._refused.add(name)
                log.warning("policies of namespace %r do not run: %s", name, exc)
            return None
