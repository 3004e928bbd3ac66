"""The consumer-group coordinator keeps Kafka's classic group protocol: members join (with the
MEMBER_ID_REQUIRED dance), one leader assigns, every member of a generation gets it, expired,
leaving and late members start a rebalance, stale generations are refused, and every parked
request is answered, within its named limits."""

from __future__ import annotations

import pytest

from bookkeeper.errors import ConfigError
from dlog.serve.group_messages import (
    NO_GENERATION,
    NO_MEMBER,
    GroupLimits,
    GroupState,
    JoinResult,
    Protocol,
    SyncResult,
)
from dlog.serve.kafka.errors import ErrorCode
from tests.serve.group_story import DELAY_MS, GROUP, REBALANCE_MS, SESSION_MS, Story


def test_three_members_join_the_leader_assigns_and_each_gets_its_part_of_one_generation():
    story = Story()
    a = story.join_new("a")
    join_a = story.last_join
    story.advance(1_000)
    b = story.join_new("b")
    join_b = story.last_join
    c = story.join_new("c")
    join_c = story.last_join
    assert story.state is GroupState.PREPARING_REBALANCE
    assert story.answer(join_a) is None  # parked: the initial delay waits for more members
    story.advance(DELAY_MS - 1_000)
    assert story.answer(join_a) is None  # new members came during the delay: it is stretched once
    story.advance(DELAY_MS)
    answers = [story.answer(join) for join in (join_a, join_b, join_c)]
    assert {answer.error for answer in answers} == {ErrorCode.NONE}
    assert {(x.generation_id, x.leader_id, x.protocol_name) for x in answers} == {(1, a, "range")}
    assert answers[0].members == ((a, b"a-subscription"), (b, b"b-subscription"), (c, b"c-subscription"))
    assert answers[1].members == answers[2].members == ()
    assert story.state is GroupState.COMPLETING_REBALANCE
    sync_b, sync_c = story.sync(b, 1), story.sync(c, 1)
    assert story.answer(sync_b) is None  # parked until the leader's assignment
    sync_a = story.sync(a, 1, [(a, b"p0"), (b, b"p1")])  # c left out: it gets an empty part
    assert story.answer(sync_a) == SyncResult(ErrorCode.NONE, b"p0")
    assert story.answer(sync_b) == SyncResult(ErrorCode.NONE, b"p1")
    assert story.answer(sync_c) == SyncResult(ErrorCode.NONE, b"")
    assert story.state is GroupState.STABLE
    assert story.heartbeat(c, 1) is ErrorCode.NONE


def test_a_member_whose_session_expires_is_dropped_and_the_others_rejoin_in_a_new_generation():
    story = Story()
    members = story.stable_group("a", "b", "c")
    for _ in range(3):  # a and b heartbeat every 3 s; c has gone silent
        story.advance(3_000)
        assert story.heartbeat(members["a"], 1) is ErrorCode.NONE
        assert story.heartbeat(members["b"], 1) is ErrorCode.NONE
    story.advance(3_000)
    assert story.state is GroupState.PREPARING_REBALANCE  # c's session passed: dropped
    assert story.coordinator.members_expired == 1
    assert story.heartbeat(members["c"], 1) is ErrorCode.UNKNOWN_MEMBER_ID
    assert story.heartbeat(members["a"], 1) is ErrorCode.REBALANCE_IN_PROGRESS
    join_a = story.join("a", members["a"])
    join_b = story.join("b", members["b"])
    answers = [story.answer(join_a), story.answer(join_b)]  # all known members joined: done at once
    assert [(x.error, x.generation_id, x.leader_id) for x in answers] == [(ErrorCode.NONE, 2, members["a"])] * 2
    assert [member for member, _ in answers[0].members] == [members["a"], members["b"]]
    assert story.heartbeat(members["a"], 1) is ErrorCode.ILLEGAL_GENERATION


