"""Appending finished ledgers to a stream as completed segments, with the sink's batch id.

`commit_batch` is the sink's one metadata change per micro-batch (`commit_routed` the same over
several streams at once, for rows routed by their `stream` column): under the stream's writer lock
(so no live writer has an in-progress segment that the new segments would follow, L3), it seals
a dead writer's in-progress segment first (fences it: the one recipe of `dlog.seal`, L1/L4),
then creates one COMPLETED segment per ledger after `max_sequence` and records the batch id for
the sink, in ONE compare-and-set change of the segment store (a `SegmentChange` with a
`SinkCommit`). The new segments get their stream positions one after the other, in partition
order, after the last segment (`changes.append_change`, which also assigns positions to a stream
written before they existed, as a writer's open does; V4). A lost compare-and-set (truncation or
retention changed the list) plans again. A batch id at or below the one recorded is a replay:
nothing is appended and the replay's ledgers are deleted, unless the list already holds them (a
retried commit whose first try went through).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from bookkeeper.errors import ConfigError, DlogError, MetadataContentionError, MetadataVersionError
from bookkeeper.retry import Backoff, retry
from dlog.core import changes
from dlog.core.dedup import encode_stored
from dlog.core.errors import ProducersFullError, SequenceError, StreamBusyError
from dlog.seal import seal_in_progress
from dlog.segments.metadata import Segment, SegmentChange, SegmentList, SegmentState, SinkCommit, StreamConfig

if TYPE_CHECKING:
    from dlog.namespace import Namespace
    from dlog_spark.sink import DlogCommitMessage

log = logging.getLogger(__name__)
LOCK_TIMEOUT_S = 30.0
ROUTED_STREAMS_MAX = 100  # target streams of one routed batch: all of them change in one multi
# a lost compare-and-set (a truncation or retention run changed the list) means: plan again
COMMIT_RETRY = Backoff(attempts_max=20, delay_s_first=0.005, delay_s_max=0.2, jitter_fraction=1.0)


class SinkLockedError(DlogError):
    """A live writer holds the stream; the sink cannot append segments behind it."""

    code = 351
    retryable = True


class _Replay(Exception):
    """The batch id is already recorded: nothing to append."""


async def commit_batch(namespace: Namespace, stream: str, messages: Sequence[DlogCommitMessage],
                       batch_id: int | None, sink_id: str | None) -> bool:
    """Append the messages' ledgers as segments (and record `batch_id` for `sink_id`). Returns
    False when the batch was a replay and nothing was appended. A routed commit of one stream."""
    return await commit_routed(namespace, {stream: messages}, batch_id, sink_id)


async def commit_routed(namespace: Namespace, batches: Mapping[str, Sequence[DlogCommitMessage]],
                        batch_id: int | None, sink_id: str | None) -> bool:
    """A routed batch (rows sent to several streams): append every stream's ledgers and record
    `batch_id` for every target, in ONE change of the segment store (`commit_many`) guarded by
    each list's version, so the batch lands in all its streams or in none. Returns False for a
    replay (any target already recorded a batch id >= `batch_id`: since batches land whole, all did)."""
    streams = sorted(batches)
    if len(streams) > ROUTED_STREAMS_MAX:
        raise ConfigError(f"a batch of the dlog sink routes rows to {len(streams)} streams, over the limit of "
                          f"{ROUTED_STREAMS_MAX} per batch (one ZooKeeper multi holds them all)")
    store = namespace.store
    named = f"stream {streams[0]!r}" if len(streams) == 1 else f"streams {streams}"
    if await _routed_replay(namespace, batches, batch_id, sink_id):
        return False
    locks: list[str] = []
    try:
        for stream in streams:  # in name order: two routed sinks never wait for each other in a cycle
            lock_node = await store.lock(stream, LOCK_TIMEOUT_S)
            if lock_node is None:
                raise SinkLockedError(f"stream {stream!r} has a live writer (its lock stayed taken for "
                                      f"{LOCK_TIMEOUT_S} s); the sink appends only while no other writer is open")
            locks.append(lock_node)
        return await retry(lambda: _commit_routed_once(namespace, streams, batches, batch_id, sink_id),
                           COMMIT_RETRY, what=f"sink commit of {named}", quiet=True,
                           clock=namespace.clock, rng=namespace.rng)
    except MetadataContentionError as exc:
        raise StreamBusyError(f"{named} kept changing; the sink commit gave up after "
                              f"{COMMIT_RETRY.attempts_max} tries") from exc
    except _Replay:
        return False
    finally:
        for lock_node in reversed(locks):
            await store.unlock(lock_node)


async def _commit_routed_once(namespace: Namespace, streams: list[str],
                              batches: Mapping[str, Sequence[DlogCommitMessage]],
                              batch_id: int | None, sink_id: str | None) -> bool:
    store = namespace.store
    commits: list[tuple[str, SegmentList, SegmentChange]] = []
    for stream in streams:
        config = await store.config(stream)
        listing = await recover_in_progress(namespace, config, await store.segments(stream))
        if listing.in_progress is not None:  # a writer rolled meanwhile (our lock lapsed with its session)
            raise MetadataContentionError(f"stream {stream!r} has a new in-progress segment "
                                          f"{listing.in_progress.sequence} after its last one was sealed: "
                                          "another writer wrote meanwhile")
        ledgers = tuple(m.ledger for m in batches[stream])
        if any(listing.by_ledger(ledger_id) is not None for ledger_id in ledgers):
            return True  # an earlier try of this very commit went through (in every stream)
        sink = None
        if sink_id is not None and batch_id is not None:
            recorded = await store.sink_batch(stream, sink_id)
            if recorded is not None and recorded.batch_id >= batch_id:
                raise _Replay() if await _routed_replay(namespace, batches, batch_id, sink_id) else \
                    MetadataContentionError(f"sink {sink_id!r} of stream {stream!r} moved meanwhile")
            sink = SinkCommit(sink_id, batch_id, ledgers, recorded)
        segments = tuple(_segment(listing.max_sequence + 1 + index, message, namespace.clock.wall_ms())
                         for index, message in enumerate(batches[stream]))
        change = changes.append_change(listing, segments, sink)
        if any(getattr(m, "producer", None) is not None for m in batches[stream]):
            change = await _with_producers(namespace, stream, listing, change, batches[stream])
        commits.append((stream, listing, change))
    try:
        await store.commit_many(commits)
    except MetadataVersionError as exc:
        raise MetadataContentionError(f"a segment list of {streams} changed meanwhile") from exc
    log.info("dlog sink: batch %s appended ledgers %s", batch_id,
             {stream: [m.ledger for m in batches[stream]] for stream in streams})
    return True


async def _with_producers(namespace: Namespace, stream: str, listing: SegmentList, change: SegmentChange,
                          messages: Sequence[DlogCommitMessage]) -> SegmentChange:
    """The change with the stream's producer snapshot after the tasks' batches (producerId): each
    task producer's sequences must lie above what the stream holds for it, as its task saw when it
    began; another job with the same producerId that committed meanwhile makes the batch fail
    (SequenceError) rather than land twice. The snapshot goes in the same multi as the segments."""
    table, version, end = await namespace.producer_table(stream, listing)
    if version is None:  # the multi sets the node: it must exist
        await namespace.store.store_dedup_snapshot(stream, encode_stored(end, table.snapshot()), None)
    now_ms = namespace.clock.wall_ms()
    for message, segment in zip(messages, change.create, strict=True):
        producer = getattr(message, "producer", None)
        if producer is None or message.first_sequence < 0:
            continue
        last = table.last_sequence(producer)
        if last is not None and message.first_sequence <= last:
            raise SequenceError(
                f"producer {producer!r} of stream {stream!r} wrote sequences {message.first_sequence}.."
                f"{message.last_sequence} but the stream already holds up to {last} (another job with the same "
                "producerId committed meanwhile); the batch is not appended", last + 1)
        refused = table.room_for(producer)
        if refused is not None:
            raise ProducersFullError(f"stream {stream!r}: {refused.message}")
        assert segment.first_position is not None
        table.on_written(producer, message.first_sequence, message.last_sequence, segment.first_position,
                         segment.first_position + segment.records - 1, now_ms)
    ends = [s.first_position + s.records for s in change.create if s.first_position is not None]
    table.expire(now_ms)
    return replace(change, dedup=encode_stored(max(ends, default=end), table.snapshot()))


async def _routed_replay(namespace: Namespace, batches: Mapping[str, Sequence[DlogCommitMessage]],
                         batch_id: int | None, sink_id: str | None) -> bool:
    """Whether a target stream already recorded this batch; if so its ledgers are all deleted."""
    if sink_id is None or batch_id is None:
        return False
    for stream in sorted(batches):
        recorded = await namespace.store.sink_batch(stream, sink_id)
        if recorded is not None and recorded.batch_id >= batch_id:
            for target, messages in sorted(batches.items()):
                await _drop_replay(namespace, target, [m.ledger for m in messages], batch_id, recorded.batch_id)
            return True
    return False


async def recover_in_progress(namespace: Namespace, config: StreamConfig, listing: SegmentList) -> SegmentList:
    """Seal a previous writer's in-progress segment (fencing its ledger), or drop it when empty:
    the one recipe a writer's open uses too (dlog.seal)."""
    segment = listing.in_progress
    if segment is None:
        return listing
    sealed, exists = await seal_in_progress(namespace.client, namespace.password_of(config), segment,
                                             namespace.clock.wall_ms())
    try:
        listing = await namespace.store.commit(config.name, listing, changes.seal_change(segment, sealed))
    except MetadataVersionError as exc:
        raise MetadataContentionError(f"the segment list of stream {config.name!r} changed meanwhile") from exc
    if sealed is None:
        if exists:
            await namespace.delete_ledger_quietly(segment.ledger_id)
        log.info("stream %s: removed empty in-progress segment %d", config.name, segment.sequence)
    else:
        log.info("stream %s: recovered segment %d (ledger %d) at entry %d", config.name, segment.sequence,
                 segment.ledger_id, sealed.last_entry)
    return listing


