"""The supported-API table: which Kafka APIs and versions dlog speaks, and the ApiVersions answer.

One table, `SUPPORTED_APIS`: api key -> (name, lowest and highest version decoded, the
kafka-python message classes). Only non-flexible versions are listed, the ones kafka-python,
aiokafka and librdkafka all negotiate down to, so every request header is version 1 and every
response header version 0 (a correlation id alone).

Produce is decoded from v3 (record batch v2, the only format dlog stores) but ADVERTISED from v0:
librdkafka releases before the fix of its issue 4956 ask whether the broker supports "Produce
0..0" before they compress with gzip, snappy or lz4, and send uncompressed batches otherwise
(Kafka 4.0 lists Produce from v0 for the same reason, KAFKA-18659; the librdkafka of
confluent-kafka 2.16 compresses either way). Clients pick the highest version both sides support,
so none of them sends v0-2; one that does is refused like any unsupported version.

The message classes are kafka-python's, generated from Kafka's own JSON schemas; the codec uses
them server-side: decode a request class, encode a response class, at the request's version.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from dlog.serve.kafka.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Api:
    """One supported API: versions `min_version`..`max_version` are decoded and answered."""

    key: int
    name: str
    min_version: int
    max_version: int
    request: type[ApiMessage]
    response: type[ApiMessage]
    advertised_min_version: int | None = None  # listed in ApiVersions instead of min_version

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    @property
    def listed_min_version(self) -> int:
        return self.min_version if self.advertised_min_version is None else self.advertised_min_version


PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP = 8, 9, 10, 11
HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, SASL_HANDSHAKE, API_VERSIONS = 12, 13, 14, 17, 18
CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID, DESCRIBE_CONFIGS, SASL_AUTHENTICATE = 19, 20, 22, 32, 36

SUPPORTED_APIS: dict[int, Api] = {api.key: api for api in (
    Api(PRODUCE, "Produce", 3, 7, ProduceRequest, ProduceResponse, advertised_min_version=0),
    Api(FETCH, "Fetch", 4, 11, FetchRequest, FetchResponse),
    Api(LIST_OFFSETS, "ListOffsets", 0, 3, ListOffsetsRequest, ListOffsetsResponse),
    Api(METADATA, "Metadata", 0, 5, MetadataRequest, MetadataResponse),
    Api(OFFSET_COMMIT, "OffsetCommit", 2, 3, OffsetCommitRequest, OffsetCommitResponse),
    Api(OFFSET_FETCH, "OffsetFetch", 1, 3, OffsetFetchRequest, OffsetFetchResponse),
    Api(FIND_COORDINATOR, "FindCoordinator", 0, 1, FindCoordinatorRequest, FindCoordinatorResponse),
    Api(JOIN_GROUP, "JoinGroup", 0, 5, JoinGroupRequest, JoinGroupResponse),
    Api(HEARTBEAT, "Heartbeat", 0, 1, HeartbeatRequest, HeartbeatResponse),
    Api(LEAVE_GROUP, "LeaveGroup", 0, 1, LeaveGroupRequest, LeaveGroupResponse),
    Api(SYNC_GROUP, "SyncGroup", 0, 3, SyncGroupRequest, SyncGroupResponse),
    Api(SASL_HANDSHAKE, "SaslHandshake", 0, 1, SaslHandshakeRequest, SaslHandshakeResponse),
    Api(API_VERSIONS, "ApiVersions", 0, 2, ApiVersionsRequest, ApiVersionsResponse),
    Api(CREATE_TOPICS, "CreateTopics", 0, 4, CreateTopicsRequest, CreateTopicsResponse),
    Api(DELETE_TOPICS, "DeleteTopics", 0, 3, DeleteTopicsRequest, DeleteTopicsResponse),
    Api(INIT_PRODUCER_ID, "InitProducerId", 0, 0, InitProducerIdRequest, InitProducerIdResponse),
    Api(DESCRIBE_CONFIGS, "DescribeConfigs", 0, 3, DescribeConfigsRequest, DescribeConfigsResponse),
    Api(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 1, SaslAuthenticateRequest,
        SaslAuthenticateResponse),
)}


def api_name(api_key: int) -> str:
    api = SUPPORTED_APIS.get(api_key)
    return api.name if api is not None else f"api key {api_key}"


def api_versions_response(version: int, error: ErrorCode = ErrorCode.NONE,
                          apis: dict[int, Api] = SUPPORTED_APIS) -> ApiMessage:
    """The ApiVersions answer listing `apis`, at `version` (v0 whenever `error` is set: a client
    that asked with a version it cannot know the server speaks reads the error as v0)."""
    if error != ErrorCode.NONE:
        version = 0
    listed = [ApiVersionsResponse.ApiVersion(api_key=api.key, min_version=api.listed_min_version,
                                             max_version=api.max_version, version=version)
              for api in sorted(apis.values(), key=lambda api: api.key)]
    return ApiVersionsResponse(version=version, error_code=int(error), api_keys=listed,
                               throttle_time_ms=0)
