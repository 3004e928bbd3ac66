"""The values the consumer-group coordinator (`dlog.serve.groups`) takes and gives: its limits,
the group states, the requests (plain values a server decodes from JoinGroup, SyncGroup,
Heartbeat, LeaveGroup and OffsetCommit) and their results, each with a Kafka error code."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

from bookkeeper.errors import ConfigError
from dlog.serve.kafka.errors import ErrorCode

NO_GENERATION = -1  # a commit from a consumer that is no group member (assign(), tools)
NO_MEMBER = ""


class GroupState(enum.Enum):
    EMPTY = "Empty"  # no members (kept only while a new member id is waiting for its join)
    PREPARING_REBALANCE = "PreparingRebalance"  # collecting the members' joins
    COMPLETING_REBALANCE = "CompletingRebalance"  # joins answered; waiting for the leader's assignment
    STABLE = "Stable"  # every member has (or can fetch) its assignment of the generation
    DEAD = "Dead"  # removed from the coordinator


@dataclass(frozen=True, slots=True)
class GroupLimits:
    groups_max: int = 10_000  # groups one coordinator holds
    members_per_group_max: int = 1_000  # members plus member ids handed out awaiting their join
    session_timeout_ms_min: int = 6_000  # Kafka's group.min.session.timeout.ms
    session_timeout_ms_max: int = 1_800_000  # Kafka's group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # Kafka's group.initial.rebalance.delay.ms
    new_member_join_timeout_ms: int = 300_000  # a new member's parked join gives up (Kafka's 5 min)
    member_bytes_max: int = 1 << 20  # one member's protocol metadata; one member's assignment
    state_bytes_max: int = 256 << 20  # all metadata and assignments the coordinator holds
    offset_metadata_bytes_max: int = 4_096  # Kafka's offset.metadata.max.bytes
    group_id_chars_max: int = 255

    def __post_init__(self) -> None:
        for name in ("groups_max", "members_per_group_max", "session_timeout_ms_min", "member_bytes_max",
                     "state_bytes_max", "group_id_chars_max", "new_member_join_timeout_ms"):
            if getattr(self, name) < 1:
                raise ConfigError(f"bad {name} {getattr(self, name)}: it must be at least 1")
        if self.session_timeout_ms_max < self.session_timeout_ms_min:
            raise ConfigError(f"bad session_timeout_ms_max {self.session_timeout_ms_max}: it is below "
                              f"session_timeout_ms_min {self.session_timeout_ms_min}")
        if self.initial_rebalance_delay_ms < 0 or self.offset_metadata_bytes_max < 0:
            raise ConfigError("bad initial_rebalance_delay_ms or offset_metadata_bytes_max: they must be 0 or more")


# ------------------------------------------------------------------------------ requests


@dataclass(frozen=True, slots=True)
class Protocol:
    name: str  # an assignor ("range", "roundrobin", ...)
    metadata: bytes  # opaque to the coordinator: the member's subscription


@dataclass(frozen=True, slots=True)
class JoinGroup:
    group_id: str
    member_id: str  # NO_MEMBER for a new member
    client_id: str
    protocol_type: str  # "consumer", "connect", ...: the same for all members
    protocols: tuple[Protocol, ...]  # in the member's order of preference
    session_timeout_ms: int
    rebalance_timeout_ms: int  # JoinGroup v0 has none: pass the session timeout
    require_known_member_id: bool  # JoinGroup v4 and later: a new member first gets MEMBER_ID_REQUIRED

    @property
    def metadata_bytes(self) -> int:
        return sum(len(protocol.name) + len(protocol.metadata) for protocol in self.protocols)


@dataclass(frozen=True, slots=True)
class SyncGroup:
    group_id: str
    generation_id: int
    member_id: str
    assignments: tuple[tuple[str, bytes], ...]  # (member id, assignment): only the leader's are used


@dataclass(frozen=True, slots=True)
class Heartbeat:
    group_id: str
    generation_id: int
    member_id: str


@dataclass(frozen=True, slots=True)
class LeaveGroup:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class CommitOffset:
    topic: str
    partition: int
    offset: int
    metadata: str | None


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    group_id: str
    generation_id: int  # NO_GENERATION with NO_MEMBER: a commit from outside group management
    member_id: str
    offsets: tuple[CommitOffset, ...]


# ------------------------------------------------------------------------------ results


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = NO_MEMBER
    generation_id: int = NO_GENERATION
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[tuple[str, bytes], ...] = ()  # the leader's answer only: each member's metadata


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveResult:
    error: ErrorCode


Result = JoinResult | SyncResult | HeartbeatResult | LeaveResult


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the request the driver handed in as `request` with `result`."""

    request: Hashable
    result: Result


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one event decided: requests to answer now (the event's own, when it is not parked,
    and parked ones it completed), and when the driver must call `on_time` next (None: never)."""

    replies: tuple[Reply, ...]
    wake_at_ms: int | None


@dataclass(frozen=True, slots=True)
class CommitResult:
    """One error per committed partition; `to_store` are the offsets the caller stores (those
    answered NONE). A commit is never parked."""

    errors: tuple[tuple[str, int, ErrorCode], ...]
    to_store: tuple[CommitOffset, ...]


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    client_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupView:
    """A group as DescribeGroups would show it."""

    group_id: str
    state: GroupState
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader_id: str | None
    members: tuple[MemberView, ...]
