"""A TEST-ONLY Kafka broker kept in memory, built on dlog.serve.kafka: one node, topics of
partitions that are Python lists, dense offsets from 0, and a single-member-at-a-time group
coordinator. It exists to drive the codec with real clients before dlog's server does; it has no
durability, no limits beyond the codec's and no security, and must never ship.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dlog.serve.kafka import (
    BatchRefused,
    ErrorCode,
    Record,
    Request,
    RequestDecoder,
    RequestRefused,
    api_versions_response,
    decode_produce_records,
    encode_record_batch,
    encode_response,
)

EARLIEST, LATEST = -2, -1


@dataclass
class Group:
    generation: int = 0
    member_id: str = ""
    protocol: str | None = None
    assignment: bytes = b""
    offsets: dict[tuple[str, int], tuple[int, str | None]] = field(default_factory=dict)


class MemoryBroker:
    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], list[Record]] = defaultdict(list)
        self.partitions: dict[str, int] = {}
        self.groups: dict[str, Group] = defaultdict(Group)
        self.produced: list[Any] = []  # every ProducedBatch, to check what the clients sent
        self.versions_used: set[tuple[str, int]] = set()
        self.refusals: list[RequestRefused] = []
        self._appended = asyncio.Condition()
        self._producer_ids = itertools.count(1000)
        self._member_ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._connections:  # a client may still hold a long-polling fetch
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = RequestDecoder()
        task = asyncio.current_task()
        self._connections.add(task)  # type: ignore[arg-type]
        try:
            while data := await reader.read(65536):
                decoder.receive_data(data)
                while (event := decoder.next_event()) is not None:
                    if isinstance(event, RequestRefused):
                        self.refusals.append(event)
                        if event.response is not None:
                            writer.write(event.response)
                        if event.close_connection:
                            return
                        continue
                    # one request at a time per connection, answered in order, as Kafka does
                    self.versions_used.add((event.api.name, event.header.api_version))
                    answer = await self._handle(event)
                    if event.expects_response:
                        writer.write(encode_response(event.header, answer))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the broker stops
        finally:
            self._connections.discard(task)  # type: ignore[arg-type]
            writer.close()

    async def _handle(self, request: Request) -> Any:
        handler = getattr(self, f"_on_{request.api.name}")
        return await handler(request, request.body, request.header.api_version)

    def _topic(self, name: str, create: bool) -> int | None:
        if name not in self.partitions and create:
            self.partitions[name] = 1
        return self.partitions.get(name)

    async def _on_ApiVersions(self, request: Request, body: Any, version: int) -> Any:
        return api_versions_response(version)

    async def _on_Metadata(self, request: Request, body: Any, version: int) -> Any:
        create = version < 4 or body.allow_auto_topic_creation
        names = list(self.partitions) if not body.topics else [topic.name for topic in body.topics]
        topics = []
        for name in names:
            count = self._topic(name, create)
            Topic, Partition = request.api.response.MetadataResponseTopic, request.api.response.MetadataResponseTopic.MetadataResponsePartition
            if count is None:
                topics.append(Topic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]))
                continue
            topics.append(Topic(error_code=0, name=name, is_internal=False, partitions=[
                Partition(error_code=0, partition_index=index, leader_id=0, leader_epoch=-1,
                          replica_nodes=[0], isr_nodes=[0], offline_replicas=[]) for index in range(count)]))
        broker = request.api.response.MetadataResponseBroker(node_id=0, host="127.0.0.1", port=self.port, rack=None)
        return request.response(throttle_time_ms=0, brokers=[broker], cluster_id="memory-broker",
                                controller_id=0, topics=topics)

    async def _on_InitProducerId(self, request: Request, body: Any, version: int) -> Any:
        return request.response(throttle_time_ms=0, error_code=0, producer_id=next(self._producer_ids),
                                producer_epoch=0)

    async def _on_Produce(self, request: Request, body: Any, version: int) -> Any:
        TopicAnswer = request.api.response.TopicProduceResponse
        answers = []
        for topic in body.topic_data:
            partitions = []
            for part in topic.partition_data:
                partitions.append(self._append(TopicAnswer.PartitionProduceResponse, topic.name, part, version))
            answers.append(TopicAnswer(name=topic.name, partition_responses=partitions))
        async with self._appended:
            self._appended.notify_all()
        return request.response(responses=answers, throttle_time_ms=0)

    def _append(self, Answer: Any, topic: str, part: Any, version: int) -> Any:
        count = self._topic(topic, create=True)
        if part.index >= count:
            return Answer(index=part.index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, base_offset=-1)
        batch = decode_produce_records(part.records, version)
        if isinstance(batch, BatchRefused):
            return Answer(index=part.index, error_code=batch.error, base_offset=-1, error_message=batch.reason)
        self.produced.append(batch)
        log = self.logs[(topic, part.index)]
        base_offset = len(log)
        log.extend(batch.records)
        return Answer(index=part.index, error_code=0, base_offset=base_offset,
                      log_append_time_ms=-1, log_start_offset=0)

    async def _on_Fetch(self, request: Request, body: Any, version: int) -> Any:
        deadline = time.monotonic() + body.max_wait_ms / 1000
        async with self._appended:
            while not self._fetchable(body) and (remaining := deadline - time.monotonic()) > 0:
                try:
                    async with asyncio.timeout(remaining):  # the long poll on the partitions' tails
                        await self._appended.wait()
                except TimeoutError:
                    break
        Topic = request.api.response.FetchableTopicResponse
        responses = [Topic(topic=topic.topic, partitions=[self._fetch_partition(Topic.PartitionData, topic.topic, part)
                                                          for part in topic.partitions])
                     for topic in body.topics]
        return request.response(throttle_time_ms=0, error_code=0, session_id=0, responses=responses)

    def _fetchable(self, body: Any) -> bool:
        return any(part.fetch_offset < len(self.logs[(topic.topic, part.partition)])
                   for topic in body.topics for part in topic.partitions)

    def _fetch_partition(self, Answer: Any, topic: str, part: Any) -> Any:
        log = self.logs[(topic, part.partition)]
        common = dict(partition_index=part.partition, high_watermark=len(log), last_stable_offset=len(log),
                      log_start_offset=0, aborted_transactions=[], preferred_read_replica=-1)
        if topic not in self.partitions or part.partition >= self.partitions[topic]:
            return Answer(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, records=b"", **common)
        if not 0 <= part.fetch_offset <= len(log):
            return Answer(error_code=ErrorCode.OFFSET_OUT_OF_RANGE, records=b"", **common)
        chunk = log[part.fetch_offset: part.fetch_offset + 500]
        return Answer(error_code=0, records=encode_record_batch(part.fetch_offset, chunk), **common)

    async def _on_ListOffsets(self, request: Request, body: Any, version: int) -> Any:
        Topic = request.api.response.ListOffsetsTopicResponse
        topics = []
        for topic in body.topics:
            partitions = []
            for part in topic.partitions:
                log = self.logs[(topic.name, part.partition_index)]
                offset = self._offset_for_time(log, part.timestamp)
                partitions.append(Topic.ListOffsetsPartitionResponse(
                    partition_index=part.partition_index, error_code=0, old_style_offsets=[offset],
                    timestamp=-1, offset=offset, leader_epoch=-1))
            topics.append(Topic(name=topic.name, partitions=partitions))
        return request.response(throttle_time_ms=0, topics=topics)

    @staticmethod
    def _offset_for_time(log: list[Record], timestamp: int) -> int:
        if timestamp == EARLIEST:
            return 0
        if timestamp == LATEST:
            return len(log)
        return next((index for index, record in enumerate(log) if record.timestamp_ms >= timestamp), len(log))

    async def _on_FindCoordinator(self, request: Request, body: Any, version: int) -> Any:
        return request.response(throttle_time_ms=0, error_code=0, error_message=None, node_id=0,
                                host="127.0.0.1", port=self.port)

    async def _on_JoinGroup(self, request: Request, body: Any, version: int) -> Any:
        group = self.groups[body.group_id]
        group.generation += 1
        group.member_id = body.member_id or f"member-{next(self._member_ids)}"
        protocol = body.protocols[0]
        group.protocol = protocol.name
        member = request.api.response.JoinGroupResponseMember(member_id=group.member_id, group_instance_id=None,
                                                              metadata=protocol.metadata)
        return request.response(throttle_time_ms=0, error_code=0, generation_id=group.generation,
                                protocol_name=protocol.name, leader=group.member_id,
                                member_id=group.member_id, members=[member])

    async def _on_SyncGroup(self, request: Request, body: Any, version: int) -> Any:
        group = self.groups[body.group_id]
        for assignment in body.assignments:
            if assignment.member_id == body.member_id:
                group.assignment = assignment.assignment
        return request.response(throttle_time_ms=0, error_code=0, assignment=group.assignment)

    async def _on_Heartbeat(self, request: Request, body: Any, version: int) -> Any:
        return request.response(throttle_time_ms=0, error_code=0)

    async def _on_LeaveGroup(self, request: Request, body: Any, version: int) -> Any:
        return request.response(throttle_time_ms=0, error_code=0)

    async def _on_OffsetCommit(self, request: Request, body: Any, version: int) -> Any:
        group = self.groups[body.group_id]
        Topic = request.api.response.OffsetCommitResponseTopic
        topics = []
        for topic in body.topics:
            for part in topic.partitions:
                group.offsets[(topic.name, part.partition_index)] = (part.committed_offset, part.committed_metadata)
            topics.append(Topic(name=topic.name, partitions=[
                Topic.OffsetCommitResponsePartition(partition_index=part.partition_index, error_code=0)
                for part in topic.partitions]))
        return request.response(throttle_time_ms=0, topics=topics)

    async def _on_OffsetFetch(self, request: Request, body: Any, version: int) -> Any:
        group = self.groups[body.group_id]
        Topic = request.api.response.OffsetFetchResponseTopic
        wanted = ([(topic.name, topic.partition_indexes) for topic in body.topics] if body.topics is not None
                  else [(name, [index]) for name, index in group.offsets])
        topics = []
        for name, indexes in wanted:
            partitions = []
            for index in indexes:
                offset, metadata = group.offsets.get((name, index), (-1, ""))
                partitions.append(Topic.OffsetFetchResponsePartition(
                    partition_index=index, committed_offset=offset, metadata=metadata, error_code=0))
            topics.append(Topic(name=name, partitions=partitions))
        return request.response(throttle_time_ms=0, topics=topics, error_code=0)

    async def _on_CreateTopics(self, request: Request, body: Any, version: int) -> Any:
        Result = request.api.response.CreatableTopicResult
        results = []
        for topic in body.topics:
            exists = topic.name in self.partitions
            if not exists and not body.validate_only:
                self.partitions[topic.name] = max(topic.num_partitions, 1)
            results.append(Result(name=topic.name, error_code=ErrorCode.TOPIC_ALREADY_EXISTS if exists else 0,
                                  error_message=None))
        return request.response(throttle_time_ms=0, topics=results)
