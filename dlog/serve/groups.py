"""Kafka consumer groups, the classic protocol as Kafka's brokers keep it: who is in a group, which
generation it is at, who leads it, what each member was assigned. Sans-IO: requests in (plain
values, `group_messages`), replies out, time passed in as `now_ms`; no sockets, no clock.

Theory of operation.

A group moves Empty -> PreparingRebalance -> CompletingRebalance -> Stable and back to
PreparingRebalance whenever its membership changes; it is Dead once removed.

Joining. A JoinGroup without a member id gets a fresh one (client id, this coordinator's
incarnation, a counter). From JoinGroup v4 on the fresh id comes back at once with
MEMBER_ID_REQUIRED and is held as pending for a session timeout, and the member joins again
with it. A joining member must share the group's protocol type and support at least one
protocol every member supports. Joins are parked (not answered) while the group prepares a
rebalance; the rebalance completes when every member and no pending id has joined, or at the
rebalance timeout (the largest of the members'), when members that did not rejoin are dropped.
A group leaving Empty waits `initial_rebalance_delay_ms` first, stretched by the same delay
while new members keep coming, up to the rebalance timeout, so that a starting fleet of
consumers lands in one generation. Completing bumps the generation, picks the protocol with
the most first-choice votes among those all members support, keeps the leader if it rejoined
(else takes the first member), and answers every parked join: the leader's answer lists every
member's metadata for that protocol.

Syncing. In CompletingRebalance SyncGroups are parked until the leader's arrives with the
assignment; then every parked sync is answered with its member's part (members the leader left
out get an empty one) and the group is Stable. A member whose sync is missing when the rebalance
timeout passes again is dropped. A known member that rejoins a Stable group with the same
metadata (and is not the leader) is answered with the current generation, no rebalance.

Liveness. Every accepted heartbeat, sync and commit of a member moves its session deadline to
now + its session timeout; a member past it is dropped, which starts a rebalance. A member with a
parked request is kept alive by it (its deadline is the rebalance's), except a new member whose
join stays parked `new_member_join_timeout_ms`. A dropped or leaving member's parked requests
are answered UNKNOWN_MEMBER_ID; a rebalance starting in CompletingRebalance answers the parked
syncs REBALANCE_IN_PROGRESS; a request superseded by the same member's next one is answered
REBALANCE_IN_PROGRESS, so that the driver never holds a request nobody will answer.

Offsets. The coordinator only judges a commit (a member of the current generation, or a
commit with no generation to a group without members) and says which offsets to store; storing
and fetching them is the caller's (they become dlog subscriptions). Membership itself is not
durable: a new coordinator starts with no groups, and members rejoin when told UNKNOWN_MEMBER_ID.

Time. Each group keeps its deadlines (joins, syncs, sessions, pending ids); `on_time` handles the
due ones earliest first, so a wake that comes late acts as if it had come in time. A heartbeat
only moves a deadline later and leaves the wake as it was (an early wake finds nothing due).

Bounds: `groups_max` groups (a new one is refused COORDINATOR_NOT_AVAILABLE, retriable, as groups
empty out), `members_per_group_max` members and pending ids per group (GROUP_MAX_SIZE_REACHED),
`member_bytes_max` per member's metadata and assignment and `state_bytes_max` for all of them
(MESSAGE_TOO_LARGE, COORDINATOR_NOT_AVAILABLE). Empty groups are removed at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from bookkeeper.errors import InvariantError, invariant
from dlog.serve.group_members import Due, Group, Member
from dlog.serve.group_messages import (
    NO_MEMBER,
    CommitResult,
    GroupLimits,
    GroupState,
    GroupView,
    Heartbeat,
    HeartbeatResult,
    JoinGroup,
    JoinResult,
    LeaveGroup,
    LeaveResult,
    OffsetCommit,
    Outcome,
    Reply,
    Result,
    SyncGroup,
    SyncResult,
)
from dlog.serve.kafka.errors import ErrorCode

CLIENT_ID_CHARS_KEPT = 100  # of a client id, in the member ids made from it


class GroupCoordinator:
    """The consumer groups one server coordinates. Each event returns an `Outcome`; the driver
    sends its replies and calls `on_time` at `wake_at_ms`."""

    def __init__(self, limits: GroupLimits | None = None, incarnation: str = "0", generation_floor: int = 0) -> None:
        self.limits = limits or GroupLimits()
        self.incarnation = incarnation  # makes member ids unique across coordinator restarts
        # A group is removed when it empties; made again, it starts above every generation this
        # coordinator ever handed out, so that a group id never sees one generation twice.
        self._generation_floor = generation_floor
        self._groups: dict[str, Group] = {}
        self._wakes: dict[str, int] = {}  # group id -> when it next needs `on_time`
        self._timers: list[tuple[int, str]] = []  # a heap over `_wakes`, with stale entries
        self._replies: list[Reply] = []
        self._members_made = 0
        self.state_bytes = 0  # metadata and assignments held, for `state_bytes_max`
        # counters, exported as metrics
        self.rebalances = 0  # generations completed
        self.members_expired = 0
        self.members_left = 0
        self.joins_refused = 0  # refused for room: groups, members or bytes

    @property
    def group_count(self) -> int:
        return len(self._groups)

    def group(self, group_id: str) -> GroupView | None:
        group = self._groups.get(group_id)
        return None if group is None else group.view()

    # ---------------------------------------------------------------------------- join

    def on_join(self, request: Hashable, join: JoinGroup, now_ms: int) -> Outcome:
        error = self._check_join(join)
        group = self._groups.get(join.group_id)
        if error is None and group is None:
            error = self._room_for_group(join)
        if error is not None:
            return self._answer(request, JoinResult(error, join.member_id))
        if group is None:
            group = self._groups[join.group_id] = Group(join.group_id, generation_id=self._generation_floor)
        if join.member_id == NO_MEMBER:
            self._join_new(request, group, join, now_ms)
        else:
            self._join_known(request, group, join, now_ms)
        self._settle(group, now_ms)
        return self._outcome()

    def _room_for_group(self, join: JoinGroup) -> ErrorCode | None:
        if join.member_id != NO_MEMBER:
            return ErrorCode.UNKNOWN_MEMBER_ID  # a member of a group this coordinator does not hold
        if len(self._groups) >= self.limits.groups_max:
            self.joins_refused += 1
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return None

    def _check_join(self, join: JoinGroup) -> ErrorCode | None:
        if not self._valid_group_id(join.group_id):
            return ErrorCode.INVALID_GROUP_ID
        limits = self.limits
        if not limits.session_timeout_ms_min <= join.session_timeout_ms <= limits.session_timeout_ms_max:
            return ErrorCode.INVALID_SESSION_TIMEOUT
        if not join.protocol_type or not join.protocols:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if join.metadata_bytes > limits.member_bytes_max:
            return ErrorCode.MESSAGE_TOO_LARGE
        return None

    def _join_new(self, request: Hashable, group: Group, join: JoinGroup, now_ms: int) -> None:
        error = self._room_to_join(group, join, held_bytes=0)
        if error is None and len(group.members) + len(group.pending) >= self.limits.members_per_group_max:
            self.joins_refused += 1
            error = ErrorCode.GROUP_MAX_SIZE_REACHED
        if error is not None:
            self._reply(request, JoinResult(error))
            return
        self._members_made += 1
        member_id = f"{join.client_id[:CLIENT_ID_CHARS_KEPT]}-{self.incarnation}-{self._members_made}"
        if join.require_known_member_id:
            group.pending[member_id] = now_ms + join.session_timeout_ms
            self._reply(request, JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id))
        else:
            self._add_member(request, group, member_id, join, now_ms)

    def _join_known(self, request: Hashable, group: Group, join: JoinGroup, now_ms: int) -> None:
        member = group.members.get(join.member_id)
        error = self._room_to_join(group, join, held_bytes=0 if member is None else member.held_bytes)
        if error is None and member is None and join.member_id not in group.pending:
            error = ErrorCode.UNKNOWN_MEMBER_ID
        if error is not None:
            self._reply(request, JoinResult(error, join.member_id))
        elif member is None:
            del group.pending[join.member_id]
            self._add_member(request, group, join.member_id, join, now_ms)
        elif self._join_changes_group(group, member, join):
            self.state_bytes += join.metadata_bytes - (member.held_bytes - len(member.assignment))
            member.protocols = join.protocols
            member.session_timeout_ms, member.rebalance_timeout_ms = join.session_timeout_ms, join.rebalance_timeout_ms
            self._park_join(member, request)
            self._maybe_prepare_rebalance(group, now_ms)
        else:  # a follower joining again with nothing new: the current generation, no rebalance
            self._reply(request, self._join_result(group, member))

    def _room_to_join(self, group: Group, join: JoinGroup, held_bytes: int) -> ErrorCode | None:
        if not group.supports(join.protocol_type, join.protocols):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if self.state_bytes - held_bytes + join.metadata_bytes > self.limits.state_bytes_max:
            self.joins_refused += 1
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return None

    @staticmethod
    def _join_changes_group(group: Group, member: Member, join: JoinGroup) -> bool:
        """Kafka's rule: a join rebalances unless the group is past collecting joins and the
        member's metadata is unchanged (and, in Stable, it is not the leader: the leader's join
        is how a consumer asks for a new assignment)."""
        same = member.protocols == join.protocols
        if group.state is GroupState.STABLE:
            return member.member_id == group.leader_id or not same
        if group.state is GroupState.COMPLETING_REBALANCE:
            return not same
        return True

    def _add_member(self, request: Hashable, group: Group, member_id: str, join: JoinGroup, now_ms: int) -> None:
        member = Member(member_id, join.client_id, join.protocols, join.session_timeout_ms,
                        join.rebalance_timeout_ms, deadline_ms=now_ms + self.limits.new_member_join_timeout_ms,
                        join_request=request)
        if not group.members:
            group.protocol_type = join.protocol_type
        group.members[member_id] = member
        group.leader_id = group.leader_id or member_id
        self.state_bytes += member.held_bytes
        if group.delaying:
            group.member_added = True  # stretches the initial delay once more
        self._maybe_prepare_rebalance(group, now_ms)

    def _park_join(self, member: Member, request: Hashable) -> None:
        if member.join_request is not None and member.join_request != request:
            self._reply(member.join_request, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.join_request = request

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        """The answer for a member joined into the current generation."""
        members: tuple[tuple[str, bytes], ...] = ()
        if member.member_id == group.leader_id:
            members = tuple((m.member_id, m.metadata(group.protocol_name)) for m in group.members.values())
        return JoinResult(ErrorCode.NONE, member.member_id, group.generation_id, group.protocol_name,
                          group.leader_id or "", members)

    # ---------------------------------------------------------------------------- rebalance

    def _maybe_prepare_rebalance(self, group: Group, now_ms: int) -> None:
        if group.state in (GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms)

    def _prepare_rebalance(self, group: Group, now_ms: int) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._answer_syncs(group, ErrorCode.REBALANCE_IN_PROGRESS, now_ms)
        delay = self.limits.initial_rebalance_delay_ms
        group.delaying = group.state is GroupState.EMPTY and delay > 0
        group.member_added = False
        if group.delaying:
            group.delay_left_ms = max(group.rebalance_timeout_ms - delay, 0)
            group.join_deadline_ms = now_ms + delay
        else:
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms
        group.state = GroupState.PREPARING_REBALANCE
        group.sync_deadline_ms = None

    def _complete_join(self, group: Group, now_ms: int) -> None:
        """Members that did not rejoin are dropped; the rest make the next generation."""
        absent = [m for m in group.members.values() if m.join_request is None]
        for member in absent:
            self._drop_member(group, member)
        self.members_expired += len(absent)
        group.delaying, group.join_deadline_ms = False, None
        group.generation_id += 1
        self._generation_floor = max(self._generation_floor, group.generation_id)
        if not group.members:
            group.state, group.protocol_type, group.protocol_name, group.leader_id = GroupState.EMPTY, None, None, None
            return
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.protocol_name = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms
        self.rebalances += 1
        for member in group.members.values():
            invariant(member.join_request is not None, f"member {member.member_id} completes a join it never sent")
            self._reply(member.join_request, self._join_result(group, member))
            member.join_request, member.is_new = None, False
            member.deadline_ms = now_ms + member.session_timeout_ms

    def _drop_member(self, group: Group, member: Member) -> None:
        """Remove a member; its parked requests are answered UNKNOWN_MEMBER_ID. The caller
        decides what the group does next."""
        if member.join_request is not None:
            self._reply(member.join_request, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id))
        if member.sync_request is not None:
            self._reply(member.sync_request, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        del group.members[member.member_id]
        self.state_bytes -= member.held_bytes
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)

    def _member_gone(self, group: Group, now_ms: int) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms)

    def _settle(self, group: Group, now_ms: int) -> None:
        """Complete what can complete, remove an empty group, schedule the next wake."""
        if group.state is GroupState.PREPARING_REBALANCE and not group.delaying and group.all_joined():
            self._complete_join(group, now_ms)
        if group.state is GroupState.EMPTY and not group.members and not group.pending:
            group.state = GroupState.DEAD
            del self._groups[group.group_id]
            self._wakes.pop(group.group_id, None)
            return
        invariant(group.state is not GroupState.EMPTY or not group.members,
                  f"group {group.group_id} is Empty with members")
        invariant(group.state in (GroupState.EMPTY, GroupState.PREPARING_REBALANCE) or group.leader_id in group.members,
                  f"group {group.group_id} is {group.state.value} without a leader among its members")
        self._schedule(group)

    # ---------------------------------------------------------------------------- sync

    def on_sync(self, request: Hashable, sync: SyncGroup, now_ms: int) -> Outcome:
        group = self._groups.get(sync.group_id)
        member = None if group is None else group.members.get(sync.member_id)
        if not self._valid_group_id(sync.group_id):
            return self._answer(request, SyncResult(ErrorCode.INVALID_GROUP_ID))
        if group is None or member is None:
            return self._answer(request, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if sync.generation_id != group.generation_id:
            return self._answer(request, SyncResult(ErrorCode.ILLEGAL_GENERATION))
        if group.state is GroupState.PREPARING_REBALANCE:
            return self._answer(request, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        if group.state is GroupState.STABLE:
            member.deadline_ms = now_ms + member.session_timeout_ms
            return self._answer(request, SyncResult(ErrorCode.NONE, member.assignment))
        if member.sync_request is not None and member.sync_request != request:
            self._reply(member.sync_request, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_request = request
        if member.member_id == group.leader_id:
            self._assign(group, sync.assignments, now_ms)
        self._settle(group, now_ms)
        return self._outcome()

    def _assign(self, group: Group, assignments: tuple[tuple[str, bytes], ...], now_ms: int) -> None:
        given = {member_id: data for member_id, data in assignments if member_id in group.members}
        held = sum(len(member.assignment) for member in group.members.values())
        if any(len(data) > self.limits.member_bytes_max for data in given.values()):
            error = ErrorCode.MESSAGE_TOO_LARGE
        elif self.state_bytes - held + sum(map(len, given.values())) > self.limits.state_bytes_max:
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            for member in group.members.values():
                member.assignment = given.get(member.member_id, b"")
            self.state_bytes += sum(map(len, given.values())) - held
            group.state, group.sync_deadline_ms = GroupState.STABLE, None
            self._answer_syncs(group, ErrorCode.NONE, now_ms)
            return
        self._answer_syncs(group, error, now_ms)  # as Kafka when it cannot store an assignment: rebalance
        self._prepare_rebalance(group, now_ms)

    def _answer_syncs(self, group: Group, error: ErrorCode, now_ms: int) -> None:
        """Answer every parked sync: with its assignment (NONE) or with `error`, which also
        clears the assignments. As Kafka, an answered member's session starts again: while
        parked it could not heartbeat."""
        for member in group.members.values():
            if error is not ErrorCode.NONE:
                self.state_bytes -= len(member.assignment)
                member.assignment = b""
            if member.sync_request is None:
                continue
            self._reply(member.sync_request, SyncResult(error, member.assignment))
            member.sync_request = None
            member.deadline_ms = now_ms + member.session_timeout_ms

    # ---------------------------------------------------------------------------- heartbeat, leave

    def on_heartbeat(self, request: Hashable, heartbeat: Heartbeat, now_ms: int) -> Outcome:
        """Never parked; a heartbeat only moves a deadline later, so the wake stays as it was
        (an early wake finds nothing due)."""
        error = self._check_member(heartbeat.group_id, heartbeat.member_id, heartbeat.generation_id)
        if error is None:
            group = self._groups[heartbeat.group_id]
            member = group.members[heartbeat.member_id]
            member.deadline_ms = now_ms + member.session_timeout_ms
            rebalancing = group.state is GroupState.PREPARING_REBALANCE
            error = ErrorCode.REBALANCE_IN_PROGRESS if rebalancing else ErrorCode.NONE
        return self._answer(request, HeartbeatResult(error))

    def _check_member(self, group_id: str, member_id: str, generation_id: int) -> ErrorCode | None:
        if not self._valid_group_id(group_id):
            return ErrorCode.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    def on_leave(self, request: Hashable, leave: LeaveGroup, now_ms: int) -> Outcome:
        if not self._valid_group_id(leave.group_id):
            return self._answer(request, LeaveResult(ErrorCode.INVALID_GROUP_ID))
        group = self._groups.get(leave.group_id)
        if group is None or (leave.member_id not in group.members and leave.member_id not in group.pending):
            return self._answer(request, LeaveResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if leave.member_id in group.pending:
            del group.pending[leave.member_id]
        else:
            self._drop_member(group, group.members[leave.member_id])
            self.members_left += 1
            self._member_gone(group, now_ms)
        self._reply(request, LeaveResult(ErrorCode.NONE))
        self._settle(group, now_ms)
        return self._outcome()

    # ---------------------------------------------------------------------------- offsets

    def on_commit(self, commit: OffsetCommit, now_ms: int) -> CommitResult:
        """Judge an OffsetCommit (never parked): which offsets the caller stores."""
        group = self._groups.get(commit.group_id)
        if not self._valid_group_id(commit.group_id):
            error: ErrorCode | None = ErrorCode.INVALID_GROUP_ID
        elif commit.generation_id < 0 and (group is None or group.state is GroupState.EMPTY):
            error = None  # offsets only: the group does not use the coordinator for membership
        elif group is None:
            error = ErrorCode.ILLEGAL_GENERATION  # as Kafka: a generation of a group it does not know
        else:
            error = self._check_member(commit.group_id, commit.member_id, commit.generation_id)
            if error is None and group.state is GroupState.COMPLETING_REBALANCE:
                error = ErrorCode.REBALANCE_IN_PROGRESS
            elif error is None:
                member = group.members[commit.member_id]
                member.deadline_ms = now_ms + member.session_timeout_ms
        if error is not None:
            return CommitResult(tuple((o.topic, o.partition, error) for o in commit.offsets), ())
        errors, to_store = [], []
        for offset in commit.offsets:
            too_large = len((offset.metadata or "").encode()) > self.limits.offset_metadata_bytes_max
            errors.append((offset.topic, offset.partition,
                           ErrorCode.OFFSET_METADATA_TOO_LARGE if too_large else ErrorCode.NONE))
            if not too_large:
                to_store.append(offset)
        return CommitResult(tuple(errors), tuple(to_store))

    def check_fetch(self, group_id: str) -> ErrorCode:
        """OffsetFetch is answered from what the caller stored, whatever the group's state."""
        return ErrorCode.NONE if self._valid_group_id(group_id) else ErrorCode.INVALID_GROUP_ID

    # ---------------------------------------------------------------------------- time

    def on_time(self, now_ms: int) -> Outcome:
        """Expire what is due: pending member ids, sessions, joins and syncs past their deadline."""
        while self._timers and self._timers[0][0] <= now_ms:
            at_ms, group_id = heapq.heappop(self._timers)
            if self._wakes.get(group_id) != at_ms:
                continue  # stale: the group was rescheduled or removed
            del self._wakes[group_id]
            group = self._groups[group_id]
            self._expire(group, now_ms)
            self._settle(group, now_ms)
        return self._outcome()

    def _expire(self, group: Group, now_ms: int) -> None:
        """Handle what is due, earliest first; each step ends something or moves a deadline on."""
        for _ in range(2 * (len(group.members) + len(group.pending)) + 64):
            due = group.next_due(now_ms)
            if due is None:
                return
            at_ms, what, member_id = due
            if what is Due.JOINS:
                self._joins_due(group, at_ms, now_ms)
            elif what is Due.SYNCS:
                unsynced = [m for m in group.members.values() if m.sync_request is None]
                for member in unsynced:  # the leader among them, or it would have assigned
                    self._drop_member(group, member)
                self.members_expired += len(unsynced)
                self._prepare_rebalance(group, now_ms)
            elif what is Due.PENDING_ID:
                del group.pending[member_id]
            else:
                self._drop_member(group, group.members[member_id])
                self.members_expired += 1
                self._member_gone(group, now_ms)
        raise InvariantError(f"group {group.group_id}: deadlines at {now_ms} kept coming")

    def _joins_due(self, group: Group, at_ms: int, now_ms: int) -> None:
        if group.delaying and group.member_added and group.delay_left_ms > 0:
            step = min(self.limits.initial_rebalance_delay_ms, group.delay_left_ms)
            group.delay_left_ms -= step
            group.member_added = False
            group.join_deadline_ms = at_ms + step  # from when it was due, as if woken in time
        else:
            self._complete_join(group, now_ms)

    def unload(self) -> Outcome:
        """This server stops coordinating: every parked request is answered NOT_COORDINATOR
        (the client finds the new coordinator) and every group is dropped."""
        for group in self._groups.values():
            for member in group.members.values():
                if member.join_request is not None:
                    self._reply(member.join_request, JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
                if member.sync_request is not None:
                    self._reply(member.sync_request, SyncResult(ErrorCode.NOT_COORDINATOR))
            group.state = GroupState.DEAD
        self._groups.clear()
        self._wakes.clear()
        self._timers.clear()
        self.state_bytes = 0
        return self._outcome()

    # ---------------------------------------------------------------------------- plumbing

    def _valid_group_id(self, group_id: str) -> bool:
        return 0 < len(group_id) <= self.limits.group_id_chars_max

    def _schedule(self, group: Group) -> None:
        at_ms = group.next_deadline_ms()
        if at_ms is None:
            self._wakes.pop(group.group_id, None)
        elif self._wakes.get(group.group_id) != at_ms:
            self._wakes[group.group_id] = at_ms
            heapq.heappush(self._timers, (at_ms, group.group_id))
            if len(self._timers) > 2 * len(self._wakes) + 64:  # stale entries: rebuild
                self._timers = [(at, group_id) for group_id, at in self._wakes.items()]
                heapq.heapify(self._timers)

    def _reply(self, request: Hashable, result: Result) -> None:
        self._replies.append(Reply(request, result))

    def _answer(self, request: Hashable, result: Result) -> Outcome:
        self._reply(request, result)
        return self._outcome()

    def _outcome(self) -> Outcome:
        while self._timers and self._wakes.get(self._timers[0][1]) != self._timers[0][0]:
            heapq.heappop(self._timers)
        replies, self._replies = tuple(self._replies), []
        return Outcome(replies, self._timers[0][0] if self._timers else None)
