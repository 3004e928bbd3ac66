"""Stream metadata in ZooKeeper: configs, segment lists, writer locks, subscriptions, sink batches.

    /dlog/<namespace>/streams/<node>                         stream config (JSON)
    /dlog/<namespace>/streams/<node>/segments                {"max_sequence": n}; its version is the
                                                             compare-and-set token of the whole list
    /dlog/<namespace>/streams/<node>/segments/<18-digit seq> one segment (JSON)
    /dlog/<namespace>/streams/<node>/lock/writer-<seq>       ephemeral-sequential writer lock; its data
                                                             is its holder: {"host", "pid", "started_ms"}
    /dlog/<namespace>/streams/<node>/subscribers/<name>      committed offset (JSON)
    /dlog/<namespace>/streams/<node>/sink/<sink id>          last committed Spark batch id

`<node>` is the stream name with `/` encoded (`dlog.names.stream_node_name`). Every change to a
segment list is one ZooKeeper multi that includes a set of the `segments` node at the version the
writer read, so two writers can never both change the list: the loser gets MetadataVersionError.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Callable

from bookkeeper.errors import (
    ConfigError,
    DlogError,
    MetadataExistsError,
    MetadataNotFoundError,
)
from bookkeeper.meta.zk import AsyncZooKeeper, CreateOp, DeleteOp, Op, SetOp
from dlog.names import (
    check_stream_name,
    check_subscription_name,
    stream_name_from_node,
    stream_node_name,
)
from dlog.segments.metadata import Segment, StreamConfig, check_segment_list


class StreamNotFoundError(DlogError):
    code = 310


class StreamExistsError(DlogError):
    code = 311


def lock_holder_description() -> dict[str, Any]:
    """What a writer-lock node says about its holder: this host and process, and since when."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started_ms": int(time.time() * 1000)}


class SegmentList:
    """A stream's segments as read, with the version a change must be based on."""

    __slots__ = ("segments", "version", "max_sequence")

    def __init__(self, segments: list[Segment], version: int, max_sequence: int) -> None:
        self.segments = segments
        self.version = version
        self.max_sequence = max_sequence

    @property
    def in_progress(self) -> Segment | None:
        return self.segments[-1] if self.segments and self.segments[-1].is_in_progress else None

    @property
    def live(self) -> list[Segment]:
        return [segment for segment in self.segments if not segment.is_truncated]

    def by_ledger(self, ledger_id: int) -> Segment | None:
        return next((s for s in self.segments if s.ledger_id == ledger_id), None)


