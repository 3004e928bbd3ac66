"""Valid stream and subscription names pass, unsafe ones are refused naming the problem, nodes round-trip.

Every accepted stream name maps to one ZooKeeper node name without '/' and back to itself.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper.errors import ConfigError, CorruptMetadataError
from dlog.names import (
    NAME_CHARS_MAX,
    check_stream_name,
    check_subscription_name,
    stream_name_from_node,
    stream_node_name,
)

ACCEPTED_STREAMS = [
    "a",
    "orders",
    "Orders-2024.v1_final",
    "sales/eu/orders",
    "a/b/c/d/e",
    "a.b/c..d/e...",  # dots inside a part are fine; only a leading dot is reserved
    "0",
    "-x",
    "zookeeper-events",  # only the exact part 'zookeeper' is reserved
    "x" * NAME_CHARS_MAX,
]

REFUSED_STREAMS = [
    ("", "empty"),
    ("/", "no parts"),
    ("/orders", "starts or ends with '/'"),
    ("orders/", "starts or ends with '/'"),
    ("a//b", "empty part"),
    (".", "path step"),
    ("..", "path step"),
    ("a/./b", "part '.' is a path step"),
    ("a/../b", "part '..' is a path step"),
    (".hidden", "part '.hidden' starts with '.'"),
    ("a/.tmp", "part '.tmp' starts with '.'"),
    ("_segments", "reserved for internal names"),
    ("a/_lock", "part '_lock' starts with '_'"),
    ("x/_subscribers", "reserved for internal names"),
    ("_spark", "reserved for internal names"),
    ("zookeeper", "ZooKeeper's own node name"),
    ("a/ZooKeeper/b", "ZooKeeper's own node name"),
    ("a b", "character ' ' at position 1"),
    ("a\x00b", "control character"),
    ("a\nb", "control character"),
    ("tab\t", "control character"),
    ("a%2Fb", "character '%'"),
    ("a\\b", "character"),
    ("a:b", "character ':'"),
    ("naïve", "character 'ï'"),
    ("a/b*", "character '*'"),
    ("x" * (NAME_CHARS_MAX + 1), "201 characters, over 200"),
]


@pytest.mark.parametrize("name", ACCEPTED_STREAMS)
def test_accepted_stream_names(name: str) -> None:
    assert check_stream_name(name) == name
    node = stream_node_name(name)
    assert "/" not in node and stream_name_from_node(node) == name


@pytest.mark.parametrize(("name", "problem"), REFUSED_STREAMS)
def test_refused_stream_names_say_why(name: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_stream_name(name)
    message = str(caught.value)
    assert problem in message and message.startswith("bad stream name")
    assert "A-Z a-z 0-9" in message  # and the rule that would be right
    with pytest.raises(ConfigError):
        stream_node_name(name)


@pytest.mark.parametrize("value", [None, 12, b"orders", ["orders"]])
def test_non_text_names_are_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="must be text"):
        check_stream_name(value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be text"):
        check_subscription_name(value)  # type: ignore[arg-type]


def test_a_long_bad_name_is_cut_short_in_the_message() -> None:
    with pytest.raises(ConfigError) as caught:
        check_stream_name("y" * 10_000)
    assert len(str(caught.value)) < 300 and "10000 characters" in str(caught.value)


@pytest.mark.parametrize("name", ["billing", "billing-2", "a.b_c", "x" * NAME_CHARS_MAX])
def test_accepted_subscription_names(name: str) -> None:
    assert check_subscription_name(name) == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [("", "empty"), ("a/b", "character '/'"), ("..", "path step"), (".x", "starts with '.'"),
     ("_x", "starts with '_'"), ("zookeeper", "ZooKeeper's own node name"), ("a b", "character ' '"),
     ("x" * (NAME_CHARS_MAX + 1), "over 200")],
)
def test_refused_subscription_names_say_why(name: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="bad subscription name") as caught:
        check_subscription_name(name)
    assert problem in str(caught.value) and "no /" in str(caught.value)


@pytest.mark.parametrize("node", ["a%2F", "%2Fa", "a%2F%2Fb", "a%2fb", "a%b", "a%252Fb", "a/b", "_x", "a%2F..",
                                  "", "zookeeper"])
def test_nodes_no_valid_name_maps_to_are_corrupt_metadata(node: str) -> None:
    with pytest.raises(CorruptMetadataError, match="stream node"):
        stream_name_from_node(node)


PART = st.text(alphabet="ABCxyz0189._-", min_size=1, max_size=30).filter(
    lambda part: not part.startswith((".", "_")) and part.lower() != "zookeeper"
)


@given(st.lists(PART, min_size=1, max_size=8).map("/".join).filter(lambda name: len(name) <= NAME_CHARS_MAX))
def test_every_accepted_name_round_trips_through_one_node(name: str) -> None:
    assert check_stream_name(name) == name
    node = stream_node_name(name)
    assert "/" not in node
    assert stream_name_from_node(node) == name


@given(st.text(max_size=60))
def test_any_text_is_either_a_round_tripping_name_or_a_config_error(name: str) -> None:
    try:
        check_stream_name(name)
    except ConfigError:
        return
    assert "/" not in stream_node_name(name) and stream_name_from_node(stream_node_name(name)) == name
    assert all(part and part[0] not in "._" for part in name.split("/"))
    assert set(name) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/")
