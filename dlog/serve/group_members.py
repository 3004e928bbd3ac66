"""A consumer group's state as the coordinator (`dlog.serve.groups`) keeps it: its members, their
parked requests and deadlines, and the rules that read them (protocol support and selection,
who has joined, the group's next deadline). Mutable, owned by the coordinator alone."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from bookkeeper.errors import invariant
from dlog.serve.group_messages import GroupState, GroupView, MemberView, Protocol


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

    def next_deadline_ms(self) -> int | None:
        deadlines = [*self.pending.values()]
        if self.state is GroupState.PREPARING_REBALANCE and self.join_deadline_ms is not None:
            deadlines.append(self.join_deadline_ms)
        if self.state is GroupState.COMPLETING_REBALANCE and self.sync_deadline_ms is not None:
            deadlines.append(self.sync_deadline_ms)
        deadlines += [member.deadline_ms for member in self.members.values() if not member.kept_alive]
        return min(deadlines, default=None)

    def view(self) -> GroupView:
        members = tuple(MemberView(m.member_id, m.client_id, m.assignment) for m in self.members.values())
        return GroupView(self.group_id, self.state, self.generation_id, self.protocol_type, self.protocol_name,
                         self.leader_id, members)
