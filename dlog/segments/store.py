"""The segment store on ZooKeeper: the one place that turns stream metadata into ZooKeeper nodes.

    /dlog/<namespace>/streams/<node>                         stream config (JSON)
    /dlog/<namespace>/streams/<node>/segments                {"max_sequence": n}; its version is the
                                                             compare-and-set token of the whole list
    /dlog/<namespace>/streams/<node>/segments/<18-digit seq> one segment (JSON)
    /dlog/<namespace>/streams/<node>/lock/writer-<uuid>-<seq> ephemeral-sequential writer lock; its data
                                                             is its holder: {"host", "pid", "started_ms"}
    /dlog/<namespace>/streams/<node>/subscribers/<name>      committed offset (JSON), its time, eviction mark
    /dlog/<namespace>/streams/<node>/sink/<sink id>          last committed Spark batch (JSON)
    /dlog/<namespace>/streams/<node>/offloader               ephemeral: the offloader at work on it
    /dlog/<namespace>/streams/<node>/tier-status             the last offload run's outcome (JSON)
    /dlog/<namespace>/tier                                   the namespace's default tier policy (JSON)

`<node>` is the stream name with `/` encoded (`dlog.names.stream_node_name`). Every change to a
segment list is one ZooKeeper multi that includes a set of the `segments` node at the version the
change is based on, so two changes based on one version can never both land: the loser gets
MetadataVersionError. A Spark sink's batch record joins the same multi, and so does a named
writer's producer dedup snapshot (`dedup`) when its change completes a segment.

Each method makes one attempt (the port's contract); `dlog.segments.port.RetryingSegmentStore`
retries. A lock node's name carries a random id, so after a lost answer the retry finds the node
its first attempt may have created instead of leaving it behind (kazoo's Lock recipe does the
same).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bookkeeper.clock import SYSTEM_CLOCK, Clock, wall_ms
from bookkeeper.errors import (
    ConfigError,
    CorruptMetadataError,
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
)
from bookkeeper.meta.zk import AsyncZooKeeper, CreateOp, DeleteOp, Op, SetOp
from dlog.names import (
    check_stream_name,
    check_subscription_name,
    stream_name_from_node,
    stream_node_name,
)
from dlog.segments.metadata import (
    Segment,
    SegmentChange,
    SegmentList,
    SinkBatch,
    StreamConfig,
    TierPolicy,
    check_segment_list,
)
from dlog.segments.port import StreamExistsError, StreamNotFoundError

__all__ = ["SegmentList", "StreamExistsError", "StreamNotFoundError", "StreamStore", "ZooKeeperSegmentStore"]

LOCK_PREFIX = "writer-"


def lock_holder_description() -> dict[str, Any]:
    """What a writer-lock node says about its holder: this host and process, and since when."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started_ms": wall_ms()}
LOCK_POLL_S = 1.0  # the lock's children watch wakes a waiter; this only bounds a missed event
SINK_NODE_FORMAT = 1


