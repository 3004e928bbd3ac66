"""One namespace connection per Python process, shared by every task that process runs.

Spark pickles readers and writers to its Python workers and reuses a worker process for many
tasks, so clients are never part of a pickle: `connection(options)` opens a ZooKeeper session
and a BookKeeper client the first time a process needs them, on an event loop in a daemon
thread, and hands the same one to every later task with the same (zk, zkRoot, namespaceRoot,
namespace). Workers are forked from Spark's daemon, so a cached connection is only used in the
process that made it. Connections close at interpreter exit; a worker that Spark ends with
`os._exit` just drops its sockets (nothing ephemeral is left in ZooKeeper by readers or sink
tasks).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

from dlog.bridge import CALL_TIMEOUT_S, LoopThread
from dlog.namespace import Namespace
from dlog_spark.options import ConnectionOptions

T = TypeVar("T")
log = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 10.0
CONNECTIONS_MAX = 16

_lock = threading.Lock()
_connections: dict[tuple[str, ...], Connection] = {}


class Connection:
    """A started Namespace and the event loop (in a daemon thread) that runs its coroutines."""

    def __init__(self, options: ConnectionOptions) -> None:
        self.options = options
        self.pid = os.getpid()
        self._bridge = LoopThread("dlog-spark-loop")
        self.loop = self._bridge.loop
        from bookkeeper.security.settings import NO_SECURITY, SecuritySettings, load_client_settings

        # only what the options say: a worker's environment ($DLOG_CONFIG) is not the query's
        if options.config:
            security = load_client_settings(options.config, token=options.token)
        else:
            security = SecuritySettings(token=options.token) if options.token else NO_SECURITY
        self.namespace = Namespace(options.zk, options.namespace, root=options.namespace_root,
                                   bookkeeper_root=options.zk_root, security=security)
        try:
            self.call(self.namespace.start())
        except BaseException:
            self._stop_loop()
            raise

    def call(self, awaitable: Awaitable[T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run a coroutine on the connection's loop and wait for its result."""
        return self._bridge.call(awaitable, timeout_s)

    def submit(self, awaitable: Awaitable[T]) -> Any:
        """Start a coroutine on the loop; returns a concurrent.futures.Future."""
        return self._bridge.submit(awaitable)

    def close(self) -> None:
        try:
            self.call(self.namespace.close(), CLOSE_TIMEOUT_S)
        except Exception as exc:  # closing is best effort: the process is going away
            log.debug("closing the dlog connection failed: %s", exc)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._bridge.stop()


def connection(options: ConnectionOptions) -> Connection:
    """The process's connection for these options, opened on first use."""
    key = options.key
    with _lock:
        found = _connections.get(key)
        if found is not None and found.pid == os.getpid():
            return found
        if found is not None:  # inherited through fork: its threads did not come along
            del _connections[key]
        if len(_connections) >= CONNECTIONS_MAX:
            _connections.pop(next(iter(_connections))).close()
        opened = _connections[key] = Connection(options)
        return opened


def close_all() -> None:
    with _lock:
        items = [item for item in _connections.values() if item.pid == os.getpid()]
        _connections.clear()
    for item in items:
        item.close()


atexit.register(close_all)
