"""Which streams this server owns, and which topics exist.

Routing a request for a stream: a stream this server owns is served; otherwise the lock holder is
read from ZooKeeper and `dlog.serve.ownership.decide` says what to do. TAKE opens the stream's
writer with this server named in its lock node (a writer open seals the previous owner's
in-progress segment, fencing it, as any writer takeover does), then the stream is served. A writer
that ends (fenced by a native `open_writer(takeover=True)`, or failed) stops the serving: the
stream is dropped, and one fenced away is not taken again for `YIELD_S`. A typed stream is never
taken (Kafka producers cannot write it): READ serves its reads through a `ReadOnlyStream`.

Proactive takeover. A server that takes a stream leaves a persistent marker
`/dlog/<namespace>/serve/owners/<server id>/<stream, %-quoted>` (removed when it hands the stream
back). When the registered servers change (a killed server's session expired and took its
registration with it), every live server looks at the markers of servers that are no longer live
(at most `TAKEOVER_SCAN_MAX` of them per change) and takes, without waiting for a client to ask,
each stream whose lock is free and that rendezvous hashing assigns to it; the others leave it to
the server hashing picks. A dead server's marker is removed once its stream has another holder.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import DlogError, MetadataExistsError, MetadataNotFoundError, MetadataVersionError
from dlog.core.dedup import DedupTable
from dlog.core.errors import WriterFencedError, WriterLockedError
from dlog.namespace import Namespace
from dlog.segments.codec import schema_with_headers
from dlog.segments.port import StreamExistsError, StreamNotFoundError
from dlog.serve.kafka import ErrorCode
from dlog.serve.ownership import Action, decide, partition_stream, rendezvous_pick, stream_key, topics_of
from dlog.server.owned import OwnedStream, ReadOnlyStream, rebuild_dedup
from dlog.server.registry import Registry, holder_of
from dlog.server.settings import ServerSettings
from dlog.writer import StreamWriter

log = logging.getLogger(__name__)
YIELD_S = 60.0  # a stream fenced away from this server (native takeover) is not taken back meanwhile
TOPICS_REFRESH_S = 0.5  # an unknown topic re-reads the stream list at most this often
CLOSE_S_MAX = 30.0  # a clean stop waits this long for each owned writer to close
OWNERS_NODE = "serve/owners"  # under the namespace root: who took which stream (proactive takeover)
TAKEOVER_SCAN_MAX = 10_000  # markers of servers no longer live looked at per change of the servers
TAKEOVER_RETRY_S = 1.0  # a dead server's stream whose lock is not free yet is looked at again after this
TAKEOVER_ROUNDS_MAX = 30  # ... this many times at most per change
REBUILD_S_MAX = 60.0  # taking a stream gives up when its dedup table is not rebuilt by then


@dataclass(frozen=True, slots=True)
class Redirect:
    """Another server serves (or will take) the stream."""

    server_id: int


Route = OwnedStream | ReadOnlyStream | Redirect | ErrorCode


class Streams:
    def __init__(self, ns: Namespace, registry: Registry, settings: ServerSettings) -> None:
        self.ns = ns
        self.registry = registry
        self.settings = settings
        self.owned: dict[str, OwnedStream] = {}
        self._taking: dict[str, asyncio.Task[Route]] = {}
        self._yielded: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._snapshot_versions: dict[str, int] = {}  # stream -> version of the dedup snapshot this server stored
        self.takeovers = 0  # streams taken (counters, exported)
        self.replayed_batches = 0  # producer batches replayed into rebuilt dedup tables
        self.losses = 0  # owned streams whose writer ended without a clean stop
        self.proactive_takeovers = 0  # of the takeovers: a dead server's streams taken without a request
        self._scan: asyncio.Task[None] | None = None
        self._scan_again = False

    @property
    def me(self) -> int:
        assert self.registry.me is not None
        return self.registry.me.server_id

    def holder_description(self) -> dict[str, Any]:
        me = self.registry.me
        assert me is not None
        return {"server": me.server_id, "kafka": f"{self.settings.client_host}:{me.kafka_port}", "host": me.host,
                "pid": me.pid, "started_ms": me.started_ms}

    async def route(self, stream: str, take: bool = True) -> Route:
        """Serve, redirect or refuse a request for `stream`; `take=False` names the server that
        would take a free stream without taking it (Metadata)."""
        owned = self.owned.get(stream)
        if owned is not None:
            return owned
        taking = self._taking.get(stream)
        if taking is not None:
            return await asyncio.shield(taking)
        try:
            holder = holder_of(await self.ns.store.lock_holder(stream))
            typed = await self._typed(stream)
        except StreamNotFoundError:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        decision = decide(stream, self.me, self.registry.live, holder, typed)
        if decision.action is Action.READ:
            return Redirect(self.me) if not take else await self._read_only(stream)
        if decision.action is Action.REDIRECT:
            assert decision.owner is not None
            return Redirect(decision.owner)
        if decision.action is Action.TAKE:
            if self._stopping or monotonic_s() < self._yielded.get(stream, 0.0):
                return ErrorCode.NOT_LEADER_OR_FOLLOWER
            if not take:
                return Redirect(self.me)
            return await self._take(stream)
        if decision.action is Action.BUSY:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER  # a native writer holds it
        return ErrorCode.LEADER_NOT_AVAILABLE  # WAIT, or SERVE for a lock of ours still being released

    async def _typed(self, stream: str) -> bool:
        """Whether `stream` is typed, read each time (a stream deleted and created again may not be)."""
        return schema_with_headers(self.ns.schema_of(await self.ns.store.config(stream))) is None

    async def _read_only(self, stream: str) -> Route:
        """A typed stream's reads, served without its lock (ownership.py, "Typed streams")."""
        start, end = await self.ns.position_bounds(stream)
        if end is None:  # no positions yet (written before them), or its bounds unreadable now
            return ErrorCode.LEADER_NOT_AVAILABLE
        return ReadOnlyStream(stream, end if start is None else start, end)

    async def _take(self, stream: str) -> Route:
        """Take the stream once, whoever asks meanwhile: the opening runs as its own task, so a
        requester that goes away (its connection closed) cannot cancel it half-way (a writer
        whose opening is cancelled could still get the lock, which nobody would then release)."""
        owned = self.owned.get(stream)
        if owned is not None:
            return owned
        taking = self._taking.get(stream)
        if taking is None:
            if len(self.owned) + len(self._taking) >= self.settings.owned_streams_max:
                log.warning("not taking stream %s: this server owns %d streams, owned_streams_max", stream,
                            len(self.owned))
                return ErrorCode.LEADER_NOT_AVAILABLE
            taking = self._taking[stream] = asyncio.get_running_loop().create_task(self._open(stream))
            taking.add_done_callback(lambda _: self._taking.pop(stream, None))
        return await asyncio.shield(taking)

    async def _open(self, stream: str) -> Route:
        settings = self.settings
        try:
            writer = await self.ns.open_writer(stream, lock_timeout_s=settings.lock_wait_s,
                                               lock_holder=self.holder_description(), linger_ms=settings.linger_ms,
                                               buffer_bytes_max=settings.writer_buffer_bytes_max)
        except WriterLockedError:
            return ErrorCode.LEADER_NOT_AVAILABLE  # another server took it first: Metadata names it next time
        except StreamNotFoundError:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        except DlogError as exc:
            log.warning("cannot take stream %s: %s", stream, exc)
            return ErrorCode.LEADER_NOT_AVAILABLE
        segment = writer.segment
        start, end = await self.ns.position_bounds(stream)
        if segment is not None and segment.first_position is not None:
            end = segment.first_position
        end = end or 0
        try:  # before the first write: the dead owner's producers, from its snapshot and the entries after it
            async with asyncio.timeout(REBUILD_S_MAX):
                dedup, version = await self._rebuild(stream, end)
        except (DlogError, TimeoutError) as exc:
            log.warning("not serving stream %s: its producer dedup state cannot be rebuilt: %s", stream,
                        exc or "it took too long")
            await self._close_quietly_writer(writer)
            return ErrorCode.LEADER_NOT_AVAILABLE
        owned = OwnedStream(stream, writer, end if start is None else start, end, settings.tail_bytes_max,
                            dedup, settings.dedup_replay_bytes_max, self._save_snapshot)
        self._snapshot_versions[stream] = version
        self.owned[stream] = owned
        self.takeovers += 1
        log.info("server %d serves stream %s from position %d", self.me, stream, end)
        await self._mark(stream)
        task = asyncio.get_running_loop().create_task(self._watch(owned))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return owned

    async def _rebuild(self, stream: str, end: int) -> tuple[DedupTable, int]:
        table, version, replayed = await rebuild_dedup(self.ns, stream, end)
        self.replayed_batches += replayed
        return table, version

    def _save_snapshot(self, owned: OwnedStream, data: bytes) -> None:
        task = asyncio.get_running_loop().create_task(self._store_snapshot(owned, data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store_snapshot(self, owned: OwnedStream, data: bytes) -> None:
        stored = False
        try:
            version = self._snapshot_versions.get(owned.name)
            if version is not None and self.owned.get(owned.name) is owned:
                self._snapshot_versions[owned.name] = await self.ns.store.store_dedup_snapshot(owned.name, data,
                                                                                             version)
                stored = True
        except MetadataVersionError:  # a newer owner stored one: this server no longer owns the stream
            log.warning("stream %s: another server stored the dedup snapshot; stopping serving it", owned.name)
            self._snapshot_versions.pop(owned.name, None)
            if self.owned.get(owned.name) is owned:
                owned.writer.abort()
        except DlogError as exc:  # the next snapshot tries again; meanwhile a new owner replays more
            log.warning("stream %s: storing the dedup snapshot failed: %s", owned.name, exc)
        finally:
            owned.snapshot_saved(stored)

    async def _close_quietly_writer(self, writer: StreamWriter) -> None:
        try:
            await writer.close()
        except DlogError as exc:
            log.info("closing the writer of stream %s: %s", writer.name, exc)

    async def _watch(self, owned: OwnedStream) -> None:
        await owned.writer.until_ended()
        if self.owned.get(owned.name) is not owned:  # released or stopped: nothing lost
            return
        del self.owned[owned.name]
        error = owned.writer.error
        self.losses += 1
        if isinstance(error, WriterFencedError):
            self._yielded[owned.name] = monotonic_s() + YIELD_S
        await self._unmark(owned.name, self.me)
        log.warning("server %d stopped serving stream %s: %s", self.me, owned.name, error or "its writer closed")
        try:
            await owned.writer.close()  # releases the lock, if it still holds it
        except DlogError:
            pass

    def session_lost(self) -> None:
        """The ZooKeeper session expired with every writer lock of this server: stop serving what
        it owned (another server may take it now; fencing keeps a late write of ours out)."""
        for stream in list(self.owned):
            owned = self.owned.pop(stream)
            self.losses += 1
            task = asyncio.get_running_loop().create_task(self._close_quietly(owned))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _close_quietly(self, owned: OwnedStream) -> None:
        try:
            await owned.writer.close()
        except DlogError as exc:
            log.info("closing the writer of stream %s after the session loss: %s", owned.name, exc)

    async def release(self, stream: str) -> None:
        """Stop serving `stream` (its writer closed, its lock released), if this server does."""
        owned = self.owned.pop(stream, None)
        if owned is not None:
            try:
                await owned.writer.close()
            except DlogError as exc:
                log.warning("closing the writer of stream %s: %s", stream, exc)
            await self._unmark(stream, self.me)

    async def stop(self) -> None:
        """Close every owned writer (what is buffered is written, segments completed, locks released)."""
        self._stopping = True
        owned = list(self.owned.values())
        self.owned.clear()

        async def close(one: OwnedStream) -> None:
            try:
                async with asyncio.timeout(CLOSE_S_MAX):
                    await one.writer.close()
            except (DlogError, TimeoutError) as exc:
                log.warning("closing the writer of stream %s: %s", one.name, exc)
                one.writer.abort()

        if self._scan is not None:
            self._scan.cancel()
        await asyncio.gather(*(close(one) for one in owned))
        for one in owned:  # handed back cleanly: nothing for the others to take over
            await self._unmark(one.name, self.me)
        for task in list(self._tasks):
            task.cancel()

    # ------------------------------------------------------------------ proactive takeover

    def _owners_path(self, server_id: int | None = None) -> str:
        base = f"{self.ns.root}/{OWNERS_NODE}"
        return base if server_id is None else f"{base}/{server_id}"

    async def _mark(self, stream: str) -> None:
        """Note that this server took `stream` (kept when the server dies: the others read it)."""
        try:
            await self.ns.zk.create(f"{self._owners_path(self.me)}/{quote(stream, safe='')}", b"", makepath=True)
        except MetadataExistsError:
            pass
        except DlogError as exc:  # without it, the stream moves when a client asks, as before
            log.warning("cannot note that server %d owns stream %s: %s", self.me, stream, exc)

    async def _unmark(self, stream: str, server_id: int) -> None:
        try:
            await self.ns.zk.delete(f"{self._owners_path(server_id)}/{quote(stream, safe='')}")
        except MetadataNotFoundError:
            pass
        except DlogError as exc:
            log.warning("cannot remove the owner marker of stream %s (server %d): %s", stream, server_id, exc)

    def servers_changed(self) -> None:
        """The registered servers changed: look for dead servers' streams to take (one scan at a
        time; a change during a scan runs another after it)."""
        if self._stopping or self.registry.me is None:
            return
        if self._scan is not None and not self._scan.done():
            self._scan_again = True
            return
        self._scan = asyncio.get_running_loop().create_task(self._take_over())

    async def _take_over(self) -> None:
        rounds = 0
        while not self._stopping:
            self._scan_again = False
            try:
                waiting = await self._take_over_once()
            except DlogError as exc:  # ZooKeeper away: the next change scans again
                log.warning("server %d: cannot look for dead servers' streams: %s", self.me, exc)
                return
            rounds += 1
            if self._scan_again:
                rounds = 0
                continue
            if not waiting or rounds >= TAKEOVER_ROUNDS_MAX:
                return
            await asyncio.sleep(TAKEOVER_RETRY_S)

    async def _take_over_once(self) -> bool:
        """One scan of the markers of servers that are not live; True when a stream assigned to
        this server could not be taken yet (its lock not free) and the scan should run again."""
        zk = self.ns.zk
        live, me = self.registry.live, self.me
        try:
            holders = await zk.children(self._owners_path())
        except MetadataNotFoundError:
            return False
        found: list[tuple[int, str]] = []
        for name in holders:
            if not name.isdigit() or (int(name) in live and int(name) != me):
                continue
            try:
                streams = await zk.children(self._owners_path(int(name)))
            except MetadataNotFoundError:
                continue
            found.extend((int(name), unquote(stream)) for stream in streams[: TAKEOVER_SCAN_MAX - len(found)])
            if len(found) >= TAKEOVER_SCAN_MAX:
                log.warning("server %d: more than %d streams of servers gone, TAKEOVER_SCAN_MAX: the rest move "
                            "when a client asks", me, TAKEOVER_SCAN_MAX)
                break
        waiting = False
        for holder, stream in found:
            if stream in self.owned or stream in self._taking:
                continue
            if rendezvous_pick(stream_key(stream), live | {me}) != me:
                if holder == me:  # a leftover of this server's previous run: the pick takes it when asked
                    await self._unmark(stream, me)
                continue
            route = await self.route(stream)
            if isinstance(route, OwnedStream):
                self.proactive_takeovers += 1
                log.info("server %d took stream %s of server %d, which is gone", me, stream, holder)
            elif route is ErrorCode.LEADER_NOT_AVAILABLE:  # its lock not free yet, or the opening failed
                waiting = True
                continue
            if holder != me or not isinstance(route, OwnedStream):  # taken, held elsewhere, or deleted
                await self._unmark(stream, holder)
        return waiting


class Topics:
    """Topic name -> partition count, read from the namespace's stream names (ownership.topics_of)."""

    def __init__(self, ns: Namespace, settings: ServerSettings) -> None:
        self.ns = ns
        self.settings = settings
        self._topics: dict[str, int] = {}
        self._read_at = -1e18

    async def all(self) -> dict[str, int]:
        await self._refresh()
        return dict(self._topics)

    async def partitions(self, topic: str) -> int | None:
        found = self._topics.get(topic)
        if found is None and monotonic_s() - self._read_at >= TOPICS_REFRESH_S:
            await self._refresh()
            found = self._topics.get(topic)
        return found

    async def _refresh(self) -> None:
        self._topics = topics_of(await self.ns.list_streams())
        self._read_at = monotonic_s()

    async def create(self, topic: str, partitions: int, **options: Any) -> bool:
        """Create the topic's streams (`options`: create_stream's; default: the server's replication);
        False when it existed already."""
        settings = self.settings
        options = {"ensemble": settings.ensemble, "write_quorum": settings.write_quorum,
                   "ack_quorum": settings.ack_quorum, **options}
        created = False
        for index in range(partitions):
            try:
                await self.ns.create_stream(partition_stream(topic, index, partitions), **options)
                created = True
            except StreamExistsError:
                pass
        self._topics[topic] = partitions
        return created

    def forget(self, topic: str) -> None:
        self._topics.pop(topic, None)
