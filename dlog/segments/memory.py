"""The segment store in memory: the same contract as the ZooKeeper one, for unit tests and the
stream simulator.

A `MemoryMetadata` holds every stream of one namespace; each client gets its own
`MemorySegmentStore` view of it, which is its session: its writer locks vanish when the session
is expired (`MemoryMetadata.expire`), as ZooKeeper's ephemeral nodes do. Watch callbacks run on
the event loop (`call_soon`), after the change, like ZooKeeper's.

Faults, for the simulator: `faults` is called before each operation with its name and may answer
"unavailable" (a retryable MetadataError, nothing done), "lost_reply" (the operation is done but
the caller gets a retryable MetadataError, as after a ZooKeeper ConnectionLoss), or None. `delay`
gives each operation a latency in seconds (asyncio.sleep, so simulated time when the loop's clock
is simulated).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import ConfigError, MetadataError, MetadataVersionError
from dlog.names import check_stream_name, check_subscription_name
from dlog.segments.metadata import (
    SegmentChange,
    SegmentList,
    SinkBatch,
    StreamConfig,
    TierPolicy,
    check_segment_list,
)
from dlog.segments.port import StreamExistsError, StreamNotFoundError

T = TypeVar("T")
Faults = Callable[[str, str], "str | None"]


@dataclass(slots=True)
class _Stream:
    config: StreamConfig
    listing: SegmentList
    locks: list[tuple[int, str, int]] = field(default_factory=list)  # (sequence, token, session)
    subscriptions: dict[str, dict[str, int]] = field(default_factory=dict)
    sinks: dict[str, SinkBatch] = field(default_factory=dict)
    runner: tuple[int, str] | None = None  # (session, runner id) of the policy runner's claim
    dedup: tuple[bytes, int] | None = None  # the serving-tier owner's producer-dedup snapshot, version
    offloader: tuple[int, str] | None = None  # (session, offloader id) of the offloader's claim
    tier_status: dict[str, Any] | None = None
    lock_changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryMetadata:
    """Every stream of one namespace, shared by the sessions (`session()`) of its clients."""

    def __init__(self, *, faults: Faults | None = None, delay: Callable[[str], float] | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: what writer-lock waits are measured on (a simulator's, on simulated time)."""
        self.streams: dict[str, _Stream] = {}
        self.clock = clock
        self.faults = faults
        self.delay = delay
        self.watchers: dict[str, list[tuple[int, Callable[[], None]]]] = {}
        self._sequences = itertools.count(1)
        self._sessions = itertools.count(1)
        self.commits = 0  # successful segment-list changes, for tests and simulator statistics
        self.tier: TierPolicy | None = None  # the namespace's default tier policy

    def session(self) -> MemorySegmentStore:
        return MemorySegmentStore(self, next(self._sessions))

    def expire(self, session: int) -> int:
        """End a session: its locks vanish (and its watches stay, as they would after a kazoo
        reconnect). Returns how many locks went."""
        gone = 0
        for stream in self.streams.values():
            kept = [lock for lock in stream.locks if lock[2] != session]
            if len(kept) != len(stream.locks):
                gone += len(stream.locks) - len(kept)
                stream.locks = kept
                stream.lock_changed.set()
            if stream.runner is not None and stream.runner[0] == session:
                stream.runner = None
            if stream.offloader is not None and stream.offloader[0] == session:
                stream.offloader = None
        return gone

    def stream(self, name: str) -> _Stream:
        found = self.streams.get(check_stream_name(name))
        if found is None:
            raise StreamNotFoundError(f"stream {name!r} does not exist (see `dlog stream list`)")
        return found

    def notify(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        for _, callback in list(self.watchers.get(name, [])):
            loop.call_soon(callback)

    def next_lock_sequence(self) -> int:
        return next(self._sequences)


class MemorySegmentStore:
    """One client's session of a `MemoryMetadata` (see the module docstring)."""

    def __init__(self, metadata: MemoryMetadata, session: int) -> None:
        self.metadata = metadata
        self.session = session
        self.dead = False
        self._watch_ids = itertools.count(1)

    def kill(self) -> None:
        """The client process died: its calls never return, its watches never fire, and its
        session (its locks) ends when `MemoryMetadata.expire` says so."""
        self.dead = True

    async def _operation(self, name: str, stream: str, apply: Callable[[], T]) -> T:
        metadata = self.metadata
        if self.dead:
            await asyncio.get_running_loop().create_future()  # never answered
        if metadata.delay is not None:
            await asyncio.sleep(metadata.delay(name))
        fault = metadata.faults(name, stream) if metadata.faults is not None else None
        if fault == "unavailable":
            raise MetadataError(f"{name} of {stream!r}: ConnectionLoss (simulated)")
        result = apply()
        if fault == "lost_reply":
            raise MetadataError(f"{name} of {stream!r}: ConnectionLoss after the request was sent (simulated)")
        return result

    # ------------------------------------------------------------------ streams

    async def create_stream(self, config: StreamConfig) -> None:
        def apply() -> None:
            if check_stream_name(config.name) in self.metadata.streams:
                raise StreamExistsError(f"stream {config.name!r} already exists")
            self.metadata.streams[config.name] = _Stream(config, SegmentList((), 0, 0))

        await self._operation("create_stream", config.name, apply)

    async def config(self, name: str) -> StreamConfig:
        return await self._operation("config", name, lambda: self.metadata.stream(name).config)

    async def update_config(self, config: StreamConfig, based_on: StreamConfig | None = None) -> None:
        def apply() -> None:
            stream = self.metadata.stream(config.name)
            if based_on is not None and stream.config != based_on:
                raise MetadataVersionError(f"the config of stream {config.name!r} changed meanwhile")
            stream.config = config

        await self._operation("update_config", config.name, apply)

    async def list_streams(self) -> list[str]:
        return await self._operation("list_streams", "", lambda: sorted(self.metadata.streams))

    async def delete_stream_metadata(self, name: str) -> None:
        def apply() -> None:
            self.metadata.stream(name)
            del self.metadata.streams[name]

        await self._operation("delete_stream", name, apply)

    # ------------------------------------------------------------------ segments

    async def segments(self, name: str) -> SegmentList:
        return await self._operation("segments", name, lambda: self.metadata.stream(name).listing)

    async def commit(self, name: str, based_on: SegmentList, change: SegmentChange) -> SegmentList:
        return (await self.commit_many([(name, based_on, change)]))[0]

    async def commit_many(self, commits: Sequence[tuple[str, SegmentList, SegmentChange]]) -> list[SegmentList]:
        def apply() -> list[SegmentList]:
            results = []
            for name, based_on, change in commits:  # every guard first: all land or none
                stream = self.metadata.stream(name)
                if stream.listing.version != based_on.version:
                    raise MetadataVersionError(f"the segment list of stream {name!r} is at version "
                                               f"{stream.listing.version}, not {based_on.version}")
                sink = change.sink
                if sink is not None and stream.sinks.get(sink.sink_id) != sink.previous:
                    raise MetadataVersionError(f"sink {sink.sink_id!r} of stream {name!r} committed meanwhile")
                result = change.applied_to(stream.listing)
                check_segment_list(list(result.segments))
                results.append(result)
            for (name, _, change), result in zip(commits, results, strict=True):
                stream = self.metadata.stream(name)
                stream.listing = result
                sink = change.sink
                if sink is not None:
                    previous = stream.sinks.get(sink.sink_id)
                    stream.sinks[sink.sink_id] = SinkBatch(sink.batch_id, sink.ledgers,
                                                           0 if previous is None else previous.version + 1)
                if change.dedup is not None:  # as ZooKeeper's unconditional set in the same multi
                    stream.dedup = (bytes(change.dedup), 0 if stream.dedup is None else stream.dedup[1] + 1)
                self.metadata.commits += 1
                self.metadata.notify(name)
            return results

        return await self._operation("commit", commits[0][0], apply)

    def watch_segments(self, name: str, callback: Callable[[], None]) -> Callable[[], None]:
        watch_id = next(self._watch_ids) * 1_000_000 + self.session
        watchers = self.metadata.watchers.setdefault(name, [])

        def notify() -> None:
            if not self.dead:
                callback()

        watchers.append((watch_id, notify))
        asyncio.get_running_loop().call_soon(notify)  # like ZooKeeper's watch: the current state first

        def stop() -> None:
            watchers[:] = [item for item in watchers if item[0] != watch_id]

        return stop

    # ------------------------------------------------------------------ writer lock

    async def lock(self, name: str, timeout_s: float, holder: dict[str, Any] | None = None) -> str | None:
        stream = await self._operation("lock", name, lambda: self.metadata.stream(name))
        sequence = self.metadata.next_lock_sequence()
        token = f"{name}#{sequence}"
        stream.locks.append((sequence, token, self.session))
        clock = self.metadata.clock
        deadline = clock.monotonic_s() + timeout_s
        while True:
            ours = [lock for lock in stream.locks if lock[1] == token]
            if not ours:
                return None  # our session expired while we waited
            if min(stream.locks)[1] == token:
                return token
            remaining_s = deadline - clock.monotonic_s()
            if remaining_s <= 0:
                stream.locks = [lock for lock in stream.locks if lock[1] != token]
                stream.lock_changed.set()
                return None
            stream.lock_changed.clear()
            try:
                async with asyncio.timeout(remaining_s):
                    await stream.lock_changed.wait()
            except TimeoutError:
                pass

    async def unlock(self, token: str) -> None:
        name = token.rsplit("#", 1)[0]

        def apply() -> None:
            stream = self.metadata.streams.get(name)
            if stream is not None:
                stream.locks = [lock for lock in stream.locks if lock[1] != token]
                stream.lock_changed.set()

        await self._operation("unlock", name, apply)

    async def claim_runner(self, name: str, runner: str) -> str | None:
        def apply() -> str | None:
            stream = self.metadata.stream(name)
            if stream.runner is None:
                stream.runner = (self.session, runner)
            return None if stream.runner[1] == runner else stream.runner[1]

        return await self._operation("claim_runner", name, apply)

    async def claim_offloader(self, name: str, offloader: str) -> str | None:
        def apply() -> str | None:
            stream = self.metadata.stream(name)
            if stream.offloader is None:
                stream.offloader = (self.session, offloader)
            return None if stream.offloader[1] == offloader else stream.offloader[1]

        return await self._operation("claim_offloader", name, apply)

    async def release_offloader(self, name: str, offloader: str) -> None:
        def apply() -> None:
            stream = self.metadata.stream(name)
            if stream.offloader is not None and stream.offloader[1] == offloader:
                stream.offloader = None

        await self._operation("release_offloader", name, apply)

    async def tier_status(self, name: str) -> dict[str, Any] | None:
        return await self._operation("tier_status", name, lambda: self.metadata.stream(name).tier_status)

    async def store_tier_status(self, name: str, status: dict[str, Any]) -> None:
        def apply() -> None:
            self.metadata.stream(name).tier_status = dict(status)

        await self._operation("store_tier_status", name, apply)

    async def namespace_tier(self) -> TierPolicy | None:
        return self.metadata.tier

    async def set_namespace_tier(self, policy: TierPolicy) -> None:
        self.metadata.tier = policy if policy.set_fields() else None

    # ------------------------------------------------------------------ subscriptions and sinks

    async def subscriptions(self, name: str) -> dict[str, dict[str, int]]:
        return await self._operation("subscriptions", name,
                                     lambda: dict(self.metadata.stream(name).subscriptions))

    async def commit_subscription(self, name: str, subscription: str, offset_json: dict[str, int]) -> None:
        def apply() -> None:
            self.metadata.stream(name).subscriptions[check_subscription_name(subscription)] = dict(offset_json)

        await self._operation("commit_subscription", name, apply)

    async def delete_subscription(self, name: str, subscription: str) -> None:
        def apply() -> None:
            if self.metadata.stream(name).subscriptions.pop(subscription, None) is None:
                raise ConfigError(f"stream {name!r} has no subscription {subscription!r}")

        await self._operation("delete_subscription", name, apply)

    async def replace_subscription(self, name: str, subscription: str, expected: dict[str, int],
                                   document: dict[str, int] | None) -> bool:
        def apply() -> bool:
            subscriptions = self.metadata.stream(name).subscriptions
            if subscriptions.get(subscription) != expected:
                return False
            if document is None:
                del subscriptions[subscription]
            else:
                subscriptions[subscription] = dict(document)
            return True

        return await self._operation("replace_subscription", name, apply)

    async def sink_batch(self, name: str, sink_id: str) -> SinkBatch | None:
        return await self._operation("sink_batch", name, lambda: self.metadata.stream(name).sinks.get(sink_id))

    async def dedup_snapshot(self, name: str) -> tuple[bytes, int] | None:
        return await self._operation("dedup_snapshot", name, lambda: self.metadata.stream(name).dedup)

    async def store_dedup_snapshot(self, name: str, data: bytes, version: int | None) -> int:
        def apply() -> int:
            stream = self.metadata.stream(name)
            found = None if stream.dedup is None else stream.dedup[1]
            if found != version:
                raise MetadataVersionError(f"stream {name!r}: the dedup snapshot is at version {found}, not {version}")
            stream.dedup = (bytes(data), 0 if found is None else found + 1)
            return stream.dedup[1]

        return await self._operation("store_dedup_snapshot", name, apply)
