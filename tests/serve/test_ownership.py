"""The routing rules of the serving tier: rendezvous hashing picks the same server everywhere and
moves only what a leaving server held; the lock holder decides serve / redirect / take / wait /
busy; topics map to streams and back."""

from __future__ import annotations

from collections import Counter

import pytest

from dlog.names import check_stream_name
from dlog.serve.ownership import (
    Action,
    Decision,
    Holder,
    coordinator_of,
    decide,
    partition_stream,
    rendezvous_pick,
    stream_key,
    topic_of_stream,
    topics_of,
)

STREAMS = [f"orders-{n}" for n in range(2_000)]


def test_the_pick_does_not_depend_on_the_order_servers_are_listed_in():
    for stream in STREAMS[:200]:
        assert rendezvous_pick(stream, [1, 2, 3, 4]) == rendezvous_pick(stream, [4, 3, 2, 1])
    assert rendezvous_pick("x", []) is None
    assert rendezvous_pick("x", [7]) == 7


def test_streams_spread_over_servers_and_a_leaving_server_moves_only_its_own():
    before = {stream: rendezvous_pick(stream, [0, 1, 2, 3]) for stream in STREAMS}
    counts = Counter(before.values())
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > len(STREAMS) / 4 * 0.8  # roughly even
    after = {stream: rendezvous_pick(stream, [0, 1, 3]) for stream in STREAMS}
    moved = {stream for stream in STREAMS if before[stream] != after[stream]}
    assert moved == {stream for stream in STREAMS if before[stream] == 2}
    # a joining server takes streams only for itself
    joined = {stream: rendezvous_pick(stream, [0, 1, 2, 3, 4]) for stream in STREAMS}
    assert all(joined[s] in (before[s], 4) for s in STREAMS)
    assert any(joined[s] == 4 for s in STREAMS)


def test_streams_and_groups_of_the_same_name_hash_apart():
    assert stream_key("a") != "group:a"
    picks = [(rendezvous_pick(stream_key(name), range(8)), coordinator_of(name, range(8))) for name in STREAMS[:400]]
    assert any(stream != group for stream, group in picks)
    assert coordinator_of("g", []) is None


def test_the_holder_decides():
    live = frozenset({1, 2, 3})
    assert decide("s", 1, live, Holder(1)) == Decision(Action.SERVE, 1)
    assert decide("s", 1, live, Holder(2)) == Decision(Action.REDIRECT, 2)
    assert decide("s", 1, live, Holder(9)) == Decision(Action.WAIT)  # a dead server's lock, until its session ends
    assert decide("s", 1, live, Holder(None)) == Decision(Action.BUSY)  # a native writer


def test_a_free_stream_is_taken_by_the_pick_and_redirected_to_it_elsewhere():
    live = frozenset({1, 2, 3})
    for stream in STREAMS[:100]:
        pick = rendezvous_pick(stream_key(stream), live)
        decisions = {me: decide(stream, me, live, None) for me in live}
        assert decisions[pick] == Decision(Action.TAKE, pick)
        assert all(decisions[me] == Decision(Action.REDIRECT, pick) for me in live - {pick})


def test_a_typed_stream_is_read_by_the_pick_whoever_writes_it_and_never_taken():
    live = frozenset({1, 2, 3})
    for stream in STREAMS[:100]:
        pick = rendezvous_pick(stream_key(stream), live)
        for holder in (None, Holder(None)):  # free, or a native writer's
            decisions = {me: decide(stream, me, live, holder, typed=True) for me in live}
            assert decisions[pick] == Decision(Action.READ, pick)
            assert all(decisions[me] == Decision(Action.REDIRECT, pick) for me in live - {pick})
    # a server holds it (taken before typed streams were read without their lock): it serves, as any
    assert decide("s", 1, live, Holder(1), typed=True) == Decision(Action.SERVE, 1)
    assert decide("s", 1, live, Holder(2), typed=True) == Decision(Action.REDIRECT, 2)


def test_a_server_not_yet_registered_counts_itself():
    assert decide("s", 5, frozenset(), None) == Decision(Action.TAKE, 5)


def test_partitions_map_to_streams_and_back():
    assert partition_stream("orders", 0, 1) == "orders"
    assert partition_stream("orders", 3, 6) == "orders/partition-3"
    check_stream_name(partition_stream("orders", 3, 6))
    assert topic_of_stream("orders/partition-3") == ("orders", 3)
    for plain in ("orders", "orders/partition-", "orders/partition-03", "orders/partition-x", "partition-1"):
        assert topic_of_stream(plain) is None


@pytest.mark.parametrize("streams, topics", [
    (["a", "b/partition-0", "b/partition-1", "b/partition-2"], {"a": 1, "b": 3}),
    (["c/partition-0"], {"c/partition-0": 1}),  # one partition is never written under a topic
    (["d/partition-0", "d/partition-1", "d/partition-3"], {"d": 2, "d/partition-3": 1}),
    (["e", "e/partition-0", "e/partition-1"], {"e": 1, "e/partition-0": 1, "e/partition-1": 1}),
    (["sales/eu"], {"sales/eu": 1}),
])
def test_topics_are_read_from_stream_names(streams, topics):
    assert topics_of(streams) == topics
