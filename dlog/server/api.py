"""The Kafka requests, answered over dlog streams (docs/serving.md says what each does).

A topic's partition is a stream (`dlog.serve.ownership.partition_stream`); a Kafka offset is the
record's stream position. Produce and Fetch go to the stream's owner (others answer
NOT_LEADER_OR_FOLLOWER; Metadata names the owner as the partition's leader). A produced batch is
written through the owner's one writer and answered once durable, with its first record's
position as base offset. A fetch reads the owner's in-memory tail of durable records, or the
stream through a reader the connection keeps for its next fetch; it long-polls the tail for
`max_wait_ms` until `min_bytes` are there.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pyarrow as pa
from kafka.protocol.api_message import ApiMessage

from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.clock import monotonic_s
from bookkeeper.errors import ConfigError, DlogError, MetadataExistsError, MetadataVersionError
from bookkeeper.security import authz
from bookkeeper.security.authz import ANONYMOUS, Principal
from dlog.core.dedup import kafka_producer
from dlog.core.errors import BacklogExceededError
from dlog.namespace import Namespace
from dlog.reader import EntryBatch, OffsetOutOfRangeError, PositionsUnknownError, StreamReader, TruncatedError
from dlog.segments.typed_json import json_records, record_times_ms
from dlog.serve.kafka import (
    SUPPORTED_APIS,
    Api,
    BatchRefused,
    ErrorCode,
    Record,
    Request,
    api_versions_response,
    decode_produce_records,
    encode_record_batch,
    encode_record_columns,
)
from dlog.serve.kafka.apis import (
    API_VERSIONS,
    FETCH,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
)
from dlog.serve.ownership import partition_stream
from dlog.serve.producer_ids import ProducerIdBlock, ProducerIds, block_after
from dlog.server.owned import OwnedStream, ReadOnlyStream
from dlog.server.registry import Registry
from dlog.server.settings import ServerSettings
from dlog.server.streams import Redirect, Streams, Topics

log = logging.getLogger(__name__)
refusals = RateLimitedLog(log)
EARLIEST, LATEST = -2, -1  # ListOffsets' special timestamps
HISTORY_FIRST_ENTRY_WAIT_S = 1.0  # a fetch below the tail waits this long for the first entry
TIME_LOOKUP_WAIT_S = 5.0  # ListOffsets by timestamp reads for this long at most
READ_AHEAD_ENTRIES = 16  # of a fetch's reader (it serves one connection)
READ_AHEAD_BYTES = 4 << 20
PRODUCER_ID_BLOCK_NODE = "producer_id_block"


class ConnectionState:
    """What one connection's requests keep between them: the stream readers of its fetches, each
    kept at the position it stopped, for the next fetch there (at most `readers_max`); and the
    produce turns: Kafka processes a connection's requests in order, so a Produce request's batch
    for a partition is buffered only after the batch of the request before it for that partition
    was buffered (or refused), however their routing awaits interleave.

    And who the client is: `principal` (None until SASL succeeded on a server that requires it;
    the anonymous admin on one that does not), checked against the roles of the server's
    namespace (`bookkeeper.security.authz`) by every request that touches it."""

    def __init__(self, readers_max: int, namespace: str = "", principal: Principal | None = ANONYMOUS) -> None:
        self.readers_max = readers_max
        self.namespace = namespace
        self.principal = principal
        self.readers: OrderedDict[tuple[str, int], StreamReader] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._turns: dict[tuple[str, int], asyncio.Future[None]] = {}

    def produce_turn(self, topic: str, partition: int) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """(the previous request's turn for the partition, still pending or None; this request's),
        taken in request order (synchronously, as the request starts); `end_turn` ends it."""
        key = (topic, partition)
        previous = self._turns.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns[key] = mine
        return (previous if previous is not None and not previous.done() else None), mine

    def end_turn(self, topic: str, partition: int, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._turns.get((topic, partition)) is mine:
            del self._turns[(topic, partition)]

    def may(self, action: authz.Action) -> bool:
        return self.principal is not None and authz.decide(self.principal, action, self.namespace) is None

    def refused(self, action: authz.Action) -> str | None:
        """Why the client may not do `action` in the namespace (one rate-limited line), or None."""
        if self.principal is None:
            return "the client has not authenticated"
        reason = authz.decide(self.principal, action, self.namespace)
        if reason is not None:
            refusals.warning(f"authz {action.name}", "Kafka request refused: %s", reason)
        return reason

    def take_reader(self, stream: str, position: int) -> StreamReader | None:
        return self.readers.pop((stream, position), None)

    def keep_reader(self, stream: str, position: int, reader: StreamReader) -> None:
        old = self.readers.pop((stream, position), None)
        if old is not None:
            self._close(old)
        self.readers[(stream, position)] = reader
        while len(self.readers) > self.readers_max:
            self._close(self.readers.popitem(last=False)[1])

    def _close(self, reader: StreamReader) -> None:
        task = asyncio.get_running_loop().create_task(reader.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        readers = list(self.readers.values())
        self.readers.clear()
        await asyncio.gather(*(reader.close() for reader in readers), *self._closing, return_exceptions=True)


Handler = Callable[[Request, Any, ConnectionState], Awaitable[ApiMessage]]


class KafkaApi:
    def __init__(self, ns: Namespace, settings: ServerSettings, registry: Registry, streams: Streams,
                 topics: Topics) -> None:
        self.ns = ns
        self.settings = settings
        self.registry = registry
        self.streams = streams
        self.topics = topics
        self._producer_ids = ProducerIds()
        self._producer_ids_claim = asyncio.Lock()
        self.handlers: dict[int, Handler] = {
            API_VERSIONS: self.api_versions, METADATA: self.metadata, PRODUCE: self.produce, FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets, INIT_PRODUCER_ID: self.init_producer_id,
        }
        if settings.token_key is not None:  # listed by ApiVersions; the connection answers them until authenticated
            self.handlers.update({SASL_HANDSHAKE: self.sasl_again, SASL_AUTHENTICATE: self.sasl_again})
        # counters, exported
        self.records_produced = 0
        self.records_fetched = 0
        self.authentications = 0  # SASL exchanges that succeeded
        self.authentications_failed = 0  # SASL exchanges refused (bad token, malformed message)

    def add_handlers(self, handlers: dict[int, Handler]) -> None:
        self.handlers.update(handlers)

    @property
    def apis(self) -> dict[int, Api]:
        """The APIs this server answers: ApiVersions lists only these."""
        return {key: api for key, api in SUPPORTED_APIS.items() if key in self.handlers}

    @property
    def me(self) -> int:
        return self.streams.me

    async def handle(self, request: Request, state: ConnectionState) -> ApiMessage | None:
        """The answer to `request` (None: the server does not answer this API: close)."""
        handler = self.handlers.get(request.api.key)
        if handler is None:
            refusals.warning("api", "%s requests are not served yet (client %s): the connection is closed",
                             request.api.name, request.header.client_id)
            return None
        return await handler(request, request.body, state)

    # ------------------------------------------------------------------ ApiVersions, Metadata, SASL

    async def sasl_again(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        """SASL on a connection that authenticated already: dlog does not re-authenticate (its
        SaslAuthenticate answers give no session lifetime, so clients do not try)."""
        refusals.warning("sasl again", "%s after authentication refused (client %s)", request.api.name,
                         request.header.client_id)
        if request.api.key == SASL_HANDSHAKE:
            return request.response(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])
        return request.response(error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message="already authenticated",
                                auth_bytes=b"", session_lifetime_ms=0)

    async def api_versions(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        return api_versions_response(request.header.api_version, apis=self.apis)

    async def metadata(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        version = request.header.api_version
        Response = request.api.response
        Topic, Partition = Response.MetadataResponseTopic, Response.MetadataResponseTopic.MetadataResponsePartition
        readable = state.may(authz.Action.READ)
        if body.topics is None or (version == 0 and not body.topics):
            wanted = await self.topics.all() if readable else {}  # Kafka lists only the topics one may describe
            names = sorted(wanted)
        else:
            names = [topic.name for topic in body.topics]
        create = (self.settings.auto_create_topics and (version < 4 or bool(body.allow_auto_topic_creation))
                  and state.may(authz.Action.ADD))  # a producer creates streams (docs/security.md)
        topics = []
        for name in names:
            if not readable:
                state.refused(authz.Action.READ)
                topics.append(Topic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name, is_internal=False,
                                    partitions=[]))
                continue
            count = await self._partitions(name, create)
            if count is None:
                topics.append(Topic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name, is_internal=False,
                                    partitions=[]))
                continue
            partitions = []
            for index in range(count):
                leader, error = await self._leader(partition_stream(name, index, count))
                replicas = [leader] if leader >= 0 else []
                partitions.append(Partition(error_code=error, partition_index=index, leader_id=leader,
                                            leader_epoch=-1, replica_nodes=replicas, isr_nodes=replicas,
                                            offline_replicas=[]))
            topics.append(Topic(error_code=0, name=name, is_internal=False, partitions=partitions))
        brokers = [Response.MetadataResponseBroker(node_id=info.server_id, host=info.host, port=info.kafka_port,
                                                   rack=None)
                   for info in sorted(self.registry.servers.values(), key=lambda info: info.server_id)]
        return request.response(throttle_time_ms=0, brokers=brokers, cluster_id=f"dlog-{self.ns.name}",
                                controller_id=self.me, topics=topics)

    async def _partitions(self, topic: str, create: bool) -> int | None:
        count = await self.topics.partitions(topic)
        if count is None and create:
            try:
                await self.topics.create(topic, 1)
            except DlogError as exc:  # a bad name, a quota
                refusals.warning("create", "cannot create topic %r: %s", topic, exc)
                return None
            count = 1
        return count

    async def _leader(self, stream: str) -> tuple[int, ErrorCode]:
        route = await self.streams.route(stream, take=False)
        if isinstance(route, OwnedStream | ReadOnlyStream):
            return self.me, ErrorCode.NONE
        if isinstance(route, Redirect):
            return route.server_id, ErrorCode.NONE
        if route is ErrorCode.NOT_LEADER_OR_FOLLOWER:
            return -1, ErrorCode.LEADER_NOT_AVAILABLE
        return -1, route

    async def _owned(self, topic: str, partition: int,
                     create: bool = False) -> OwnedStream | ReadOnlyStream | ErrorCode:
        count = await self._partitions(topic, create)
        if count is None or not 0 <= partition < count:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        route = await self.streams.route(partition_stream(topic, partition, count))
        if isinstance(route, Redirect):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return route

    # ------------------------------------------------------------------ Produce

    async def produce(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        version = request.header.api_version
        TopicAnswer = request.api.response.TopicProduceResponse
        Answer = TopicAnswer.PartitionProduceResponse
        acks = body.acks
        if body.transactional_id is not None:
            error: ErrorCode | None = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif state.refused(authz.Action.ADD) is not None:
            error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif acks not in (0, 1, -1):
            error = ErrorCode.INVALID_REQUIRED_ACKS
        else:
            error = None
        work: list[tuple[str, Any, Awaitable[tuple[ErrorCode, int]]]] = []
        for topic in body.topic_data:
            for part in topic.partition_data:
                if error is not None:
                    work.append((topic.name, part, _done((error, -1))))
                else:  # in request order: each producer's order is kept (ConnectionState)
                    turn = state.produce_turn(topic.name, part.index)
                    work.append((topic.name, part, self._produce_partition(topic.name, part, version, acks, turn,
                                                                           state)))
        answers: dict[str, list[Any]] = {}
        if len(work) == 1:  # one partition (a producer's usual request): no task for it
            results: list[tuple[ErrorCode, int]] = [await work[0][2]]
        else:
            results = await asyncio.gather(*(task for _, _, task in work))
        for (name, part, _), (code, base) in zip(work, results, strict=True):
            answers.setdefault(name, []).append(Answer(index=part.index, error_code=code, base_offset=base,
                                                       log_append_time_ms=-1, log_start_offset=-1))
        return request.response(responses=[TopicAnswer(name=name, partition_responses=parts)
                                           for name, parts in answers.items()], throttle_time_ms=0)

    async def _produce_partition(self, topic: str, part: Any, version: int, acks: int,
                                 turn: tuple[asyncio.Future[None] | None, asyncio.Future[None]],
                                 state: ConnectionState) -> tuple[ErrorCode, int]:
        previous, mine = turn
        try:
            if previous is not None:
                await asyncio.shield(previous)  # the request before this one buffered its batch, or gave up
            return await self._produce_in_turn(topic, part, version, acks, lambda: state.end_turn(topic, part.index,
                                                                                                     mine))
        finally:
            state.end_turn(topic, part.index, mine)

    async def _produce_in_turn(self, topic: str, part: Any, version: int, acks: int,
                               buffered: Callable[[], None]) -> tuple[ErrorCode, int]:
        batch = decode_produce_records(part.records, version, batch_bytes_max=self.settings.batch_bytes_max)
        if isinstance(batch, BatchRefused):
            refusals.warning(f"batch {batch.error.name}", "produce to %s-%d refused (%s): %s", topic, part.index,
                             batch.error.name, batch.reason)
            return batch.error, -1
        owned = await self._owned(topic, part.index, create=self.settings.auto_create_topics)
        if isinstance(owned, ReadOnlyStream):  # a typed stream: Kafka producers cannot write it
            refusals.warning("record", "produce to %s-%d refused: %s", topic, part.index, owned.check(batch.records))
            return ErrorCode.INVALID_RECORD, -1
        if not isinstance(owned, OwnedStream):
            return owned, -1
        problem = owned.check(batch.records, kafka_producer(batch.producer_id) if batch.producer_id >= 0 else None)
        if problem is None and batch.transactional:
            problem = "transactional batches are not supported"
        if problem is not None:
            refusals.warning("record", "produce to %s-%d refused: %s", topic, part.index, problem)
            return ErrorCode.INVALID_RECORD, -1
        if batch.producer_id >= 0:
            return await self._produce_idempotent(owned, batch.records, batch.producer_id, batch.producer_epoch,
                                                  batch.base_sequence, batch.last_sequence, buffered)
        try:
            written = owned.append(batch.records)
        except BacklogExceededError as exc:  # held: a subscription is over its backlog limit, until it drains
            refusals.warning("backlog", "produce to %s-%d refused: %s", topic, part.index, exc)
            return ErrorCode.POLICY_VIOLATION, -1
        except DlogError:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1  # the writer ended: the stream is no longer served here
        buffered()
        self.records_produced += len(batch.records)
        if acks == 0:
            written.add_done_callback(_ignore_outcome)
            return ErrorCode.NONE, -1
        try:
            return ErrorCode.NONE, await written
        except DlogError as exc:
            refusals.warning("write", "writing to stream %s failed: %s", owned.name, exc)
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1

    async def _produce_idempotent(self, owned: OwnedStream, records: Sequence[Record], producer_id: int, epoch: int,
                                  first_sequence: int, last_sequence: int,
                                  buffered: Callable[[], None]) -> tuple[ErrorCode, int]:
        """Through the stream's dedup table (OwnedStream.produce_idempotent)."""
        def appended() -> None:
            buffered()
            self.records_produced += len(records)

        return await owned.produce_idempotent(records, producer_id, epoch, first_sequence, last_sequence, appended,
                                              refusals)

    # ------------------------------------------------------------------ InitProducerId

    async def init_producer_id(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        if body.transactional_id is not None:
            return request.response(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                    producer_id=-1, producer_epoch=-1)
        if state.refused(authz.Action.ADD) is not None:  # Kafka: IdempotentWrite on the cluster
            return request.response(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                    producer_id=-1, producer_epoch=-1)
        producer_id = await self._next_producer_id()
        return request.response(throttle_time_ms=0, error_code=0, producer_id=producer_id, producer_epoch=0)

    async def _next_producer_id(self) -> int:
        async with self._producer_ids_claim:
            producer_id = self._producer_ids.next_id()
            while producer_id is None:
                self._producer_ids.on_block(await self._claim_block())
                producer_id = self._producer_ids.next_id()
            return producer_id

    async def _claim_block(self) -> ProducerIdBlock:
        """One compare-and-set on the namespace's last claimed block (dlog.serve.producer_ids)."""
        zk = self.ns.zk
        path = f"{self.ns.root}/serve/{PRODUCER_ID_BLOCK_NODE}"
        while True:
            found = await zk.get_or_none(path)
            block = block_after(None if found is None else ProducerIdBlock.from_bytes(found[0]))
            try:
                if found is None:
                    await zk.create(path, block.to_bytes(), makepath=True)
                else:
                    await zk.set(path, block.to_bytes(), found[1])
                return block
            except (MetadataExistsError, MetadataVersionError):
                continue  # another server claimed one meanwhile

    # ------------------------------------------------------------------ Fetch

    async def fetch(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        deadline = monotonic_s() + max(body.max_wait_ms, 0) / 1000
        budget = max(1, min(body.max_bytes, self.settings.fetch_bytes_max))
        wanted = [(topic.topic, part) for topic in body.topics for part in topic.partitions]
        state.refused(authz.Action.READ)  # each partition answers TOPIC_AUTHORIZATION_FAILED then
        while True:
            answers, total, waiting, failed = [], 0, [], False
            for topic, part in wanted:
                answer, size, owned = await self._fetch_partition(state, topic, part, max(budget - total, 0))
                answers.append((topic, answer))
                total += size
                failed = failed or answer["error_code"] != ErrorCode.NONE
                if owned is not None and size == 0:
                    waiting.append(owned)
            remaining = deadline - monotonic_s()
            if total >= body.min_bytes or failed or remaining <= 0 or not waiting:
                break
            await _any_growth(waiting, remaining)
        Topic = request.api.response.FetchableTopicResponse
        grouped: dict[str, list[Any]] = {}
        for topic, answer in answers:
            grouped.setdefault(topic, []).append(Topic.PartitionData(aborted_transactions=[], preferred_read_replica=-1,
                                                                     **answer))
        return request.response(throttle_time_ms=0, error_code=0, session_id=0,
                                responses=[Topic(topic=name, partitions=parts) for name, parts in grouped.items()])

    async def _fetch_partition(self, state: ConnectionState, topic: str, part: Any,
                               budget: int) -> tuple[dict[str, Any], int, OwnedStream | ReadOnlyStream | None]:
        answer: dict[str, Any] = {"partition_index": part.partition, "error_code": ErrorCode.NONE,
                                  "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                                  "records": b""}
        if not state.may(authz.Action.READ):
            answer["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            return answer, 0, None
        owned = await self._owned(topic, part.partition)
        if isinstance(owned, ErrorCode):
            answer["error_code"] = owned
            return answer, 0, None
        position, end = part.fetch_offset, owned.end_position
        answer.update(high_watermark=end, last_stable_offset=end, log_start_offset=owned.start_position)
        if not 0 <= position <= end:
            answer["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
            return answer, 0, None
        if position == end or budget <= 0:
            return answer, 0, owned
        bytes_max = min(part.partition_max_bytes, budget)
        runs = owned.read_tail(position, bytes_max)
        if runs is None:
            try:
                batches = await self._read_history(state, owned, position, bytes_max)
            except TruncatedError:
                start, _ = await self.ns.position_bounds(owned.name)
                owned.start_position = owned.start_position if start is None else start
                answer.update(error_code=ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=owned.start_position)
                return answer, 0, None
            except ConfigError as exc:  # a typed stream's records its reader's schema version cannot project
                refusals.warning("unreadable", "fetch of %s-%d at %d failed: %s", topic, part.partition, position, exc)
                answer["error_code"] = ErrorCode.UNKNOWN_SERVER_ERROR  # the next fetch opens a reader afresh
                return answer, 0, None
        else:
            batches = [(len(records), encode_record_batch(first, records)) for first, records in runs]
        records = b"".join(batch for _, batch in batches)
        self.records_fetched += sum(count for count, _ in batches)
        answer["records"] = records
        return answer, len(records), owned

    async def _read_history(self, state: ConnectionState, owned: OwnedStream | ReadOnlyStream, position: int,
                            bytes_max: int) -> list[tuple[int, bytes]]:
        """Records below the in-memory tail, through a reader this connection keeps for its next
        fetch: (record count, record batch) per entry, encoded straight from its Arrow columns."""
        reader = state.take_reader(owned.name, position)
        if reader is None:
            try:
                reader = await self.ns.open_reader(owned.name, start=position, headers=not owned.typed,
                                                   read_ahead_entries=READ_AHEAD_ENTRIES,
                                                   read_ahead_bytes=READ_AHEAD_BYTES)
            except (OffsetOutOfRangeError, PositionsUnknownError):
                return []  # not readable yet (the bookies' last-add-confirmed lags an acknowledgement)
        runs: list[tuple[int, bytes]] = []
        taken, next_position = 0, position
        try:
            while taken < bytes_max and next_position < owned.end_position:
                entry = await reader.next_entry(timeout_s=0.0 if runs else HISTORY_FIRST_ENTRY_WAIT_S)
                if entry is None:
                    break
                if entry.slots is not None and not entry.batch.num_rows:
                    continue  # an entry compaction emptied: nothing of it to hand out
                if entry.first_position is None:
                    break
                if entry.positions is not None:  # a compacted segment's kept records: gaps between their offsets
                    runs.append((len(entry.positions), encode_entry(entry, owned.typed)))
                    next_position = entry.positions[-1] + 1
                    taken += len(runs[-1][1])  # what the answer carries (a typed record's JSON may outgrow Arrow)
                    continue
                count = entry.batch.num_rows
                if count:
                    runs.append((count, encode_entry(entry, owned.typed)))
                    next_position = entry.first_position + count
                    taken += len(runs[-1][1])
        except BaseException:
            await reader.close()
            raise
        state.keep_reader(owned.name, next_position, reader)
        return runs

    # ------------------------------------------------------------------ ListOffsets

    async def list_offsets(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        version = request.header.api_version
        Topic = request.api.response.ListOffsetsTopicResponse
        denied = state.refused(authz.Action.READ) is not None
        topics = []
        for topic in body.topics:
            partitions = []
            for part in topic.partitions:
                if denied:
                    error, offset, timestamp = ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1
                else:
                    error, offset, timestamp = await self._list_offset(topic.name, part.partition_index,
                                                                       part.timestamp)
                partitions.append(Topic.ListOffsetsPartitionResponse(
                    partition_index=part.partition_index, error_code=error,
                    old_style_offsets=[offset] if version == 0 and offset >= 0 else [], timestamp=timestamp,
                    offset=offset, leader_epoch=-1))
            topics.append(Topic(name=topic.name, partitions=partitions))
        return request.response(throttle_time_ms=0, topics=topics)

    async def _list_offset(self, topic: str, partition: int, timestamp: int) -> tuple[ErrorCode, int, int]:
        owned = await self._owned(topic, partition)
        if isinstance(owned, ErrorCode):
            return owned, -1, -1
        if timestamp == LATEST:
            return ErrorCode.NONE, owned.end_position, -1
        start, _ = await self.ns.position_bounds(owned.name)
        if start is not None:
            owned.start_position = start
        if timestamp == EARLIEST:
            return ErrorCode.NONE, owned.start_position, -1
        if timestamp < 0:
            return ErrorCode.INVALID_REQUEST, -1, -1
        moment = datetime.datetime.fromtimestamp(timestamp / 1000, tz=datetime.UTC)
        reader = await self.ns.open_reader(owned.name, start=moment, follow=False, skip_truncated=True,
                                           read_ahead_entries=READ_AHEAD_ENTRIES, read_ahead_bytes=READ_AHEAD_BYTES)
        try:
            deadline = monotonic_s() + TIME_LOOKUP_WAIT_S
            while (remaining := deadline - monotonic_s()) > 0:
                entry = await reader.next_entry(timeout_s=remaining)
                if entry is None or entry.first_position is None:
                    break
                if entry.batch.num_rows:
                    return ErrorCode.NONE, entry.first_position, record_times_ms(entry.batch.slice(0, 1))[0]
        finally:
            await reader.close()
        return ErrorCode.NONE, owned.end_position, -1  # no record at or after it: the end, as Kafka


def encode_entry(entry: EntryBatch, typed: bool = False) -> bytes:
    """An entry's records (a reader opened with headers=True gives every batch the headers column)
    as one Kafka record batch at their stream positions, from the columns: no Record per record. A
    compacted segment's entry (`positions`) keeps each record's own offset, gaps between them. A
    `typed` stream's record (the reader's schema: the latest) has a null key, its columns as one
    JSON object for value (`dlog.segments.typed_json`) and its `timestamp` column, if any, for time."""
    batch = entry.batch
    assert entry.first_position is not None
    deltas = None if entry.positions is None else [position - entry.positions[0] for position in entry.positions]
    first = entry.first_position if entry.positions is None else entry.positions[0]
    if typed:
        return encode_record_columns(first, record_times_ms(batch), [None] * batch.num_rows, json_records(batch),
                                     None, deltas)
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()
    column = batch.column("headers") if "headers" in batch.schema.names else None
    headers = None
    if column is not None and column.null_count < batch.num_rows:
        headers = [[(pair["key"], pair["value"]) for pair in pairs] if pairs else None for pairs in column.to_pylist()]
    return encode_record_columns(first, stamps, batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                                 headers, deltas)


async def _done(value: tuple[ErrorCode, int]) -> tuple[ErrorCode, int]:
    return value


def _ignore_outcome(done: asyncio.Future[int]) -> None:
    """acks=0: nobody waits; the outcome is retrieved so that a failure is not reported as unhandled."""
    if not done.cancelled():
        done.exception()


async def _any_growth(streams: list[OwnedStream | ReadOnlyStream], timeout_s: float) -> None:
    """Return when any of `streams` gets a durable record, or after `timeout_s`."""
    waits = [asyncio.ensure_future(owned.grown_event().wait()) for owned in streams]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
