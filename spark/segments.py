"""Appending finished ledgers to a stream as completed segments, with the sink's batch id.

`commit_batch` is the sink's one metadata change per micro-batch (`commit_routed` the same over
several streams at once, for rows routed by their `stream` column): under the stream's writer lock
(so no live writer has an in-progress segment that the new segments would follow, L3), it seals
a dead writer's in-progress segment first (fences it, as `StreamWriter._recover` does, L1/L4),
then creates one COMPLETED segment per ledger after `max_sequence` and sets the sink node to the
batch id, all in one multi guarded by the segment-list version. A batch id at or below the one
recorded is a replay: nothing is appended and the replay's ledgers are deleted, unless the list
already holds them (a retried commit whose first try went through).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from bookkeeper.clock import wall_ms
from bookkeeper.errors import (
    ConfigError,
    DlogError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from bookkeeper.meta.zk import CreateOp, Op, SetOp
from dlog.segments.codec import RecordSetCodec, default_schema
from dlog.segments.metadata import Segment, SegmentState, StreamConfig
from dlog.segments.store import SegmentList

if TYPE_CHECKING:
    from dlog.namespace import Namespace
    from spark.sink import DlogCommitMessage

log = logging.getLogger(__name__)
LOCK_TIMEOUT_S = 30.0
COMMIT_RETRIES_MAX = 10
ROUTED_STREAMS_MAX = 100  # target streams of one routed batch: all of them change in one multi
SINK_NODE_FORMAT = 1


class SinkLockedError(DlogError):
    """A live writer holds the stream; the sink cannot append segments behind it."""

    code = 351
    retryable = True


async def commit_batch(namespace: Namespace, stream: str, messages: Sequence[DlogCommitMessage],
                       batch_id: int | None, sink_id: str | None) -> bool:
    """Append the messages' ledgers as segments (and record `batch_id` for `sink_id`). Returns
    False when the batch was a replay and nothing was appended."""
    store = namespace.store
    ledgers = [m.ledger_id for m in messages]
    if sink_id is not None and batch_id is not None:
        recorded = await _sink_node(namespace, stream, sink_id)
        if recorded is not None and recorded[0] >= batch_id:
            await _drop_replay(namespace, stream, ledgers, batch_id, recorded[0])
            return False
    lock_node = await store.lock(stream, LOCK_TIMEOUT_S)
    if lock_node is None:
        raise SinkLockedError(f"stream {stream!r} has a live writer (its lock stayed taken for {LOCK_TIMEOUT_S} s); "
                              "the sink appends only while no other writer is open")
    try:
        for _ in range(COMMIT_RETRIES_MAX):
            config = await store.config(stream)
            listing = await recover_in_progress(namespace, config, await store.segments(stream))
            if any(listing.by_ledger(ledger_id) is not None for ledger_id in ledgers):
                return True  # an earlier try of this very commit went through
            extra: list[Op] = []
            if sink_id is not None and batch_id is not None:
                recorded = await _sink_node(namespace, stream, sink_id)
                if recorded is not None and recorded[0] >= batch_id:
                    await _drop_replay(namespace, stream, ledgers, batch_id, recorded[0])
                    return False
                extra.append(_sink_op(store.sink_path(stream, sink_id), batch_id, ledgers, recorded))
            segments = [_segment(listing.max_sequence + 1 + index, message)
                        for index, message in enumerate(messages)]
            try:
                await store.commit(stream, listing, create=segments, extra=extra)
            except (MetadataVersionError, MetadataExistsError, MetadataNotFoundError):
                continue  # the list or the sink node changed meanwhile: look again
            log.info("dlog sink: stream %s batch %s appended ledgers %s", stream, batch_id, ledgers)
            return True
        raise DlogError(f"stream {stream!r} kept changing; the sink commit gave up after {COMMIT_RETRIES_MAX} tries")
    finally:
        await store.unlock(lock_node)


async def commit_routed(namespace: Namespace, batches: Mapping[str, Sequence[DlogCommitMessage]],
                        batch_id: int | None, sink_id: str | None) -> bool:
    """A routed batch (rows sent to several streams): append every stream's ledgers and record
    `batch_id` in every target's sink node, in ONE ZooKeeper multi guarded by each list's
    version, so the batch lands in all its streams or in none. Returns False for a replay
    (any target already recorded a batch id >= `batch_id`: since batches land whole, all did)."""
    streams = sorted(batches)
    if len(streams) > ROUTED_STREAMS_MAX:
        raise ConfigError(f"a batch of the dlog sink routes rows to {len(streams)} streams, over the limit of "
                          f"{ROUTED_STREAMS_MAX} per batch (one ZooKeeper multi holds them all)")
    store = namespace.store
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
        for _ in range(COMMIT_RETRIES_MAX):
            commits = []
            for stream in streams:
                config = await store.config(stream)
                listing = await recover_in_progress(namespace, config, await store.segments(stream))
                ledgers = [m.ledger_id for m in batches[stream]]
                if any(listing.by_ledger(ledger_id) is not None for ledger_id in ledgers):
                    return True  # an earlier try of this very commit went through (in every stream)
                extra: list[Op] = []
                if sink_id is not None and batch_id is not None:
                    recorded = await _sink_node(namespace, stream, sink_id)
                    extra.append(_sink_op(store.sink_path(stream, sink_id), batch_id, ledgers, recorded))
                segments = [_segment(listing.max_sequence + 1 + index, message)
                            for index, message in enumerate(batches[stream])]
                commits.append((stream, listing, segments, extra))
            if await _routed_replay(namespace, batches, batch_id, sink_id):
                return False
            try:
                await store.commit_many(commits)
            except (MetadataVersionError, MetadataExistsError, MetadataNotFoundError):
                continue  # a list or a sink node changed meanwhile: look again
            log.info("dlog sink: batch %s appended ledgers %s", batch_id,
                     {stream: [m.ledger_id for m in batches[stream]] for stream in streams})
            return True
        raise DlogError(f"streams {streams} kept changing; the sink commit gave up after {COMMIT_RETRIES_MAX} tries")
    finally:
        for lock_node in reversed(locks):
            await store.unlock(lock_node)


async def _routed_replay(namespace: Namespace, batches: Mapping[str, Sequence[DlogCommitMessage]],
                         batch_id: int | None, sink_id: str | None) -> bool:
    """Whether a target stream already recorded this batch; if so its ledgers are all deleted."""
    if sink_id is None or batch_id is None:
        return False
    for stream in sorted(batches):
        recorded = await _sink_node(namespace, stream, sink_id)
        if recorded is not None and recorded[0] >= batch_id:
            for target, messages in sorted(batches.items()):
                await _drop_replay(namespace, target, [m.ledger_id for m in messages], batch_id, recorded[0])
            return True
    return False


async def recover_in_progress(namespace: Namespace, config: StreamConfig, listing: SegmentList) -> SegmentList:
    """Seal a previous writer's in-progress segment (fencing its ledger), or drop it when empty;
    the same steps as `StreamWriter._recover`."""
    segment = listing.in_progress
    if segment is None:
        return listing
    store = namespace.store
    try:
        handle = await namespace.client.open_ledger(segment.ledger_id, password=namespace.password_of(config),
                                                    recovery=True)
    except NoSuchLedgerError:
        handle = None
    if handle is None or handle.last_add_confirmed < segment.first_entry:
        await store.commit(config.name, listing, delete=[segment])
        if handle is not None:
            await namespace.delete_ledger_quietly(segment.ledger_id)
        log.info("stream %s: removed empty in-progress segment %d", config.name, segment.sequence)
    else:
        codec = RecordSetCodec(default_schema())  # headers only
        last = handle.last_add_confirmed
        first_entry = (await handle.read(segment.first_entry, segment.first_entry))[0]
        last_entry = (await handle.read(last, last))[0]
        first_header, last_header = codec.peek_header(first_entry.payload), codec.peek_header(last_entry.payload)
        completed = segment.completed(last, last_header.next_record_index, handle.metadata.length,
                                      first_header.min_timestamp_ms, last_header.max_timestamp_ms, wall_ms())
        await store.commit(config.name, listing, update=[completed])
        log.info("stream %s: recovered segment %d (ledger %d) at entry %d", config.name, segment.sequence,
                 segment.ledger_id, last)
    return await store.segments(config.name)


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


async def _sink_node(namespace: Namespace, stream: str, sink_id: str) -> tuple[int, int] | None:
    """(last committed batch id, node version) of a sink, or None before its first commit."""
    found = await namespace.zk.get_or_none(namespace.store.sink_path(stream, sink_id))  # type: ignore[union-attr]
    if found is None:
        return None
    data, version = found
    try:
        document = json.loads(data)
        return int(document["batch"]), version
    except (ValueError, KeyError, TypeError) as error:
        raise DlogError(f"sink node of stream {stream!r} sink {sink_id!r} is corrupt: {error}") from error


def _sink_op(path: str, batch_id: int, ledgers: list[int], recorded: tuple[int, int] | None) -> Op:
    data = json.dumps({"batch": batch_id, "format": SINK_NODE_FORMAT, "ledgers": ledgers,
                       "committed_ms": wall_ms()}, sort_keys=True).encode()
    if recorded is None:
        return CreateOp(path, data)
    return SetOp(path, data, recorded[1])


def _segment(sequence: int, message: DlogCommitMessage) -> Segment:
    return Segment(sequence, message.ledger_id, state=SegmentState.COMPLETED, first_entry=0,  # type: ignore[arg-type]
                   last_entry=message.last_entry, records=message.records, bytes=message.bytes,
                   first_timestamp_ms=message.first_timestamp_ms, last_timestamp_ms=message.last_timestamp_ms,
                   created_ms=message.created_ms, completed_ms=wall_ms())
