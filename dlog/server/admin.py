"""Topic administration over streams: CreateTopics, DeleteTopics and DescribeConfigs.

A topic of N partitions is created as its N streams (`ownership.partition_stream`). The
replication factor r becomes ensemble r, write quorum r and ack quorum r // 2 + 1 (-1: the
server's --ensemble/--write-quorum/--ack-quorum). The topic configs dlog keeps, both ways:

| Kafka config | stream setting |
|---|---|
| retention.ms | retention_age_ms (-1: keep forever, 0 in dlog) |
| retention.bytes | retention_bytes (-1: no limit, 0 in dlog) |
| segment.bytes | roll_bytes |
| segment.ms | roll_age_ms |
| min.compaction.lag.ms | min_compaction_lag_ms |
| delete.retention.ms | delete_retention_ms |
| cleanup.policy | compaction: `compact` (or `compact,delete`) turns key compaction on, `delete` off |

A topic with `cleanup.policy=compact` is compacted by the policy runner (`dlog serve` runs it);
its fetches read compacted segments' kept records at their original offsets (gaps between them,
as a Kafka compacted topic's). Any other config is INVALID_CONFIG at creation (DescribeConfigs
lists only these).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.api_message import ApiMessage

from bookkeeper.errors import ConfigError, DlogError
from bookkeeper.security.authz import Action
from dlog.names import check_stream_name
from dlog.namespace import Namespace
from dlog.segments.metadata import StreamConfig
from dlog.segments.port import StreamNotFoundError
from dlog.serve.kafka import ErrorCode, Request
from dlog.serve.kafka.apis import CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS
from dlog.serve.ownership import PARTITIONS_MAX, partition_stream
from dlog.server.api import ConnectionState, Handler
from dlog.server.settings import ServerSettings
from dlog.server.streams import Streams, Topics

log = logging.getLogger(__name__)
TOPIC_RESOURCE = 2
CONFIGS = {"retention.ms": "retention_age_ms", "retention.bytes": "retention_bytes", "segment.bytes": "roll_bytes",
           "segment.ms": "roll_age_ms", "min.compaction.lag.ms": "min_compaction_lag_ms",
           "delete.retention.ms": "delete_retention_ms"}
CLEANUP_POLICY = "cleanup.policy"  # a string config: compaction on (compact) or off (delete)
CLEANUP_POLICIES = {"delete": False, "compact": True, "compact,delete": True, "delete,compact": True}
NEVER = {"retention_age_ms", "retention_bytes"}  # 0 in dlog is -1 in Kafka
STRING_TYPE, LONG_TYPE = 2, 5  # DescribeConfigs config_type


class TopicAdmin:
    def __init__(self, ns: Namespace, settings: ServerSettings, streams: Streams, topics: Topics) -> None:
        self.ns = ns
        self.settings = settings
        self.streams = streams
        self.topics = topics

    def handlers(self) -> dict[int, Handler]:
        return {CREATE_TOPICS: self.create_topics, DELETE_TOPICS: self.delete_topics,
                DESCRIBE_CONFIGS: self.describe_configs}

    # ------------------------------------------------------------------ CreateTopics

    async def create_topics(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        Result = request.api.response.CreatableTopicResult
        refused = state.refused(Action.METADATA_ADMIN)
        results = []
        for topic in body.topics:
            if refused is not None:
                results.append(Result(name=topic.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                      error_message=refused))
                continue
            error, message = await self._create(topic, bool(body.validate_only))
            results.append(Result(name=topic.name, error_code=error, error_message=message))
        return request.response(throttle_time_ms=0, topics=results)

    async def _create(self, topic: Any, validate_only: bool) -> tuple[ErrorCode, str | None]:
        name = topic.name
        partitions = 1 if topic.num_partitions == -1 else topic.num_partitions
        try:
            check_stream_name(partition_stream(name, 0, max(partitions, 1)))
        except ConfigError as exc:
            return ErrorCode.INVALID_TOPIC_EXCEPTION, str(exc)
        if not 1 <= partitions <= PARTITIONS_MAX:
            return ErrorCode.INVALID_PARTITIONS, f"a topic has 1..{PARTITIONS_MAX} partitions (streams)"
        if topic.assignments:
            return ErrorCode.INVALID_REQUEST, "replica assignments are dlog's placement's, not the client's"
        replication = topic.replication_factor
        if replication == -1:
            options: dict[str, Any] = {"ensemble": self.settings.ensemble, "write_quorum": self.settings.write_quorum,
                                       "ack_quorum": self.settings.ack_quorum}
        elif 1 <= replication <= 64:
            options = {"ensemble": replication, "write_quorum": replication, "ack_quorum": replication // 2 + 1}
        else:
            return ErrorCode.INVALID_REPLICATION_FACTOR, "the replication factor is -1 or 1..64 (bookies)"
        for config in topic.configs or ():
            if config.name == CLEANUP_POLICY:
                compact = CLEANUP_POLICIES.get((config.value or "").replace(" ", ""))
                if compact is None:
                    return ErrorCode.INVALID_CONFIG, (f"config {CLEANUP_POLICY}={config.value} is not one dlog "
                                                      "keeps (delete, compact or compact,delete)")
                options["compaction"] = compact
                continue
            setting = CONFIGS.get(config.name)
            try:
                value = int(config.value)
            except (TypeError, ValueError):
                value = -2
            if setting is None or value < (-1 if setting in NEVER else 0):
                return ErrorCode.INVALID_CONFIG, (f"config {config.name}={config.value} is not one dlog keeps "
                                                  f"(it keeps {', '.join(sorted(CONFIGS))}, as whole numbers, "
                                                  f"and {CLEANUP_POLICY})")
            options[setting] = max(value, 0)
        if await self.topics.partitions(name) is not None:
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} exists"
        if validate_only:
            return ErrorCode.NONE, None
        try:
            if not await self.topics.create(name, partitions, **options):
                return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} exists"
        except DlogError as exc:
            return ErrorCode.POLICY_VIOLATION, str(exc)
        return ErrorCode.NONE, None

    # ------------------------------------------------------------------ DeleteTopics

    async def delete_topics(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        Result = request.api.response.DeletableTopicResult
        refused = state.refused(Action.METADATA_ADMIN) is not None
        results = []
        for name in body.topic_names:
            results.append(Result(name=name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED if refused
                                  else await self._delete(name)))
        return request.response(throttle_time_ms=0, responses=results)

    async def _delete(self, name: str) -> ErrorCode:
        count = await self.topics.partitions(name)
        if count is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for index in range(count):
            stream = partition_stream(name, index, count)
            await self.streams.release(stream)
            try:
                await self.ns.delete_stream(stream)
            except StreamNotFoundError:
                pass
            except DlogError as exc:
                log.warning("cannot delete stream %s of topic %s: %s", stream, name, exc)
                return ErrorCode.POLICY_VIOLATION
        self.topics.forget(name)
        return ErrorCode.NONE

    # ------------------------------------------------------------------ DescribeConfigs

    async def describe_configs(self, request: Request, body: Any, state: ConnectionState) -> ApiMessage:
        Result = request.api.response.DescribeConfigsResult
        Entry = Result.DescribeConfigsResourceResult
        refused = state.refused(Action.READ)
        results = []
        for resource in body.resources:
            if refused is not None:
                error = (ErrorCode.TOPIC_AUTHORIZATION_FAILED if resource.resource_type == TOPIC_RESOURCE
                         else ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
                results.append(Result(error_code=error, error_message=refused, resource_type=resource.resource_type,
                                      resource_name=resource.resource_name, configs=[]))
                continue
            if resource.resource_type != TOPIC_RESOURCE:
                results.append(Result(error_code=0, error_message=None, resource_type=resource.resource_type,
                                      resource_name=resource.resource_name, configs=[]))
                continue
            config = await self._config(resource.resource_name)
            if config is None:
                results.append(Result(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error_message="no such topic",
                                      resource_type=TOPIC_RESOURCE, resource_name=resource.resource_name, configs=[]))
                continue
            keys = resource.configuration_keys
            entries = []
            for kafka_name, setting in sorted(CONFIGS.items()):
                if keys is not None and kafka_name not in keys:
                    continue
                value = getattr(config, setting)
                shown = -1 if setting in NEVER and value == 0 else value
                entries.append(Entry(name=kafka_name, value=str(shown), read_only=False, config_source=1,
                                     is_default=False, is_sensitive=False, synonyms=[], config_type=LONG_TYPE,
                                     documentation=None))
            if keys is None or CLEANUP_POLICY in keys:
                entries.append(Entry(name=CLEANUP_POLICY, value="compact" if config.compaction else "delete",
                                     read_only=False, config_source=1, is_default=False, is_sensitive=False,
                                     synonyms=[], config_type=STRING_TYPE, documentation=None))
            results.append(Result(error_code=0, error_message=None, resource_type=TOPIC_RESOURCE,
                                  resource_name=resource.resource_name, configs=entries))
        return request.response(throttle_time_ms=0, results=results)

    async def _config(self, topic: str) -> StreamConfig | None:
        count = await self.topics.partitions(topic)
        if count is None:
            return None
        try:
            return await self.ns.config(partition_stream(topic, 0, count))
        except StreamNotFoundError:
            return None