class ZooKeeperSegmentStore:
    def __init__(self, zk: AsyncZooKeeper, namespace_root: str, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: what writer-lock waits are measured on."""
        self.zk = zk
        self.root = namespace_root
        self.clock = clock

    def not_found(self, name: str) -> StreamNotFoundError:
        """The one wording of a missing stream: it names the namespace, which may be the wrong one."""
        namespace = self.root.rsplit("/", 1)[-1]
        return StreamNotFoundError(f"stream {name!r} does not exist in namespace {namespace!r} (see `dlog stream "
                                   f"list --namespace {namespace}`)")

    # ------------------------------------------------------------------ paths

    def stream_path(self, name: str) -> str:
        return f"{self.root}/streams/{stream_node_name(check_stream_name(name))}"

    def segments_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/segments"

    def segment_path(self, name: str, sequence: int) -> str:
        return f"{self.segments_path(name)}/{sequence:018d}"

    def lock_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/lock"

    def runner_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/runner"

    def subscriber_path(self, name: str, subscription: str) -> str:
        return f"{self.stream_path(name)}/subscribers/{check_subscription_name(subscription)}"

    def sink_path(self, name: str, sink_id: str) -> str:
        return f"{self.stream_path(name)}/sink/{check_subscription_name(sink_id)}"

    def dedup_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/dedup"

    def offloader_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/offloader"

    def tier_status_path(self, name: str) -> str:
        return f"{self.stream_path(name)}/tier-status"

    def namespace_tier_path(self) -> str:
        return f"{self.root}/tier"

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
            raise self.not_found(name)
        return StreamConfig.from_bytes(found[0])

    async def update_config(self, config: StreamConfig, based_on: StreamConfig | None = None) -> None:
        path = self.stream_path(config.name)
        try:
            if based_on is None:
                await self.zk.set(path, config.to_bytes())
                return
            data, version = await self.zk.get(path)
            if StreamConfig.from_bytes(data) != based_on:
                raise MetadataVersionError(f"the config of stream {config.name!r} changed meanwhile")
            await self.zk.set(path, config.to_bytes(), version)
        except MetadataNotFoundError as exc:
            raise self.not_found(config.name) from exc

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
            raise self.not_found(name) from exc

    # ------------------------------------------------------------------ segments

    async def segments(self, name: str) -> SegmentList:
        path = self.segments_path(name)
        found = await self.zk.get_or_none(path)
        if found is None:
            raise self.not_found(name)
        data, version = found
        children = await self.zk.children(path)
        loaded = await asyncio.gather(*(self.zk.get_or_none(f"{path}/{child}") for child in sorted(children)))
        segments = [Segment.from_bytes(item[0]) for item in loaded if item is not None]
        check_segment_list(segments)
        try:
            max_sequence = int(json.loads(data)["max_sequence"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptMetadataError(f"segment list node of stream {name!r} is corrupt: {exc!r}") from exc
        return SegmentList(tuple(segments), version, max_sequence)

    async def commit(self, name: str, based_on: SegmentList, change: SegmentChange) -> SegmentList:
        """One multi: the segment nodes, the list node at `based_on.version`, the sink record."""
        return (await self.commit_many([(name, based_on, change)]))[0]

    async def commit_many(self, commits: Sequence[tuple[str, SegmentList, SegmentChange]]) -> list[SegmentList]:
        """Several streams' changes in ONE multi, each guarded by its list's version: all land or
        none (the Spark sink's routed batches)."""
        ops: list[Op] = []
        results = []
        for name, based_on, change in commits:
            ops += [SetOp(self.segment_path(name, s.sequence), s.to_bytes()) for s in change.update]
            ops += [DeleteOp(self.segment_path(name, s.sequence)) for s in change.delete]
            ops += [CreateOp(self.segment_path(name, s.sequence), s.to_bytes()) for s in change.create]
            result = change.applied_to(based_on)
            check_segment_list(list(result.segments))
            ops.append(SetOp(self.segments_path(name), json.dumps({"max_sequence": result.max_sequence}).encode(),
                             based_on.version))
            if change.sink is not None:
                ops.append(self._sink_op(name, change))
            if change.dedup is not None:  # the node exists: a named writer stores it on open
                ops.append(SetOp(self.dedup_path(name), change.dedup))
            results.append(result)
        try:
            await self.zk.multi(ops)
        except (MetadataVersionError, MetadataExistsError, MetadataNotFoundError) as exc:
            # a list (or a sink record) moved since its `based_on` was read
            moved = ", ".join(f"stream {name!r} since version {based_on.version}" for name, based_on, _ in commits)
            raise MetadataVersionError(f"the segment list changed ({moved}): {exc}") from exc
        return results

    def _sink_op(self, name: str, change: SegmentChange) -> Op:
        sink = change.sink
        assert sink is not None
        data = json.dumps({"batch": sink.batch_id, "format": SINK_NODE_FORMAT, "ledgers": list(sink.ledgers),
                           "committed_ms": wall_ms()}, sort_keys=True).encode()
        path = self.sink_path(name, sink.sink_id)
        return CreateOp(path, data) if sink.previous is None else SetOp(path, data, sink.previous.version)

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
        ours = await self._lock_node(base, f"{LOCK_PREFIX}{uuid.uuid4().hex}-", description)
        our_name = ours.rsplit("/", 1)[1]
        changed = asyncio.Event()
        unwatch = self.zk.watch_children(base, lambda children: changed.set())
        deadline = self.clock.monotonic_s() + timeout_s
        try:
            while True:
                children = sorted(await self.zk.children(base), key=_lock_sequence)
                if children and children[0] == our_name:
                    return ours
                remaining_s = deadline - self.clock.monotonic_s()
                if remaining_s <= 0:
                    await self.unlock(ours)
                    return None
                changed.clear()
                try:
                    async with asyncio.timeout(min(remaining_s, LOCK_POLL_S)):
                        await changed.wait()
                except TimeoutError:
                    pass
        except BaseException:
            await _quietly(self.unlock(ours))
            raise
        finally:
            unwatch()

    async def _lock_node(self, base: str, prefix: str, data: bytes) -> str:
        """Create our sequential node; after a lost answer, find the one the attempt made."""
        try:
            return await self.zk.create(f"{base}/{prefix}", data, ephemeral=True, sequence=True)
        except MetadataError as exc:
            if not exc.retryable:
                raise
            found = [child for child in await self.zk.children(base) if child.startswith(prefix)]
            if found:
                return f"{base}/{found[0]}"
            raise

    async def lock_holder(self, name: str) -> dict[str, Any] | None:
        """Who holds the writer lock now: its description (host, pid, started_ms; {} when its node
        holds none), or None when the lock is free."""
        base = self.lock_path(name)
        try:
            children = sorted(await self.zk.children(base), key=_lock_sequence)
        except MetadataNotFoundError as exc:
            raise self.not_found(name) from exc
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

    async def claim_runner(self, name: str, runner: str) -> str | None:
        """An ephemeral `runner` node holding the runner's id: whoever made it holds the claim."""
        return await self._claim(name, self.runner_path(name), runner)

    async def claim_offloader(self, name: str, offloader: str) -> str | None:
        """An ephemeral `offloader` node holding the offloader's id, as `claim_runner`."""
        return await self._claim(name, self.offloader_path(name), offloader)

    async def _claim(self, name: str, path: str, holder_id: str) -> str | None:
        try:
            await self.zk.create(path, holder_id.encode(), ephemeral=True)
            return None
        except MetadataExistsError:
            pass
        except MetadataNotFoundError as exc:
            raise self.not_found(name) from exc
        found = await self.zk.get_or_none(path)
        if found is None:  # its holder's session ended as we looked: the next round takes it
            return "(none)"
        holder = found[0].decode(errors="replace")
        return None if holder == holder_id else holder

    async def release_offloader(self, name: str, offloader: str) -> None:
        path = self.offloader_path(name)
        found = await self.zk.get_or_none(path)
        if found is not None and found[0].decode(errors="replace") == offloader:
            try:
                await self.zk.delete(path, found[1])
            except (MetadataNotFoundError, MetadataVersionError):
                pass

    async def tier_status(self, name: str) -> dict[str, Any] | None:
        found = await self.zk.get_or_none(self.tier_status_path(name))
        if found is None:
            return None
        try:
            document = json.loads(found[0])
        except ValueError as exc:
            raise CorruptMetadataError(f"stream {name!r}: its tier status is not JSON: {exc}") from exc
        return document if isinstance(document, dict) else None

    async def store_tier_status(self, name: str, status: dict[str, Any]) -> None:
        try:
            await self._put(self.tier_status_path(name), json.dumps(status, sort_keys=True).encode())
        except MetadataNotFoundError as exc:  # its stream's node is gone
            raise self.not_found(name) from exc

    async def namespace_tier(self) -> TierPolicy | None:
        found = await self.zk.get_or_none(self.namespace_tier_path())
        return None if found is None else TierPolicy.from_bytes(found[0])

    async def set_namespace_tier(self, policy: TierPolicy) -> None:
        path = self.namespace_tier_path()
        if not policy.set_fields():
            try:
                await self.zk.delete(path)
            except MetadataNotFoundError:
                pass
            return
        await self._put(path, policy.to_bytes(), parent=self.root)

    async def _put(self, path: str, data: bytes, parent: str | None = None) -> None:
        """Set a node's data, creating it when absent (`parent` first, when given); a node another
        writer created meanwhile is set again: ours is the newer. MetadataNotFoundError: the parent
        is missing."""
        try:
            await self.zk.set(path, data)
            return
        except MetadataNotFoundError:
            pass
        if parent is not None:
            await self.zk.ensure_path(parent)
        try:
            await self.zk.create(path, data)
        except MetadataExistsError:
            await self.zk.set(path, data)

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
            raise self.not_found(name) from exc
        found = await asyncio.gather(*(self.zk.get_or_none(f"{base}/{child}") for child in children))
        return {child: json.loads(item[0]) for child, item in zip(children, found, strict=True) if item is not None}

    async def commit_subscription(self, name: str, subscription: str, offset_json: dict[str, int]) -> None:
        await self._put(self.subscriber_path(name, subscription), json.dumps(offset_json, sort_keys=True).encode())

    async def delete_subscription(self, name: str, subscription: str) -> None:
        try:
            await self.zk.delete(self.subscriber_path(name, subscription))
        except MetadataNotFoundError as exc:
            raise ConfigError(f"stream {name!r} has no subscription {subscription!r}") from exc

    async def replace_subscription(self, name: str, subscription: str, expected: dict[str, int],
                                   document: dict[str, int] | None) -> bool:
        path = self.subscriber_path(name, subscription)
        found = await self.zk.get_or_none(path)
        if found is None or json.loads(found[0]) != expected:
            return False
        try:
            if document is None:
                await self.zk.delete(path, found[1])
            else:
                await self.zk.set(path, json.dumps(document, sort_keys=True).encode(), found[1])
        except (MetadataVersionError, MetadataNotFoundError):
            return False
        return True

    async def sink_batch(self, name: str, sink_id: str) -> SinkBatch | None:
        found = await self.zk.get_or_none(self.sink_path(name, sink_id))
        if found is None:
            return None
        data, version = found
        try:
            document = json.loads(data)
            return SinkBatch(int(document["batch"]), tuple(int(ledger) for ledger in document.get("ledgers", [])),
                             version)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptMetadataError(f"sink node of stream {name!r} sink {sink_id!r} is corrupt: {exc}") from exc


    # ------------------------------------------------------------------ producer dedup

    async def dedup_snapshot(self, name: str) -> tuple[bytes, int] | None:
        return await self.zk.get_or_none(self.dedup_path(name))

    async def store_dedup_snapshot(self, name: str, data: bytes, version: int | None) -> int:
        path = self.dedup_path(name)
        try:
            if version is None:
                await self.zk.create(path, data)
                return 0
            return await self.zk.set(path, data, version)
        except MetadataExistsError as exc:
            raise MetadataVersionError(f"stream {name!r}: another owner stored a dedup snapshot first") from exc
        except MetadataNotFoundError as exc:
            if version is not None:  # deleted since: the stream itself, or the node under it
                raise MetadataVersionError(f"stream {name!r}: its dedup snapshot was removed") from exc
            raise self.not_found(name) from exc


StreamStore = ZooKeeperSegmentStore  # the name tools and tests know it by


def _lock_sequence(child: str) -> tuple[int, str]:
    """Lock nodes order by the sequence ZooKeeper appended, not by their random id."""
    number = child.rsplit("-", 1)[-1]
    return (int(number), child) if number.isdigit() else (2**63, child)


async def _quietly(awaitable: object) -> None:
    try:
        await awaitable  # type: ignore[misc]
    except MetadataError:
        pass
