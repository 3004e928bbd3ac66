"""Who serves a stream, and who coordinates a consumer group: the serving tier's routing rules,
pure (no ZooKeeper, no clock, no sockets: the driver reads the live servers and the lock holder
and hands them in).

Ownership is the stream's writer lock, as in DistributedLog: the server whose lock node is the
lowest owns the stream and holds its one writer; safety still comes from fencing and the
versioned segment list, so two servers that both believe they own a stream cannot both write it.
A stream nobody holds is taken by the live server that rendezvous hashing (highest random weight)
picks for it: every server computes the same pick from the same live set, and when a server joins
or leaves only the streams it wins or held move. A lock held by a server that is no longer live
(its registration is gone, its lock node not yet: the two share one ZooKeeper session, so this
lasts until the session's expiry reaches both) is waited out; a lock held by a native writer
(`open_writer`) is busy.

Typed streams. Kafka producers cannot write a typed stream, so no server takes its lock (which
would only lock out the native writers that can): the server hashing picks serves its reads, the
lock free or held by a native writer (READ). One a server holds (taken before this rule) is served
by it as any stream.

Topics. A topic of one partition is the stream of the same name; a topic of N > 1 partitions is
the N streams `<topic>/partition-<i>` (i = 0..N-1), a hierarchical stream name, so the partitions
list together under their topic and never collide with a one-partition topic's stream.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

PARTITION_PART = "partition-"
PARTITIONS_MAX = 1_000  # partitions of one topic (each is a stream with its own writer lock)


def rendezvous_pick(key: str, servers: Iterable[int]) -> int | None:
    """The server with the highest weight for `key` (None: no servers). Stable: the same live set
    gives the same pick on every server; removing a server moves only the keys it won."""
    best: tuple[bytes, int] | None = None
    for server in servers:
        weight = hashlib.blake2b(f"{server}\0{key}".encode(), digest_size=8).digest()
        if best is None or (weight, -server) > (best[0], -best[1]):
            best = (weight, server)
    return None if best is None else best[1]


def stream_key(stream: str) -> str:
    return f"stream:{stream}"


def group_key(group_id: str) -> str:
    return f"group:{group_id}"


def coordinator_of(group_id: str, live: Iterable[int]) -> int | None:
    """The server that coordinates consumer group `group_id` (FindCoordinator), None with no servers."""
    return rendezvous_pick(group_key(group_id), live)


class Action(enum.Enum):
    SERVE = "serve"  # I hold the lock: serve it
    REDIRECT = "redirect"  # another live server holds it, or will take it: answer with it
    TAKE = "take"  # nobody holds it and hashing picks me: take the lock
    WAIT = "wait"  # a server that is no longer live still holds it: wait for its session to expire
    BUSY = "busy"  # a native writer holds it: no server serves it
    READ = "read"  # a typed stream no server holds, and hashing picks me: serve its reads, lock untouched


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a stream's writer lock: a server (its id) or a native writer (server None)."""

    server: int | None


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    owner: int | None = None  # SERVE: me; REDIRECT: the server to name as leader; else None


def decide(stream: str, me: int, live: frozenset[int], holder: Holder | None, typed: bool = False) -> Decision:
    """What server `me` does with a request for `stream`, given the live servers (`me` among them
    when registered), the lock holder (None: the lock is free) and whether the stream is typed."""
    if typed and (holder is None or holder.server is None):
        pick = rendezvous_pick(stream_key(stream), live | {me})
        return Decision(Action.READ, me) if pick == me else Decision(Action.REDIRECT, pick)
    if holder is not None:
        if holder.server is None:
            return Decision(Action.BUSY)
        if holder.server == me:
            return Decision(Action.SERVE, me)
        if holder.server in live:
            return Decision(Action.REDIRECT, holder.server)
        return Decision(Action.WAIT)
    pick = rendezvous_pick(stream_key(stream), live | {me})
    if pick == me:
        return Decision(Action.TAKE, me)
    return Decision(Action.REDIRECT, pick)


def partition_stream(topic: str, partition: int, partitions: int) -> str:
    """The stream that holds partition `partition` of a topic of `partitions` partitions."""
    if partitions == 1:
        return topic
    return f"{topic}/{PARTITION_PART}{partition}"


def topic_of_stream(stream: str) -> tuple[str, int] | None:
    """(topic, partition) of a partition stream of a multi-partition topic, else None."""
    topic, _, last = stream.rpartition("/")
    if not topic or not last.startswith(PARTITION_PART):
        return None
    number = last[len(PARTITION_PART):]
    if not number.isascii() or not number.isdigit() or (len(number) > 1 and number.startswith("0")):
        return None
    return topic, int(number)


def topics_of(streams: Iterable[str]) -> dict[str, int]:
    """Topic name -> partition count, from a namespace's stream names: a stream is a one-partition
    topic unless it is a partition stream; a multi-partition topic counts the partitions from 0 up
    that exist (a gap ends it: its later streams stay plain streams' partitions, unlisted)."""
    partitions: dict[str, set[int]] = {}
    topics: dict[str, int] = {}
    for stream in streams:
        found = topic_of_stream(stream)
        if found is None:
            topics[stream] = 1
        else:
            partitions.setdefault(found[0], set()).add(found[1])
    for topic, indexes in partitions.items():
        count = 0
        while count in indexes:
            count += 1
        whole = count > 1 and topic not in topics
        if whole:
            topics[topic] = count
        for index in indexes:  # partitions past a gap, a lone partition-0, one under a stream of the topic's name
            if not whole or index >= count:
                topics[partition_stream(topic, index, 2)] = 1
    return topics
