"""Servers in ZooKeeper: each registers an ephemeral node `/dlog/<namespace>/servers/<id>` holding
its id, Kafka address and start time, in the same session as its writer locks, so that a killed
server's registration and locks end together when its session expires. A watch on the servers
node keeps the live set; the lock node of a stream says which server (if any) holds it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError, MetadataExistsError, MetadataNotFoundError
from bookkeeper.runtime import start_task
from dlog.serve.ownership import Holder
from dlog.server.settings import SERVER_IDS_TRIED_MAX

log = logging.getLogger(__name__)
REGISTRATION_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ServerInfo:
    server_id: int
    host: str
    kafka_port: int
    started_ms: int = 0
    pid: int = 0

    @property
    def kafka(self) -> str:
        return f"{self.host}:{self.kafka_port}"

    def to_bytes(self) -> bytes:
        return json.dumps({"format": REGISTRATION_FORMAT, "id": self.server_id, "host": self.host,
                           "kafka_port": self.kafka_port, "started_ms": self.started_ms, "pid": self.pid},
                          separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ServerInfo | None:
        try:
            found = json.loads(data)
            return cls(int(found["id"]), str(found["host"]), int(found["kafka_port"]), int(found.get("started_ms", 0)),
                       int(found.get("pid", 0)))
        except (ValueError, KeyError, TypeError):
            return None


def servers_path(namespace_root: str) -> str:
    return f"{namespace_root}/servers"


async def read_servers(zk: Any, namespace_root: str) -> dict[int, ServerInfo]:
    """The registered servers of a namespace, by id (for `dlog serve list` and the watch)."""
    path = servers_path(namespace_root)
    try:
        children = await zk.children(path)
    except MetadataNotFoundError:
        return {}
    found: dict[int, ServerInfo] = {}
    for child in children:
        data = await zk.get_or_none(f"{path}/{child}")
        info = None if data is None else ServerInfo.from_bytes(data[0])
        if info is not None:
            found[info.server_id] = info
    return found


def holder_of(description: dict[str, Any] | None) -> Holder | None:
    """A writer-lock node's description -> who holds the lock (None: free)."""
    if description is None:
        return None
    server = description.get("server")
    return Holder(server if isinstance(server, int) else None)


class Registry:
    """This server's registration and its view of the others."""

    def __init__(self, zk: Any, namespace_root: str, on_change: Callable[[], None] | None = None,
                 on_session_lost: Callable[[], None] | None = None) -> None:
        """`on_session_lost`: the ZooKeeper session expired, taking this server's registration and
        writer locks with it; the registry registers again once a new session is up."""
        self.zk = zk
        self.path = servers_path(namespace_root)
        self.namespace_root = namespace_root
        self.me: ServerInfo | None = None
        self.servers: dict[int, ServerInfo] = {}
        self._on_change = on_change
        self._on_session_lost = on_session_lost
        self._lost = False
        self._unwatch: Callable[[], None] | None = None
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._node: str | None = None

    @property
    def live(self) -> frozenset[int]:
        return frozenset(self.servers)

    async def register(self, server_id: int | None, host: str, kafka_port: int) -> ServerInfo:
        await self.zk.ensure_path(self.path)
        candidates = [server_id] if server_id is not None else range(SERVER_IDS_TRIED_MAX)
        for candidate in candidates:
            info = ServerInfo(candidate, host, kafka_port, wall_ms(), os.getpid())
            try:
                self._node = await self.zk.create(f"{self.path}/{candidate}", info.to_bytes(), ephemeral=True)
            except MetadataExistsError:
                continue
            self.me = info
            self.servers[candidate] = info
            self._unwatch = self.zk.watch_children(self.path, self._children_changed)
            self.zk.add_state_listener(self._session_state)
            await self.refresh()
            return info
        if server_id is not None:
            other = (await read_servers(self.zk, self.namespace_root)).get(server_id)
            raise ConfigError(f"server id {server_id} is registered already"
                              + (f" by the server at {other.kafka} (pid {other.pid})" if other else "")
                              + ": pick another --id, or leave --id out for the lowest free one")
        raise ConfigError(f"no free server id below {SERVER_IDS_TRIED_MAX}: pass --id")

    def _session_state(self, state: str) -> None:
        if self._node is None:
            return  # deregistered
        if state == "lost":
            self._lost = True
            log.warning("server %s: the ZooKeeper session expired: its registration and writer locks are gone",
                        self.me.server_id if self.me else "?")
            if self._on_session_lost is not None:
                self._on_session_lost()
        elif state == "connected" and self._lost:
            self._lost = False
            again = self._register_again()
            start_task(asyncio.get_running_loop(), self._tasks, again, again)

    async def _register_again(self) -> None:
        me = self.me
        if me is None:
            return
        try:
            self._node = await self.zk.create(f"{self.path}/{me.server_id}", me.to_bytes(), ephemeral=True)
            log.info("server %d registered again", me.server_id)
            await self.refresh()
        except MetadataExistsError:
            log.error("server %d cannot register again: another server took its id meanwhile", me.server_id)
        except Exception as exc:  # ZooKeeper away again: the next new session tries once more
            self._lost = True
            log.warning("server %d cannot register again yet: %s", me.server_id, exc)

    def _children_changed(self, children: list[str]) -> None:
        refresh = self._refresh_quietly()
        start_task(asyncio.get_running_loop(), self._tasks, refresh, refresh)

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # ZooKeeper away: the next change or request refreshes again
            log.warning("cannot read the registered servers: %s", exc)

    async def refresh(self) -> None:
        servers = await read_servers(self.zk, self.namespace_root)
        if self.me is not None:
            servers.setdefault(self.me.server_id, self.me)
        changed = servers.keys() != self.servers.keys()
        self.servers = servers
        if changed and self._on_change is not None:
            self._on_change()

    async def deregister(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self._node is not None:
            try:
                await self.zk.delete(self._node)
            except MetadataNotFoundError:
                pass
            self._node = None
        for task in list(self._tasks):
            task.cancel()