async def delete_ledgers(namespace: Namespace, ledgers: Sequence[int], stream: str | None = None) -> None:
    """Delete ledgers that no segment references (a listed ledger is never deleted here)."""
    listed: set[int] = set()
    if stream is not None:
        try:
            listed = {s.ledger_id for s in (await namespace.store.segments(stream)).segments}
        except DlogError as error:
            log.warning("dlog sink: cannot list stream %s, keeping ledgers %s: %s", stream, list(ledgers), error)
            return
    for ledger_id in ledgers:
        if ledger_id not in listed:
            await namespace.delete_ledger_quietly(ledger_id)


async def _drop_replay(namespace: Namespace, stream: str, ledgers: list[int], batch_id: int, recorded: int) -> None:
    log.info("dlog sink: stream %s batch %d is a replay (batch %d already committed); deleting its ledgers %s",
             stream, batch_id, recorded, ledgers)
    await delete_ledgers(namespace, ledgers, stream=stream)


def _segment(sequence: int, message: DlogCommitMessage, now_ms: int) -> Segment:
    return Segment(sequence, message.ledger, state=SegmentState.COMPLETED, first_entry=0,
                   last_entry=message.last_entry, records=message.records, bytes=message.bytes,
                   first_timestamp_ms=message.first_timestamp_ms, last_timestamp_ms=message.last_timestamp_ms,
                   created_ms=message.created_ms, completed_ms=now_ms,
                   schema_version=getattr(message, "schema_version", 0))  # (the simulator's messages have none)
