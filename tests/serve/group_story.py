"""A story-telling driver of the group coordinator for the tests: a clock, the replies by request
id (none answered twice), and one call per request kind."""

from __future__ import annotations

from collections.abc import Hashable

from dlog.serve.group_messages import (
    NO_MEMBER,
    CommitOffset,
    GroupLimits,
    GroupState,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    OffsetCommit,
    Protocol,
    Result,
    SyncGroup,
)
from dlog.serve.groups import GroupCoordinator
from dlog.serve.kafka.errors import ErrorCode

GROUP = "billing"
SESSION_MS = 10_000
REBALANCE_MS = 30_000
DELAY_MS = 3_000


class Story:
    """A coordinator, a clock, and every reply by request id; requests are numbered."""

    def __init__(self, **limits) -> None:
        self.coordinator = GroupCoordinator(GroupLimits(**limits), incarnation="t")
        self.now = 0
        self.replies: dict[Hashable, Result] = {}
        self.wake_at_ms: int | None = None
        self.sent = 0

    def take(self, outcome) -> None:
        for reply in outcome.replies:
            assert reply.request not in self.replies, f"{reply.request} answered twice"
            self.replies[reply.request] = reply.result
        self.wake_at_ms = outcome.wake_at_ms

    def request(self, name: str) -> str:
        self.sent += 1
        return f"{name}#{self.sent}"

    def join(self, client: str, member_id: str = NO_MEMBER, protocols=None, known: bool = True,
             protocol_type: str = "consumer", session_ms: int = SESSION_MS, rebalance_ms: int = REBALANCE_MS,
             group: str = GROUP) -> str:
        protocols = protocols or (Protocol("range", f"{client}-subscription".encode()),)
        request = self.request(f"join-{client}")
        join = JoinGroup(group, member_id, client, protocol_type, tuple(protocols), session_ms, rebalance_ms, known)
        self.take(self.coordinator.on_join(request, join, self.now))
        return request

    def join_new(self, client: str, **options) -> str:
        """JoinGroup v4: learn the member id, join with it; the id (the join is parked)."""
        first = self.answer(self.join(client, **options))
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED and first.member_id.startswith(f"{client}-")
        self.last_join = self.join(client, first.member_id, **options)
        return first.member_id

    def sync(self, member_id: str, generation: int, assignments=()) -> str:
        request = self.request("sync")
        sync = SyncGroup(GROUP, generation, member_id, tuple(assignments))
        self.take(self.coordinator.on_sync(request, sync, self.now))
        return request

    def heartbeat(self, member_id: str, generation: int) -> ErrorCode:
        request = self.request("heartbeat")
        self.take(self.coordinator.on_heartbeat(request, Heartbeat(GROUP, generation, member_id), self.now))
        return self.answer(request).error

    def leave(self, member_id: str) -> ErrorCode:
        request = self.request("leave")
        self.take(self.coordinator.on_leave(request, LeaveGroup(GROUP, member_id), self.now))
        return self.answer(request).error

    def commit(self, member_id: str, generation: int, group: str = GROUP, metadata: str | None = None):
        offsets = (CommitOffset("orders", 0, 42, metadata), CommitOffset("orders", 1, 7, None))
        return self.coordinator.on_commit(OffsetCommit(group, generation, member_id, offsets), self.now)

    def answer(self, request: str) -> Result | None:
        return self.replies.get(request)

    def advance(self, ms: int) -> None:
        """Let time pass, waking the coordinator whenever it asked to be woken."""
        end = self.now + ms
        while self.wake_at_ms is not None and self.wake_at_ms <= end:
            self.now = max(self.now, self.wake_at_ms)
            self.take(self.coordinator.on_time(self.now))
        self.now = end

    @property
    def state(self) -> GroupState:
        view = self.coordinator.group(GROUP)
        return GroupState.DEAD if view is None else view.state

    def stable_group(self, *clients: str) -> dict[str, str]:
        """Members that joined, were assigned and are Stable at generation 1: client -> member id."""
        members = {}
        joins = {}
        for client in clients:
            members[client] = self.join_new(client)
            joins[client] = self.last_join
        self.advance(2 * DELAY_MS)  # the initial delay, stretched once by the members after the first
        leader = self.answer(joins[clients[0]]).leader_id
        syncs = [self.sync(member, 1) for member in members.values() if member != leader]
        syncs.append(self.sync(leader, 1, [(m, f"part-{c}".encode()) for c, m in members.items()]))
        assert all(self.answer(sync).error is ErrorCode.NONE for sync in syncs)
        assert self.state is GroupState.STABLE
        return members