def test_a_member_that_leaves_starts_a_rebalance_and_the_next_member_leads():
    story = Story()
    members = story.stable_group("a", "b", "c")
    assert story.leave(members["a"]) is ErrorCode.NONE  # the leader leaves
    assert story.leave(members["a"]) is ErrorCode.UNKNOWN_MEMBER_ID
    assert story.heartbeat(members["b"], 1) is ErrorCode.REBALANCE_IN_PROGRESS
    join_c = story.join("c", members["c"])
    join_b = story.join("b", members["b"])
    answer = story.answer(join_c)
    assert (answer.generation_id, answer.leader_id) == (2, members["b"])
    assert len(story.answer(join_b).members) == 2
    assert story.coordinator.members_left == 1


def test_a_late_joiner_triggers_a_rebalance_that_completes_when_everyone_rejoined():
    story = Story()
    members = story.stable_group("a", "b")
    d = story.join_new("d")
    join_d = story.last_join
    assert story.state is GroupState.PREPARING_REBALANCE
    assert story.heartbeat(members["a"], 1) is ErrorCode.REBALANCE_IN_PROGRESS
    story.join("a", members["a"])
    assert story.answer(join_d) is None  # b has not rejoined yet
    join_b = story.join("b", members["b"])
    assert story.answer(join_d).generation_id == story.answer(join_b).generation_id == 2
    assert story.answer(join_d).member_id == d


def test_commits_are_judged_by_member_and_generation_and_only_valid_ones_are_stored():
    story = Story(offset_metadata_bytes_max=8)
    members = story.stable_group("a", "b")
    ok = story.commit(members["a"], 1)
    assert [error for _, _, error in ok.errors] == [ErrorCode.NONE] * 2 and len(ok.to_store) == 2
    story.leave(members["b"])  # a rebalance starts; a may still commit its generation's work
    assert story.commit(members["a"], 1).to_store
    join_a = story.join("a", members["a"])  # completes generation 2 (a alone)
    assert story.answer(join_a).generation_id == 2
    stale = story.commit(members["a"], 1)
    assert {error for _, _, error in stale.errors} == {ErrorCode.ILLEGAL_GENERATION} and stale.to_store == ()
    completing = story.commit(members["a"], 2)  # joined, not yet synced
    assert {error for _, _, error in completing.errors} == {ErrorCode.REBALANCE_IN_PROGRESS}
    assert {e for _, _, e in story.commit(members["b"], 2).errors} == {ErrorCode.UNKNOWN_MEMBER_ID}
    assert {e for _, _, e in story.commit(NO_MEMBER, NO_GENERATION).errors} == {ErrorCode.UNKNOWN_MEMBER_ID}
    assert story.commit(NO_MEMBER, NO_GENERATION, group="standalone").to_store  # no group management
    assert {e for _, _, e in story.commit("x", 3, group="standalone").errors} == {ErrorCode.ILLEGAL_GENERATION}
    story.sync(members["a"], 2, [(members["a"], b"all")])
    mixed = story.commit(members["a"], 2, metadata="far too long")
    assert [error for _, _, error in mixed.errors] == [ErrorCode.OFFSET_METADATA_TOO_LARGE, ErrorCode.NONE]
    assert [offset.partition for offset in mixed.to_store] == [1]


def test_member_id_required_then_the_join_with_it_and_a_pending_id_that_never_comes_back_expires():
    story = Story()
    first = story.answer(story.join("a"))
    assert first == JoinResult(ErrorCode.MEMBER_ID_REQUIRED, first.member_id)
    assert story.state is GroupState.EMPTY  # only a pending id: no member yet
    story.advance(SESSION_MS)
    assert story.state is GroupState.DEAD  # the id expired; the empty group is gone
    rejoined = story.join("a", first.member_id)
    assert story.answer(rejoined).error is ErrorCode.UNKNOWN_MEMBER_ID
    old_client = story.join("old", known=False)  # JoinGroup v3: an id and a parked join at once
    assert story.answer(old_client) is None
    story.advance(DELAY_MS)
    assert story.answer(old_client).error is ErrorCode.NONE and story.answer(old_client).generation_id == 1
    assert story.answer(story.join("x", "made-up-id")).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_sync_answers_wrong_members_generations_and_states_as_kafka():
    story = Story()
    members = story.stable_group("a", "b")
    assert story.answer(story.sync("stranger", 1)).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert story.answer(story.sync(members["b"], 0)).error is ErrorCode.ILLEGAL_GENERATION
    assert story.answer(story.sync(members["b"], 1)) == SyncResult(ErrorCode.NONE, b"part-b")  # Stable: again
    story.join("a", members["a"])  # the leader's join starts a rebalance
    assert story.answer(story.sync(members["b"], 1)).error is ErrorCode.REBALANCE_IN_PROGRESS


