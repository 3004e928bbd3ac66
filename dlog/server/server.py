"""The server: registers, listens on its Kafka port, serves connections within `connections_max`,
and stops cleanly: the listener closes, connections end, every owned writer closes (what was
acknowledged is durable; buffered records are written first), the locks are released and the
registration removed, so other servers take the streams at once instead of after a session timeout.

    async with Namespace(zk, name, zk_session_timeout_s=settings.session_timeout_s) as ns:
        server = KafkaServer(ns, settings)
        await server.start()          # registered and accepting clients: server.address
        ...
        await server.stop()
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.clock import monotonic_s
from bookkeeper.errors import ConfigError, PortInUseError
from bookkeeper.security.tokens import TokenVerifier
from dlog.namespace import Namespace
from dlog.policies import PolicyRunner
from dlog.server.admin import TopicAdmin
from dlog.server.api import KafkaApi
from dlog.server.connection import KafkaConnection
from dlog.server.groups import GroupService
from dlog.server.registry import Registry
from dlog.server.settings import ServerSettings
from dlog.server.streams import Streams, Topics

log = logging.getLogger(__name__)
refusals = RateLimitedLog(log)
STOP_CONNECTIONS_S = 5.0  # a stop waits this long for connections to end after cancelling them


class KafkaServer:
    def __init__(self, ns: Namespace, settings: ServerSettings) -> None:
        self.ns = ns
        self.settings = settings
        self.registry = Registry(ns.zk, ns.root, on_change=self._servers_changed, on_session_lost=self._session_lost)
        self.streams = Streams(ns, self.registry, settings)
        self.topics = Topics(ns, settings)
        self.api = KafkaApi(ns, settings, self.registry, self.streams, self.topics)
        self.groups = GroupService(ns, self.registry, self.topics)
        self.api.add_handlers(self.groups.handlers(self.api))
        self.api.add_handlers(TopicAdmin(ns, settings, self.streams, self.topics).handlers())
        # security: built once (a bad certificate or key file is one line at start)
        self._tls = settings.tls.context() if settings.tls is not None else None
        self._verifier = TokenVerifier(settings.token_key) if settings.token_key is not None else None
        self._listener: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], KafkaConnection] = {}
        # the owner of a stream applies its policies (retention, offloading): one runner per stream
        # (dlog.policies)
        self.policies = PolicyRunner(ns, streams=lambda: list(self.streams.owned), offload=settings.offload)
        self._policies_stop = asyncio.Event()
        self._policies_task: asyncio.Task[None] | None = None
        self.port = 0
        self.connections_refused = 0

    @property
    def server_id(self) -> int:
        assert self.registry.me is not None
        return self.registry.me.server_id

    @property
    def address(self) -> str:
        return f"{self.settings.client_host}:{self.port}"

    async def start(self) -> KafkaServer:
        if self.ns.zk is None:
            raise ConfigError("a Kafka server needs a namespace on ZooKeeper (its registry and locks)")
        listening = _listen(self.settings.host, self.settings.kafka_port)
        self.port = listening.getsockname()[1]
        try:
            await self.registry.register(self.settings.server_id, self.settings.client_host, self.port)
            self._listener = await asyncio.start_server(self._accepted, sock=listening, limit=1 << 20)
        except BaseException:
            listening.close()
            await self.registry.deregister()
            raise
        self._policies_task = asyncio.get_running_loop().create_task(self.policies.run(self._policies_stop))
        self.streams.servers_changed()  # streams of servers gone while none was looking (or of this id's last run)
        log.info("dlog server %d serves namespace %s to Kafka clients at %s (%s)", self.server_id, self.ns.name,
                 self.address, self.security_protocol)
        return self

    @property
    def security_protocol(self) -> str:
        """What a Kafka client sets as `security.protocol` for this server."""
        if self.settings.requires_auth:
            return "SASL_SSL" if self._tls is not None else "SASL_PLAINTEXT"
        return "SSL" if self._tls is not None else "PLAINTEXT"

    def _servers_changed(self) -> None:
        self.streams.servers_changed()  # a server gone: take its streams that hashing gives this one

    def _session_lost(self) -> None:
        self.streams.session_lost()
        self.groups.stop()  # another server may coordinate the groups now: members find it again

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted_s = monotonic_s()
        if len(self._connections) >= self.settings.connections_max:
            self.connections_refused += 1
            refusals.warning("connections", "closed a Kafka connection from %s: %d are open, connections_max",
                             writer.get_extra_info("peername"), len(self._connections))
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        connection = KafkaConnection(self.api, self.settings, reader, writer, self._tls, self._verifier, accepted_s)
        self._connections[task] = connection
        try:
            await connection.serve()
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.pop(task, None)

    async def stop(self) -> None:
        """Hand everything over cleanly (see the module docstring)."""
        if self._listener is not None:
            self._listener.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=STOP_CONNECTIONS_S)
        self.groups.stop()
        self._policies_stop.set()
        if self._policies_task is not None:
            await self._policies_task
        await self.streams.stop()
        await self.registry.deregister()
        if self._listener is not None:
            await self._listener.wait_closed()
        log.info("dlog server %d stopped", self.server_id)

    def limits_in_use(self) -> dict[str, int]:
        """How much of each named limit is used now (a per-connection or per-stream limit: the most
        any one connection or stream uses), for the metrics beside the limits."""
        connections = [connection.stats() for connection in self._connections.values()]
        streams = list(self.streams.owned.values())
        return {"connections": len(connections),
                "in_flight_requests": max((c["in_flight"] for c in connections), default=0),
                "unsent_bytes": max((c["unsent_bytes"] for c in connections), default=0),
                "readers": max((c["readers"] for c in connections), default=0),
                "owned_streams": len(streams),
                "writer_buffer_bytes": max((s.writer.buffered_bytes for s in streams), default=0),
                "tail_bytes": max((s.tail_bytes for s in streams), default=0),
                "producers": max((s.dedup.producer_count for s in streams), default=0)}

    def stats(self) -> dict[str, Any]:
        return {"id": self.server_id, "kafka": self.address, "connections": len(self._connections),
                "connections_refused": self.connections_refused,
                "security_protocol": self.security_protocol,
                "streams": sorted(self.streams.owned), "takeovers": self.streams.takeovers,
                "proactive_takeovers": self.streams.proactive_takeovers,
                "dedup_batches_replayed": self.streams.replayed_batches,
                "records_produced": self.api.records_produced, "records_fetched": self.api.records_fetched,
                "authentications": self.api.authentications,
                "authentications_failed": self.api.authentications_failed,
                "policy_runs": self.policies.stats.runs, "policy_failures": self.policies.stats.failures}


def _listen(host: str, port: int) -> socket.socket:
    """The Kafka port's socket; a port another process holds is one clear error naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        raise PortInUseError(f"cannot listen for Kafka clients on {host}:{port}: {exc.strerror} (pass another "
                             "--kafka-port, or 0 for any free port)") from exc
    listening.listen(1024)
    listening.setblocking(False)
    return listening
