"""Consumer groups on their coordinator: FindCoordinator, JoinGroup, SyncGroup, Heartbeat and
LeaveGroup driven through the pure `dlog.serve.groups.GroupCoordinator` (requests in, replies and
the next wake-up out), and committed offsets stored as dlog subscriptions.

The coordinator of a group is the live server rendezvous hashing picks for the group id
(`ownership.coordinator_of`); another server answers NOT_COORDINATOR. Membership lives in the
coordinator's memory (members rejoin a new coordinator when told UNKNOWN_MEMBER_ID). A committed
offset (a stream position) is stored as the subscription named after the group on the
partition's stream, so `dlog subscription describe STREAM GROUP` shows the group's lag and
retention keeps what it has not consumed; OffsetFetch reads it back from there (after a restart
too), through a small cache of what this coordinator stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Any

from kafka.protocol.api_message import ApiMessage

from bookkeeper.errors import DlogError
from bookkeeper.security.authz import Action
from dlog.namespace import Namespace
from dlog.offsets import Offset
from dlog.reader import OffsetOutOfRangeError, PositionsUnknownError, TruncatedError
from dlog.segments.port import StreamNotFoundError
from dlog.serve.group_messages import (
    CommitOffset,
    GroupLimits,
    Heartbeat,
    HeartbeatResult,
    JoinGroup,
    JoinResult,
    LeaveGroup,
    LeaveResult,
    OffsetCommit,
    Outcome,
    Protocol,
    Result,
    SyncGroup,
    SyncResult,
)
from dlog.serve.groups import GroupCoordinator
from dlog.serve.kafka import ErrorCode, Request
from dlog.serve.kafka.apis import (
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from dlog.serve.ownership import coordinator_of, partition_stream
from dlog.server.api import ConnectionState, Handler, KafkaApi
from dlog.server.registry import Registry
from dlog.server.streams import Topics

log = logging.getLogger(__name__)
COMMITTED_KEPT_MAX = 100_000  # (group, topic, partition) positions this coordinator remembers


class GroupService:
    def __init__(self, ns: Namespace, registry: Registry, topics: Topics, limits: GroupLimits | None = None) -> None:
        self.ns = ns
        self.registry = registry
        self.topics = topics
        me = registry.me
        self.coordinator = GroupCoordinator(limits, incarnation=f"{me.server_id if me else 0}-{ns.clock.wall_ms()}")
        self._waiting: dict[Hashable, asyncio.Future[Result]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._committed: dict[tuple[str, str, int], tuple[int, str | None]] = {}

    def handlers(self, api: KafkaApi) -> dict[int, Handler]:
        return {FIND_COORDINATOR: self.find_coordinator, JOIN_GROUP: self.join, SYNC_GROUP: self.sync,
                HEARTBEAT: self.heartbeat, LEAVE_GROUP: self.leave, OFFSET_COMMIT: self.commit,
                OFFSET_FETCH: self.fetch_offsets}

    def _now_ms(self) -> int:
        return self.ns.clock.wall_ms()

    def _coordinates(self, group_id: str) -> bool:
        me = self.registry.me
        return me is not None and coordinator_of(group_id, self.registry.live) == me.server_id

    # ------------------------------------------------------------------ the machine's outcomes

    def _run(self, outcome: Outcome) -> None:
        for reply in outcome.replies:
            waiting = self._waiting.pop(reply.request, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(reply.result)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if outcome.wake_at_ms is not None:
            delay_s = max(0.0, (outcome.wake_at_ms - self._now_ms()) / 1000)
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_time)

    def _on_time(self) -> None:
        self._timer = None
        self._run(self.coordinator.on_time(self._now_ms()))

    async def _submit(self, event: Any, value: Any) -> Result:
        key = object()
        waiting: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiting
        self._run(event(key, value, self._now_ms()))
        return await waiting

    def stop(self) -> None:
        self._run(self.coordinator.unload())
        if self._timer is not None:
            self._timer.cancel()

    # ------------------------------------------------------------------ requests

    async def find_coordinator(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        version = request.header.api_version
        key_type = body.key_type if version >= 1 else 0
        if key_type == 0 and state.refused(Action.SUBSCRIBE) is not None:
            return request.response(throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                    error_message="the principal may not use consumer groups here", node_id=-1,
                                    host="", port=-1)
        chosen = coordinator_of(body.key, self.registry.live) if key_type == 0 else None
        info = self.registry.servers.get(chosen) if chosen is not None else None
        if info is None:
            return request.response(throttle_time_ms=0, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                    error_message="no coordinator for this key", node_id=-1, host="", port=-1)
        return request.response(throttle_time_ms=0, error_code=0, error_message=None, node_id=info.server_id,
                                host=info.host, port=info.kafka_port)

    async def join(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        version = request.header.api_version
        if state.refused(Action.SUBSCRIBE) is not None:
            result: Result = JoinResult(ErrorCode.GROUP_AUTHORIZATION_FAILED, body.member_id)
        elif not self._coordinates(body.group_id):
            result = JoinResult(ErrorCode.NOT_COORDINATOR, body.member_id)
        else:
            join = JoinGroup(body.group_id, body.member_id, request.header.client_id or "", body.protocol_type,
                             tuple(Protocol(p.name, bytes(p.metadata)) for p in body.protocols),
                             body.session_timeout_ms,
                             body.rebalance_timeout_ms if version >= 1 else body.session_timeout_ms,
                             version >= 4)
            result = await self._submit(self.coordinator.on_join, join)
        assert isinstance(result, JoinResult)
        Member = request.api.response.JoinGroupResponseMember
        return request.response(throttle_time_ms=0, error_code=result.error, generation_id=result.generation_id,
                                protocol_name=result.protocol_name or "", leader=result.leader_id,
                                member_id=result.member_id,
                                members=[Member(member_id=member_id, group_instance_id=None, metadata=metadata)
                                         for member_id, metadata in result.members])

    async def sync(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        if state.refused(Action.SUBSCRIBE) is not None:
            result: Result = SyncResult(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        elif not self._coordinates(body.group_id):
            result = SyncResult(ErrorCode.NOT_COORDINATOR)
        else:
            sync = SyncGroup(body.group_id, body.generation_id, body.member_id,
                             tuple((a.member_id, bytes(a.assignment)) for a in body.assignments))
            result = await self._submit(self.coordinator.on_sync, sync)
        assert isinstance(result, SyncResult)
        return request.response(throttle_time_ms=0, error_code=result.error, assignment=result.assignment)

    async def heartbeat(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        if state.refused(Action.SUBSCRIBE) is not None:
            result: Result = HeartbeatResult(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        elif not self._coordinates(body.group_id):
            result = HeartbeatResult(ErrorCode.NOT_COORDINATOR)
        else:
            result = await self._submit(self.coordinator.on_heartbeat,
                                        Heartbeat(body.group_id, body.generation_id, body.member_id))
        return request.response(throttle_time_ms=0, error_code=result.error)

    async def leave(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        if state.refused(Action.SUBSCRIBE) is not None:
            result: Result = LeaveResult(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        elif not self._coordinates(body.group_id):
            result = LeaveResult(ErrorCode.NOT_COORDINATOR)
        else:
            result = await self._submit(self.coordinator.on_leave, LeaveGroup(body.group_id, body.member_id))
        return request.response(throttle_time_ms=0, error_code=result.error)

    # ------------------------------------------------------------------ offsets as subscriptions

    async def commit(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        group_id = body.group_id
        offsets = tuple(CommitOffset(topic.name, part.partition_index, part.committed_offset, part.committed_metadata)
                        for topic in body.topics for part in topic.partitions)
        if state.refused(Action.SUBSCRIBE) is not None:
            errors = [(o.topic, o.partition, ErrorCode.GROUP_AUTHORIZATION_FAILED) for o in offsets]
        elif not self._coordinates(group_id):
            errors = [(o.topic, o.partition, ErrorCode.NOT_COORDINATOR) for o in offsets]
        else:
            judged = self.coordinator.on_commit(OffsetCommit(group_id, body.generation_id_or_member_epoch,
                                                             body.member_id, offsets), self._now_ms())
            stored = {(o.topic, o.partition): await self._store(group_id, o) for o in judged.to_store}
            errors = [(topic, partition, stored.get((topic, partition), error))
                      for topic, partition, error in judged.errors]
        Topic = request.api.response.OffsetCommitResponseTopic
        by_topic: dict[str, list[Any]] = {}
        for topic, partition, error in errors:
            by_topic.setdefault(topic, []).append(
                Topic.OffsetCommitResponsePartition(partition_index=partition, error_code=error))
        return request.response(throttle_time_ms=0, topics=[Topic(name=name, partitions=parts)
                                                            for name, parts in by_topic.items()])

    async def _store(self, group_id: str, commit: CommitOffset) -> ErrorCode:
        count = await self.topics.partitions(commit.topic)
        if count is None or not 0 <= commit.partition < count:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        stream = partition_stream(commit.topic, commit.partition, count)
        try:
            offset = await self._offset_at(stream, commit.offset)
            if offset is None:
                return ErrorCode.OFFSET_OUT_OF_RANGE
            await self.ns.commit_subscription(stream, group_id, offset)
        except DlogError as exc:
            log.warning("cannot store group %s's offset %d of %s: %s", group_id, commit.offset, stream, exc)
            return ErrorCode.INVALID_GROUP_ID if "subscription name" in str(exc) else ErrorCode.KAFKA_STORAGE_ERROR
        if len(self._committed) >= COMMITTED_KEPT_MAX:
            self._committed.clear()
        self._committed[(group_id, commit.topic, commit.partition)] = (commit.offset, commit.metadata)
        return ErrorCode.NONE

    async def _offset_at(self, stream: str, position: int) -> Offset | None:
        """The dlog offset of stream position `position` (the next record to read; at the end,
        the slot after the last record)."""
        context = self.ns.context_of(await self.ns.store.config(stream))
        view = await context.reads.view(context.store, stream, context.password)
        found = await context.reads.locate(view, position, context.password)
        if found.offset is not None:
            return found.offset
        if found.cursor is not None:
            index = view.index_at(found.cursor)
            if index < len(view.segments):
                return Offset(view.segments[index].ledger_id, found.cursor.entry_id, found.cursor.slot, position)
        return None

    async def fetch_offsets(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        group_id = body.group_id
        Topic = request.api.response.OffsetFetchResponseTopic
        if state.refused(Action.SUBSCRIBE) is not None:
            Partition = Topic.OffsetFetchResponsePartition
            return request.response(throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, topics=[
                Topic(name=topic.name, partitions=[Partition(partition_index=index, committed_offset=-1, metadata="",
                                                             error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
                                                   for index in topic.partition_indexes])
                for topic in body.topics or ()])
        if not self._coordinates(group_id):
            return request.response(throttle_time_ms=0, topics=[], error_code=ErrorCode.NOT_COORDINATOR)
        if body.topics is None:
            wanted = sorted({(topic, [p for (g, t, p) in self._committed if g == group_id and t == topic])
                             for (g, topic, _) in self._committed if g == group_id}, key=lambda item: item[0])
        else:
            wanted = [(topic.name, list(topic.partition_indexes)) for topic in body.topics]
        topics = []
        for name, partitions in wanted:
            answers = []
            for partition in partitions:
                position, metadata = await self._committed_position(group_id, name, partition)
                answers.append(Topic.OffsetFetchResponsePartition(partition_index=partition, committed_offset=position,
                                                                  metadata=metadata or "", error_code=0))
            topics.append(Topic(name=name, partitions=answers))
        return request.response(throttle_time_ms=0, topics=topics, error_code=0)

    async def _committed_position(self, group_id: str, topic: str, partition: int) -> tuple[int, str | None]:
        kept = self._committed.get((group_id, topic, partition))
        if kept is not None:
            return kept
        count = await self.topics.partitions(topic)
        if count is None or not 0 <= partition < count:
            return -1, None
        stream = partition_stream(topic, partition, count)
        try:
            offset = (await self.ns.subscriptions(stream)).get(group_id)
        except (StreamNotFoundError, DlogError):
            return -1, None
        if offset is None:
            return -1, None
        position = await self._position_of(stream, offset)
        if position is not None:
            self._committed[(group_id, topic, partition)] = (position, None)
        return (-1 if position is None else position), None

    async def _position_of(self, stream: str, offset: Offset) -> int | None:
        """The stream position of a stored subscription offset: the next record's, or the end."""
        try:
            async with self.ns.open_reader(stream, start=offset, follow=False, read_ahead_entries=1) as reader:
                entry = await reader.next_entry(timeout_s=5.0)
                if entry is not None and entry.first_position is not None:
                    return entry.first_position
        except (TruncatedError, OffsetOutOfRangeError, PositionsUnknownError):
            return None
        _, end = await self.ns.position_bounds(stream)
        return end