def test_a_rebalance_starting_while_syncs_are_parked_answers_them_and_clears_assignments():
    story = Story()
    _a, b = story.join_new("a"), story.join_new("b")
    story.advance(2 * DELAY_MS)
    sync_b = story.sync(b, 1)
    late = story.join_new("c")  # before the leader assigned
    assert story.answer(sync_b).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert late and story.state is GroupState.PREPARING_REBALANCE
    assert all(member.assignment == b"" for member in story.coordinator.group(GROUP).members)


def test_protocols_must_match_the_group_and_the_most_preferred_common_one_wins():
    story = Story()
    range_first = (Protocol("range", b"x"), Protocol("roundrobin", b"y"))
    roundrobin_first = (Protocol("roundrobin", b"y"), Protocol("range", b"x"))
    joins = [story.join("a", protocols=range_first, known=False),
             story.join("b", protocols=roundrobin_first, known=False),
             story.join("c", protocols=roundrobin_first, known=False)]
    assert story.answer(story.join("d", protocols=(Protocol("sticky", b""),))).error \
        is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert story.answer(story.join("e", protocol_type="connect", known=False)).error \
        is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    story.advance(REBALANCE_MS)
    assert {story.answer(join).protocol_name for join in joins} == {"roundrobin"}
    assert story.answer(joins[0]).members[1][1] == b"y"  # the leader sees the chosen protocol's metadata


def test_a_follower_joining_again_unchanged_gets_the_current_generation_and_no_rebalance():
    story = Story()
    members = story.stable_group("a", "b")
    again = story.answer(story.join("b", members["b"], protocols=(Protocol("range", b"b-subscription"),)))
    assert (again.error, again.generation_id, again.members) == (ErrorCode.NONE, 1, ())
    assert story.state is GroupState.STABLE
    story.join("b", members["b"], protocols=(Protocol("range", b"new topics"),))  # changed: rebalance
    assert story.state is GroupState.PREPARING_REBALANCE


