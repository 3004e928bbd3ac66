"""A consumer group's state as the coordinator (`dlog.serve.groups`) keeps it: its members, their
parked requests and deadlines, and the rules that read them (protocol support and selection,
who has joined, the group's next deadline). Mutable, owned by the coordinator alone."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field

from bookkeeper.errors import invariant
from dlog.serve.group_messages import GroupState, GroupView, MemberView, Protocol


class Due(enum.Enum):
    """What a group's deadline is for; at one time, in this order."""

    JOINS = 0  # the rebalance timeout (or a step of the initial delay) while joins are collected
    SYNCS = 1  # the rebalance timeout while the leader's assignment is awaited
    PENDING_ID = 2  # a member id handed out with MEMBER_ID_REQUIRED was not used in time
    SESSION = 3  # a member's session (or a new member's parked join) ran out


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    client_id: str
    protocols: tuple[Protocol, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    deadline_ms: int
    is_new: bool = True
    join_request: Hashable | None = None
    sync_request: Hashable | None = None
    assignment: bytes = b""

    @property
    def held_bytes(self) -> int:
        return sum(len(p.name) + len(p.metadata) for p in self.protocols) + len(self.assignment)

    def metadata(self, protocol_name: str | None) -> bytes:
        return next((p.metadata for p in self.protocols if p.name == protocol_name), b"")

    @property
    def kept_alive(self) -> bool:
        """A parked request keeps a member: the rebalance has its own deadline. Only a new
        member's join expires, at `deadline_ms` (so that abandoned joins do not pile up)."""
        return self.sync_request is not None or (self.join_request is not None and not self.is_new)


@dataclass(slots=True, eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    pending: dict[str, int] = field(default_factory=dict)  # member id handed out -> its deadline
    join_deadline_ms: int | None = None
    delaying: bool = False  # the initial rebalance delay is running
    delay_left_ms: int = 0  # how much further new members may stretch it
    member_added: bool = False  # a member came during the current delay
    sync_deadline_ms: int | None = None

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((member.rebalance_timeout_ms for member in self.members.values()), default=0)

    def candidate_protocols(self) -> set[str]:
        names = [{p.name for p in member.protocols} for member in self.members.values()]
        return set.intersection(*names) if names else set()

    def supports(self, protocol_type: str, protocols: tuple[Protocol, ...]) -> bool:
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return True
        return protocol_type == self.protocol_type and bool({p.name for p in protocols} & self.candidate_protocols())

    def select_protocol(self) -> str:
        """The protocol most members name first among those all support; ties go to the one the
        leader prefers."""
        candidates = self.candidate_protocols()
        invariant(bool(candidates), f"group {self.group_id} completes a rebalance with no common protocol")
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(p.name for p in member.protocols if p.name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        leader = self.members[self.leader_id] if self.leader_id in self.members else next(iter(self.members.values()))
        order = [p.name for p in leader.protocols if p.name in candidates]
        return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))

    def all_joined(self) -> bool:
        return not self.pending and all(member.join_request is not None for member in self.members.values())

    def deadlines(self) -> list[tuple[int, Due, str]]:
        """Everything that happens to the group at a time: (when, what, member id or "")."""
        due = [(at_ms, Due.PENDING_ID, member_id) for member_id, at_ms in self.pending.items()]
        if self.state is GroupState.PREPARING_REBALANCE and self.join_deadline_ms is not None:
            due.append((self.join_deadline_ms, Due.JOINS, ""))
        if self.state is GroupState.COMPLETING_REBALANCE and self.sync_deadline_ms is not None:
            due.append((self.sync_deadline_ms, Due.SYNCS, ""))
        due += [(m.deadline_ms, Due.SESSION, m.member_id) for m in self.members.values() if not m.kept_alive]
        return due

    def next_deadline_ms(self) -> int | None:
        return min((at_ms for at_ms, _, _ in self.deadlines()), default=None)

    def next_due(self, now_ms: int) -> tuple[int, Due, str] | None:
        """The earliest thing due at `now_ms`, so that a late wake handles them in their order
        (a rebalance that completed in time keeps its new members from timing out)."""
        earliest = min(self.deadlines(), key=lambda due: (due[0], due[1].value, due[2]), default=None)
        return earliest if earliest is not None and earliest[0] <= now_ms else None

    def view(self) -> GroupView:
        members = tuple(MemberView(m.member_id, m.client_id, m.assignment) for m in self.members.values())
        return GroupView(self.group_id, self.state, self.generation_id, self.protocol_type, self.protocol_name,
                         self.leader_id, members)
