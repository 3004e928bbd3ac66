"""Simulated TCP connections: what `bookkeeper.client.connection` and the bookie's connection need
from asyncio, over the simulated network.

A client process connects through its `Dial` (`bookkeeper.client.connection.Dial`, handed to its
`BookKeeper`): after a round trip it gets a transport whose peer is the bookie process's real
`ClientConnection`, which hands requests to the real `BookieCore`. While the two are partitioned
the handshake waits (a SYN retried), up to the client's own connect timeout; a bookie process that
is down refuses it. A link's two ends are asyncio transports: `write` sends the bytes through the
network (whole frames, so drops and duplicates lose or repeat whole requests and answers);
`close`/`abort` end the local side at once and reach the peer after a latency; the bookie end
honours `pause_reading`. When a bookie process dies, every client of it learns through a reset
that travels the network (a partition may lose it: then the client's next write reaches the new
process, which does not know the connection, and that answers with the reset).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bookie import BookieProcess
    from .world import Network

SYN_RETRY_MS = 200  # a SYN lost to a partition is sent again this much later


class LinkEnd(asyncio.Transport):
    """One side of a simulated connection, as its protocol sees it."""

    def __init__(self, link: Link, name: str) -> None:
        super().__init__()
        self.link = link
        self.name = name
        self.peer: LinkEnd = self  # set once both ends exist
        self.protocol: Any = None
        self.closed = False
        self._reading = True
        self._held: list[bytes] = []  # arrived while reading was paused

    # ------------------------------------------------------------------ what the protocol calls

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed or not self.link.alive:
            return
        self.link.carry(self, bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.link.network.world.loop.call_soon(self._lost, None)
        self.link.closed_by(self)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        held, self._held = self._held, []
        for data in held:
            self.link.network.world.loop.call_soon(self.receive, data)

    def is_reading(self) -> bool:
        return self._reading

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0  # the network takes every write at once

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_protocol(self) -> Any:
        return self.protocol

    # ------------------------------------------------------------------ what the network calls

    def receive(self, data: bytes) -> None:
        if self.closed or self.protocol is None:
            return
        if not self._reading:
            self._held.append(data)
            return
        self.protocol.data_received(data)

    def peer_gone(self, error: Exception | None) -> None:
        """The peer closed (None) or reset (an error) the connection."""
        if self.closed:
            return
        self.closed = True
        self._lost(error)

    def _lost(self, error: Exception | None) -> None:
        if self.protocol is not None:
            self.protocol.connection_lost(error)


class Link:
    """One connection between a client process and a bookie process."""

    def __init__(self, network: Network, client: str, bookie: BookieProcess) -> None:
        self.network = network
        self.client = client
        self.bookie = bookie
        self.generation = bookie.generation  # the bookie process that accepted it
        self.alive = True  # False once the client process died
        self.client_end = LinkEnd(self, client)
        self.bookie_end = LinkEnd(self, bookie.bookie_id)
        self.client_end.peer, self.bookie_end.peer = self.bookie_end, self.client_end

    def carry(self, source: LinkEnd, data: bytes) -> None:
        if source is self.bookie_end and not self.bookie.serves(self):
            self.bookie.hold_output(self, data)  # a hung process writes nothing until it resumes
            return
        self.network.send(source.name, source.peer.name, self.arrive, source.peer, data)

    def arrive(self, target: LinkEnd, data: bytes) -> None:
        if not self.alive:
            return
        if target is self.bookie_end:
            self.bookie.deliver(self, data)
        else:
            target.receive(data)

    def closed_by(self, source: LinkEnd) -> None:
        if self.alive:
            self.network.send(source.name, source.peer.name, source.peer.peer_gone, None, faulty=False)

    def reset(self) -> None:
        """The bookie process that held this connection is gone: the client gets a reset (again
        for each write that reaches the new process, as TCP answers one: a partition may lose it)."""
        self.bookie_end.closed = True
        if not self.alive:
            return
        error = ConnectionResetError(f"connection to {self.bookie.bookie_id} reset by peer")
        self.network.send(self.bookie_end.name, self.client, self.client_end.peer_gone, error, faulty=False)

    def kill_client(self) -> None:
        """The client process died (kill -9): the bookie sees the connection end, the client's
        own code hears nothing more."""
        if not self.alive:
            return
        self.alive = False
        self.client_end.closed = True
        self.network.send(self.client, self.bookie_end.name, self.bookie_end.peer_gone, None, faulty=False)


class Dialer:
    """A client process's `Dial`: connects through the simulated network."""

    def __init__(self, network: Network, client: str, bookies: dict[str, BookieProcess]) -> None:
        self.network = network
        self.client = client
        self.bookies = bookies
        self.links: list[Link] = []
        self.alive = True

    async def __call__(self, protocol_factory: Any, host: str, port: int, **tls: Any) -> tuple[LinkEnd, Any]:
        network, bookie_id = self.network, f"{host}:{port}"
        bookie = self.bookies[bookie_id]
        while True:
            await self._wait_ms(network.latency_ms())  # the SYN
            if not network.partitioned(self.client, bookie_id):
                break
            await self._wait_ms(SYN_RETRY_MS - 1)
        if not bookie.accepting:
            await self._wait_ms(network.latency_ms())
            raise ConnectionRefusedError(f"bookie {bookie_id} refused the connection")
        link = Link(network, self.client, bookie)
        bookie.accept(link)
        await self._wait_ms(network.latency_ms())  # the SYN-ACK
        if link.client_end.closed:
            raise ConnectionResetError(f"bookie {bookie_id} reset the connection")
        self.links.append(link)
        protocol = protocol_factory()
        link.client_end.protocol = protocol
        protocol.connection_made(link.client_end)
        return link.client_end, protocol

    async def _wait_ms(self, delay_ms: float) -> None:
        await asyncio.sleep(delay_ms / 1000)
        if not self.alive:  # a dead process connects to nothing: it waits for good
            await asyncio.get_running_loop().create_future()

    def kill(self) -> None:
        self.alive = False
        for link in self.links:
            link.kill_client()