def test_members_that_do_not_rejoin_in_time_are_dropped_and_a_silent_leader_is_replaced():
    story = Story()
    members = story.stable_group("a", "b")
    join_a = story.join("a", members["a"])  # the leader asks for a rebalance; b keeps heartbeating only
    for _ in range(REBALANCE_MS // 3_000):
        story.advance(3_000)
        story.heartbeat(members["b"], 1)
    assert story.answer(join_a).generation_id == 2
    assert [member for member, _ in story.answer(join_a).members] == [members["a"]]
    join_b = story.join("b", members["b"])  # too late: b was dropped
    assert story.answer(join_b).error is ErrorCode.UNKNOWN_MEMBER_ID
    c = story.join_new("c")
    join_c = story.last_join
    story.join("a", members["a"])
    assert story.answer(join_c).generation_id == 3 and story.answer(join_c).leader_id == members["a"]
    sync_c = story.sync(c, 3)  # the leader heartbeats but never sends its assignment
    for _ in range(REBALANCE_MS // 3_000 - 1):
        story.advance(3_000)
        assert story.heartbeat(members["a"], 3) is ErrorCode.NONE  # CompletingRebalance: fine
    assert story.answer(sync_c) is None
    story.advance(3_000)  # the rebalance timeout since the joins were answered
    assert story.answer(sync_c).error is ErrorCode.REBALANCE_IN_PROGRESS
    join_c = story.join("c", c)
    assert story.answer(join_c).leader_id == c  # the silent leader was dropped


def test_a_superseded_request_is_answered_so_no_request_waits_forever():
    story = Story()
    members = story.stable_group("a", "b")
    first = story.join("b", members["b"], protocols=(Protocol("range", b"changed"),))
    second = story.join("b", members["b"], protocols=(Protocol("range", b"changed"),))
    assert story.answer(first).error is ErrorCode.REBALANCE_IN_PROGRESS and story.answer(second) is None
    parked = story.join("a", members["a"])
    assert story.answer(parked).generation_id == 2
    sync = story.sync(members["b"], 2)
    outcome = story.coordinator.unload()
    story.take(outcome)
    assert story.answer(sync).error is ErrorCode.NOT_COORDINATOR
    assert story.coordinator.group_count == 0 and outcome.wake_at_ms is None


def test_a_new_members_parked_join_gives_up_after_the_new_member_timeout():
    story = Story(new_member_join_timeout_ms=60_000)
    members = story.stable_group("a")
    story.join_new("d", rebalance_ms=600_000)
    join_d = story.last_join
    for _ in range(60_000 // 3_000):  # a heartbeats but never rejoins; the rebalance waits 600 s
        story.advance(3_000)
        story.heartbeat(members["a"], 1)
    assert story.answer(join_d).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_late_wake_handles_deadlines_in_their_order():
    """The driver's timer fired long after the rebalance was due: the rebalance completes first,
    so the new members' parked joins, which would have timed out by now, are answered."""
    story = Story(new_member_join_timeout_ms=60_000)
    joins = [story.join(client, known=False) for client in ("a", "b", "c")]
    story.now = 600_000
    story.take(story.coordinator.on_time(story.now))
    assert {story.answer(join).generation_id for join in joins} == {1}
    assert story.state is GroupState.COMPLETING_REBALANCE


@pytest.mark.parametrize("join, error", [
    ({"group": ""}, ErrorCode.INVALID_GROUP_ID),
    ({"group": "g" * 256}, ErrorCode.INVALID_GROUP_ID),
    ({"session_ms": 5_999}, ErrorCode.INVALID_SESSION_TIMEOUT),
    ({"session_ms": 1_800_001}, ErrorCode.INVALID_SESSION_TIMEOUT),
    ({"protocols": (Protocol("range", b"x" * 2_000),)}, ErrorCode.MESSAGE_TOO_LARGE),
    ({"protocol_type": ""}, ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
])
def test_a_bad_join_is_refused_with_its_kafka_error_and_changes_nothing(join, error):
    story = Story(member_bytes_max=1_024)
    assert story.answer(story.join("a", **join)).error is error
    assert story.coordinator.group_count == 0


def test_groups_members_and_bytes_are_bounded():
    story = Story(members_per_group_max=2, groups_max=2, member_bytes_max=64, state_bytes_max=200)
    story.join_new("a")
    story.join_new("b")
    assert story.answer(story.join("c")).error is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert story.answer(story.join("x", group="second")).error is ErrorCode.MEMBER_ID_REQUIRED
    assert story.answer(story.join("y", group="third")).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    story.advance(2 * DELAY_MS)
    members = [m.member_id for m in story.coordinator.group(GROUP).members]
    leader = members[0]
    sync = story.sync(leader, 1, [(members[1], b"z" * 65)])  # over member_bytes_max
    assert story.answer(sync).error is ErrorCode.MESSAGE_TOO_LARGE
    assert story.state is GroupState.PREPARING_REBALANCE  # as Kafka when it cannot store one
    assert story.coordinator.joins_refused == 2
    assert story.coordinator.state_bytes == sum(len(f"{c}-subscription") + len("range") for c in "ab")


def test_bad_limits_are_refused_with_one_line_naming_them():
    with pytest.raises(ConfigError, match="session_timeout_ms_max"):
        GroupLimits(session_timeout_ms_min=10_000, session_timeout_ms_max=9_000)
    with pytest.raises(ConfigError, match="groups_max"):
        GroupLimits(groups_max=0)


def test_heartbeats_leaves_and_fetches_of_unknown_or_invalid_groups():
    story = Story()
    assert story.heartbeat("m", 1) is ErrorCode.UNKNOWN_MEMBER_ID
    assert story.leave("m") is ErrorCode.UNKNOWN_MEMBER_ID
    assert story.coordinator.check_fetch("") is ErrorCode.INVALID_GROUP_ID
    assert story.coordinator.check_fetch(GROUP) is ErrorCode.NONE
    pending = story.answer(story.join("a")).member_id
    assert story.leave(pending) is ErrorCode.NONE and story.state is GroupState.DEAD  # a pending id may leave