class StreamStore:
    def __init__(self, zk: AsyncZooKeeper, namespace_root: str) -> None:
        self.zk = zk
        self.root = namespace_root

    # ------------------------------------------------------------------ paths

    def stream_path(self, name: str) -> str:
        return f"{self.root}/streams/{stream_node_name(check_stream_name(name))}"

    def segments_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/segments"

    def segment_path(self, name: str, sequence: int) -> str:
        return f"{self.segments_path(name)}/{sequence:018d}"

    def lock_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/lock"

    def subscriber_path(self, name: str, subscription: str) -> str:
        return f"{self.stream_path(name)}/subscribers/{check_subscription_name(subscription)}"

    def sink_path(self, name: str, sink_id: str) -> str:
        return f"{self.stream_path(name)}/sink/{check_subscription_name(sink_id)}"

    # ------------------------------------------------------------------ streams

    async def create_stream(self, config: StreamConfig) -> None:
        path = self.stream_path(config.name)
        await self.zk.ensure_path(f"{self.root}/streams")
        try:
            await self.zk.multi([
                CreateOp(path, config.to_bytes()),
                CreateOp(f"{path}/segments", json.dumps({"max_sequence": 0}).encode()),
                CreateOp(f"{path}/lock"), CreateOp(f"{path}/subscribers"), CreateOp(f"{path}/sink"),
            ])
        except MetadataExistsError as exc:
            raise StreamExistsError(f"stream {config.name!r} already exists") from exc

    async def config(self, name: str) -> StreamConfig:
        found = await self.zk.get_or_none(self.stream_path(name))
        if found is None:
            raise StreamNotFoundError(f"stream {name!r} does not exist (see `dlog stream list`)")
        return StreamConfig.from_bytes(found[0])

    async def update_config(self, config: StreamConfig) -> None:
        try:
            await self.zk.set(self.stream_path(config.name), config.to_bytes())
        except MetadataNotFoundError as exc:
            raise StreamNotFoundError(f"stream {config.name!r} does not exist") from exc

    async def list_streams(self) -> list[str]:
        try:
            nodes = await self.zk.children(f"{self.root}/streams")
        except MetadataNotFoundError:
            return []
        return sorted(stream_name_from_node(node) for node in nodes)

    async def delete_stream_metadata(self, name: str) -> None:
        try:
            await self.zk.delete(self.stream_path(name), recursive=True)
        except MetadataNotFoundError as exc:
            raise StreamNotFoundError(f"stream {name!r} does not exist") from exc

    # ------------------------------------------------------------------ segments

    async def segments(self, name: str) -> SegmentList:
        path = self.segments_path(name)
        found = await self.zk.get_or_none(path)
        if found is None:
            raise StreamNotFoundError(f"stream {name!r} does not exist (see `dlog stream list`)")
        data, version = found
        children = await self.zk.children(path)
        loaded = await asyncio.gather(*(self.zk.get_or_none(f"{path}/{child}") for child in sorted(children)))
        segments = [Segment.from_bytes(item[0]) for item in loaded if item is not None]
        check_segment_list(segments)
        return SegmentList(segments, version, int(json.loads(data)["max_sequence"]))

    def _list_op(self, name: str, listing: SegmentList, max_sequence: int | None = None) -> SetOp:
        value = listing.max_sequence if max_sequence is None else max_sequence
        return SetOp(self.segments_path(name), json.dumps({"max_sequence": value}).encode(),
                     listing.version)

    async def commit(self, name: str, listing: SegmentList, *, create: Sequence[Segment] = (),
                     update: Sequence[Segment] = (), delete: Sequence[Segment] = (),
                     extra: Sequence[Op] = ()) -> None:
        """Change the segment list in one multi, based on `listing`'s version (L1, L3). `extra`
        operations commit with it or not at all (the Spark sink records its batch id this way)."""
        await self.zk.multi(self._commit_ops(name, listing, create, update, delete, extra))

    async def commit_many(self, commits: Sequence[tuple[str, SegmentList, Sequence[Segment], Sequence[Op]]]) -> None:
        """Append segments to several streams in ONE multi, each guarded by its list's version:
        all land or none (the Spark sink's routed batches). Each item: (stream, listing the
        change is based on, segments to create, extra operations)."""
        ops: list[Op] = []
        for name, listing, create, extra in commits:
            ops += self._commit_ops(name, listing, create, (), (), extra)
        await self.zk.multi(ops)

    def _commit_ops(self, name: str, listing: SegmentList, create: Sequence[Segment], update: Sequence[Segment],
                    delete: Sequence[Segment], extra: Sequence[Op]) -> list[Op]:
        ops: list[Op] = [SetOp(self.segment_path(name, s.sequence), s.to_bytes()) for s in update]
        ops += [DeleteOp(self.segment_path(name, s.sequence)) for s in delete]
        ops += [CreateOp(self.segment_path(name, s.sequence), s.to_bytes()) for s in create]
        top = max([listing.max_sequence, *(s.sequence for s in create)])
        ops.append(self._list_op(name, listing, top))
        return ops + list(extra)

    def watch_segments(self, name: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call back on the loop whenever the segment list node changes (every commit sets it)."""
        return self.zk.watch_data(self.segments_path(name), lambda data, version: callback())

    # ------------------------------------------------------------------ writer lock

    async def lock(self, name: str, timeout_s: float, holder: dict[str, Any] | None = None) -> str | None:
        """Take the writer lock: our ephemeral node must be the lowest. Returns its path, or None
        after `timeout_s` (the node is removed again). The node holds a small JSON description of
        its holder (`holder`, by default this host and process), so a waiter can say who it waits for."""
        base = self.lock_path(name)
        description = json.dumps(holder if holder is not None else lock_holder_description()).encode()
        ours = await self.zk.create(f"{base}/writer-", description, ephemeral=True, sequence=True)
        our_name = ours.rsplit("/", 1)[1]
        changed = asyncio.Event()
        unwatch = self.zk.watch_children(base, lambda children: changed.set())
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            while True:
                children = sorted(await self.zk.children(base))
                if children and children[0] == our_name:
                    return ours
                remaining_s = deadline - asyncio.get_running_loop().time()
                if remaining_s <= 0:
                    await self.unlock(ours)
                    return None
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), min(remaining_s, 1.0))
                except asyncio.TimeoutError:
                    pass
        finally:
            unwatch()

    async def lock_holder(self, name: str) -> dict[str, Any] | None:
        """Who holds the writer lock now: its description (host, pid, started_ms; {} when its node
        holds none), or None when the lock is free."""
        base = self.lock_path(name)
        try:
            children = sorted(await self.zk.children(base))
        except MetadataNotFoundError as exc:
            raise StreamNotFoundError(f"stream {name!r} does not exist") from exc
        for child in children:  # the lowest node holds the lock; it may go away as we look
            found = await self.zk.get_or_none(f"{base}/{child}")
            if found is None:
                continue
            try:
                description = json.loads(found[0]) if found[0] else {}
            except ValueError:
                description = {}
            return description if isinstance(description, dict) else {}
        return None

    async def unlock(self, lock_node: str) -> None:
        try:
            await self.zk.delete(lock_node)
        except MetadataNotFoundError:
            pass

    # ------------------------------------------------------------------ subscriptions and sinks

    async def subscriptions(self, name: str) -> dict[str, dict[str, int]]:
        base = f"{self.stream_path(name)}/subscribers"
        try:
            children = await self.zk.children(base)
        except MetadataNotFoundError as exc:
            raise StreamNotFoundError(f"stream {name!r} does not exist") from exc
        found = await asyncio.gather(*(self.zk.get_or_none(f"{base}/{child}") for child in children))
        return {child: json.loads(item[0]) for child, item in zip(children, found) if item is not None}

    async def commit_subscription(self, name: str, subscription: str, offset_json: dict[str, int]) -> None:
        path = self.subscriber_path(name, subscription)
        data = json.dumps(offset_json, sort_keys=True).encode()
        try:
            await self.zk.set(path, data)
        except MetadataNotFoundError:
            await self.zk.create(path, data)

    async def delete_subscription(self, name: str, subscription: str) -> None:
        try:
            await self.zk.delete(self.subscriber_path(name, subscription))
        except MetadataNotFoundError as exc:
            raise ConfigError(f"stream {name!r} has no subscription {subscription!r}") from exc
