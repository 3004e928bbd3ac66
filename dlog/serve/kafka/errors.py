"""The Kafka error codes dlog answers with, by name, each with what it tells the client.

These are wire values, not Python exceptions: a response carries them in its `error_code` fields,
and the codec's refusals (`frames.RequestRefused`, `records.BatchRefused`) name one of them. The
numbers are Kafka's own (clients map them to their exception classes); `RETRIABLE` is the set the
Java client treats as retriable, so a server can say which failures a client will retry by itself.
`MEANING` is the one-line text docs/serving.md shows for each.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    UNSUPPORTED_COMPRESSION_TYPE = 76
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    INVALID_RECORD = 87
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90


RETRIABLE = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR, ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.NOT_CONTROLLER,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
    ErrorCode.INVALID_FETCH_SESSION_EPOCH, ErrorCode.THROTTLING_QUOTA_EXCEEDED,
})

MEANING: dict[ErrorCode, str] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: "the server failed in a way it has no better code for",
    ErrorCode.NONE: "success",
    ErrorCode.OFFSET_OUT_OF_RANGE: "the fetch offset is before the stream's start or after its end",
    ErrorCode.CORRUPT_MESSAGE: "a record batch's bytes do not parse: wrong CRC-32C, wrong length, "
                               "a record that runs past its batch, or data that does not decompress",
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "no such topic (stream) or partition",
    ErrorCode.INVALID_FETCH_SIZE: "the fetch asked for a negative or zero byte maximum",
    ErrorCode.LEADER_NOT_AVAILABLE: "the stream has no owner right now; retry after a metadata refresh",
    ErrorCode.NOT_LEADER_OR_FOLLOWER: "this server does not own the stream; refresh metadata",
    ErrorCode.REQUEST_TIMED_OUT: "the request did not complete within its timeout",
    ErrorCode.MESSAGE_TOO_LARGE: "the record batch (or its decompressed records), or a group "
                                 "member's metadata or assignment, is over the server's limit",
    ErrorCode.OFFSET_METADATA_TOO_LARGE: "a committed offset's metadata string is too long",
    ErrorCode.NETWORK_EXCEPTION: "the server lost a connection it needed while answering",
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: "the group coordinator is still loading; retry",
    ErrorCode.COORDINATOR_NOT_AVAILABLE: "no group coordinator is available; retry",
    ErrorCode.NOT_COORDINATOR: "this server is not the group's coordinator; find it again",
    ErrorCode.INVALID_TOPIC_EXCEPTION: "the topic name is not a valid stream name",
    ErrorCode.RECORD_LIST_TOO_LARGE: "the produce request is larger than the server accepts",
    ErrorCode.NOT_ENOUGH_REPLICAS: "too few bookies are writable to meet the ack quorum",
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: "the write reached too few bookies",
    ErrorCode.INVALID_REQUIRED_ACKS: "acks must be -1 (all), 0 or 1",
    ErrorCode.ILLEGAL_GENERATION: "the member's group generation is stale; rejoin",
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: "the member's protocols do not match the group's",
    ErrorCode.INVALID_GROUP_ID: "the group id is empty or invalid",
    ErrorCode.UNKNOWN_MEMBER_ID: "the coordinator does not know this member; rejoin",
    ErrorCode.INVALID_SESSION_TIMEOUT: "the session timeout is outside the server's range",
    ErrorCode.REBALANCE_IN_PROGRESS: "the group is rebalancing; rejoin",
    ErrorCode.INVALID_COMMIT_OFFSET_SIZE: "the offset commit is too large",
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: "the principal may not use this topic",
    ErrorCode.GROUP_AUTHORIZATION_FAILED: "the principal may not use this group",
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: "the principal may not do this on the cluster",
    ErrorCode.INVALID_TIMESTAMP: "a record's timestamp is outside the accepted range",
    ErrorCode.UNSUPPORTED_SASL_MECHANISM: "the SASL mechanism is not enabled (the answer lists "
                                          "the enabled ones)",
    ErrorCode.ILLEGAL_SASL_STATE: "a SASL request came in the wrong order",
    ErrorCode.UNSUPPORTED_VERSION: "the API version is not supported; ApiVersions lists the "
                                   "supported ones",
    ErrorCode.TOPIC_ALREADY_EXISTS: "a topic (stream) of that name exists",
    ErrorCode.INVALID_PARTITIONS: "the partition count is not one dlog supports",
    ErrorCode.INVALID_REPLICATION_FACTOR: "the replication factor is not one dlog supports",
    ErrorCode.INVALID_CONFIG: "a topic config name or value is invalid",
    ErrorCode.NOT_CONTROLLER: "this server is not the controller; refresh metadata",
    ErrorCode.INVALID_REQUEST: "the request does not parse at its API version: a malformed "
                               "frame (the connection is closed)",
    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT: "the request needs a message format the stream "
                                              "does not have",
    ErrorCode.POLICY_VIOLATION: "the request breaks a server policy",
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: "an idempotent producer's sequence skipped ahead",
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER: "an idempotent producer's batch was already written",
    ErrorCode.INVALID_PRODUCER_EPOCH: "the producer's epoch is older than the current one",
    ErrorCode.INVALID_TXN_STATE: "transactions are not supported on this stream",
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "the principal may not use this "
                                                     "transactional id",
    ErrorCode.KAFKA_STORAGE_ERROR: "the storage below (bookies) failed this write or read",
    ErrorCode.SASL_AUTHENTICATION_FAILED: "the SASL credentials were refused",
    ErrorCode.UNKNOWN_PRODUCER_ID: "the server has no state for this producer id",
    ErrorCode.GROUP_ID_NOT_FOUND: "no such consumer group",
    ErrorCode.FETCH_SESSION_ID_NOT_FOUND: "the incremental fetch session is unknown",
    ErrorCode.INVALID_FETCH_SESSION_EPOCH: "the incremental fetch session epoch is wrong",
    ErrorCode.UNSUPPORTED_COMPRESSION_TYPE: "zstd needs Produce v7 or later; or an unknown codec",
    ErrorCode.MEMBER_ID_REQUIRED: "join again with the member id this answer gives",
    ErrorCode.GROUP_MAX_SIZE_REACHED: "the group has as many members as it may",
    ErrorCode.INVALID_RECORD: "a record batch parses but breaks a produce rule: not magic 2, "
                              "not exactly one batch, a control batch, offset deltas not 0..n-1",
    ErrorCode.THROTTLING_QUOTA_EXCEEDED: "a quota was exceeded; retry later",
    ErrorCode.PRODUCER_FENCED: "a newer producer with the same transactional id took over",
}
