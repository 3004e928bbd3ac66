"""Seeded random members (joining, syncing, heartbeating, committing, leaving, going silent, using
stale generations) against the coordinator: one leader per generation, every member of a
completed generation gets that generation, no member is handed an assignment of an older
generation, and every request is answered exactly once."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import pytest

from dlog.serve.group_messages import (
    NO_MEMBER,
    CommitOffset,
    Heartbeat,
    JoinGroup,
    JoinResult,
    LeaveGroup,
    OffsetCommit,
    Protocol,
    SyncGroup,
    SyncResult,
)
from dlog.serve.kafka.errors import ErrorCode
from tests.serve.group_story import GROUP, Story

STEPS = 600


@dataclass
class Client:
    name: str
    member_id: str = NO_MEMBER
    generation: int = -1


class History(Story):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        super().__init__(members_per_group_max=5, initial_rebalance_delay_ms=self.rng.choice([0, 3_000]),
                         new_member_join_timeout_ms=20_000)
        self.clients = [Client(f"c{index}") for index in range(6)]
        self.requests: dict[str, tuple[Client, str, int]] = {}  # id -> (client, kind, generation sent)
        self.leaders: dict[int, tuple[str, str | None]] = {}  # generation -> (leader, protocol)
        self.members_of: dict[int, tuple[str, ...]] = {}  # generation -> members, from the leader's answer
        self.joined: dict[int, set[str]] = defaultdict(set)  # generation -> members answered with it

    # ------------------------------------------------------------------ replies and invariants

    def take(self, outcome) -> None:
        super().take(outcome)  # records the replies: none answered twice
        for reply in outcome.replies:
            client, kind, generation = self.requests[reply.request]
            if isinstance(reply.result, JoinResult):
                self.on_join_answer(client, reply.result)
            elif isinstance(reply.result, SyncResult) and reply.result.error is ErrorCode.NONE:
                self.on_assignment(client, generation, reply.result)
            elif reply.result.error is ErrorCode.UNKNOWN_MEMBER_ID:
                client.member_id, client.generation = NO_MEMBER, -1

    def on_join_answer(self, client: Client, result: JoinResult) -> None:
        if result.error is ErrorCode.MEMBER_ID_REQUIRED:
            client.member_id = result.member_id
        elif result.error is ErrorCode.UNKNOWN_MEMBER_ID:
            client.member_id, client.generation = NO_MEMBER, -1
        if result.error is not ErrorCode.NONE:
            return
        generation = result.generation_id
        view = self.coordinator.group(GROUP)
        assert view is not None and view.generation_id == generation, "a join answered with an old generation"
        leader = self.leaders.setdefault(generation, (result.leader_id, result.protocol_name))
        assert leader == (result.leader_id, result.protocol_name), f"generation {generation}: two leaders"
        if result.member_id == result.leader_id:
            members = tuple(member for member, _ in result.members)
            assert self.members_of.setdefault(generation, members) == members
            assert result.member_id in members
        else:
            assert result.members == (), "a follower was sent the members' metadata"
        self.joined[generation].add(result.member_id)
        client.member_id, client.generation = result.member_id, generation

    def on_assignment(self, client: Client, generation: int, result: SyncResult) -> None:
        view = self.coordinator.group(GROUP)
        assert view is not None and view.generation_id == generation, \
            f"{client.member_id} was handed generation {generation}'s assignment in generation {view}"
        assert result.assignment == f"{generation}:{client.member_id}".encode(), "someone else's assignment"

    # ------------------------------------------------------------------ requests

    def send(self, client: Client, kind: str, generation: int, handler, message) -> None:
        request = self.request(f"{kind}-{client.name}")
        self.requests[request] = (client, kind, generation)
        self.take(handler(request, message, self.now))

    def step(self) -> None:
        client = self.rng.choice(self.clients)
        generation = client.generation - (1 if self.rng.random() < 0.1 else 0)  # now and then stale
        action = self.rng.choices(["join", "sync", "heartbeat", "commit", "leave", "time"],
                                  [20, 15, 25, 8, 4, 28])[0]
        coordinator = self.coordinator
        if action == "join":
            metadata = self.rng.choice([b"orders", b"orders,refunds"])
            protocols = (Protocol("range", metadata), Protocol("roundrobin", metadata))[:self.rng.randint(1, 2)]
            join = JoinGroup(GROUP, client.member_id, client.name, "consumer", protocols, 6_000,
                             self.rng.choice([6_000, 15_000]), self.rng.random() < 0.8)
            self.send(client, "join", generation, coordinator.on_join, join)
        elif action == "sync" and client.member_id:
            leads = self.leaders.get(generation, ("",))[0] == client.member_id
            members = self.members_of.get(generation, ()) if leads else ()
            assignments = tuple((member, f"{generation}:{member}".encode()) for member in members)
            self.send(client, "sync", generation, coordinator.on_sync,
                      SyncGroup(GROUP, generation, client.member_id, assignments))
        elif action == "heartbeat" and client.member_id:
            self.send(client, "heartbeat", generation, coordinator.on_heartbeat,
                      Heartbeat(GROUP, generation, client.member_id))
        elif action == "commit":
            commit = OffsetCommit(GROUP, generation, client.member_id, (CommitOffset("t", 0, 1, None),))
            result = coordinator.on_commit(commit, self.now)
            if result.to_store and generation >= 0:
                view = coordinator.group(GROUP)
                assert view is not None and view.generation_id == generation, "a stale commit was stored"
        elif action == "leave" and client.member_id:
            self.send(client, "leave", generation, coordinator.on_leave, LeaveGroup(GROUP, client.member_id))
        elif action == "time":
            self.advance(self.rng.choice([100, 1_000, 3_000, 7_000]))


@pytest.mark.parametrize("seed", range(40))
def test_random_members_never_break_the_generation_rules(seed):
    history = History(seed)
    try:
        for _ in range(STEPS):
            history.step()
        history.take(history.coordinator.unload())
        assert set(history.replies) == set(history.requests), "a request was never answered"
        for generation, members in history.members_of.items():
            assert set(members) <= history.joined[generation], \
                f"generation {generation}: members {members} were not all answered with it"
        assert history.members_of, "the history completed no generation"
    except AssertionError as error:
        raise AssertionError(f"seed {seed}: {error}") from error
