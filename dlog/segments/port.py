"""The segment store port: what the stream layer needs from its metadata store, in stream terms.

Streams, their configs, segment lists changed by compare-and-set (`commit`), writer locks,
watches of the segment list, subscriptions and the Spark sink's batch ids. Two implementations:
ZooKeeper (`dlog.segments.store`, the only place that builds ZooKeeper operations) and in memory
(`dlog.segments.memory`, for unit tests and the stream simulator). Nothing above this port knows
which one it talks to.

Implementations make ONE attempt per call and report what happened: a lost compare-and-set is
`MetadataVersionError`; a store that could not be reached is a retryable `MetadataError` whose
outcome is unknown for writes. `RetryingSegmentStore` wraps either one and retries retryable
failures within a deadline (bookkeeper.retry, the one retry helper), and for a `commit` whose
answer was lost it reads the list back first: unchanged, it tries again; changed and holding the
change, it counts as done; changed otherwise, it is a lost compare-and-set. A ZooKeeper leader
change (ConnectionLoss for a moment) is so never an error for the stream layer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import DlogError, MetadataError, MetadataVersionError
from bookkeeper.retry import Backoff, retry
from dlog.segments.metadata import SegmentChange, SegmentList, SinkBatch, StreamConfig, TierPolicy

log = logging.getLogger(__name__)
T = TypeVar("T")

# Retryable metadata failures (ZooKeeper ConnectionLoss while a leader is elected, a session
# moving to another server) are retried for up to this long: longer than an election and a
# reconnect, shorter than a writer's patience.
METADATA_RETRY = Backoff(attempts_max=40, delay_s_first=0.05, delay_s_max=1.0, deadline_s=30.0)


class StreamNotFoundError(DlogError):
    code = 310


class StreamExistsError(DlogError):
    code = 311


class SegmentStore(Protocol):
    """One namespace's stream metadata. Every method is one attempt (see the module docstring)."""

    async def create_stream(self, config: StreamConfig) -> None:
        """StreamExistsError if a stream of that name exists (with other settings)."""

    async def config(self, stream: str) -> StreamConfig:
        """StreamNotFoundError if there is no such stream."""

    async def update_config(self, config: StreamConfig, based_on: StreamConfig | None = None) -> None:
        """Store `config`; with `based_on`, only if the stored config still equals it (a
        compare-and-set: MetadataVersionError otherwise)."""

    async def list_streams(self) -> list[str]: ...

    async def delete_stream_metadata(self, stream: str) -> None: ...

    async def segments(self, stream: str) -> SegmentList: ...

    async def commit(self, stream: str, based_on: SegmentList, change: SegmentChange) -> SegmentList:
        """Apply `change` if the list is still at `based_on.version` (compare-and-set), and the
        sink record with it if the change has one; returns the new list. MetadataVersionError
        when the list (or the sink record) changed since."""

    async def commit_many(self, commits: Sequence[tuple[str, SegmentList, SegmentChange]]) -> list[SegmentList]:
        """Several streams' changes (stream, based on, change) as ONE compare-and-set: all land
        or none; MetadataVersionError when any list or sink record changed since."""

    def watch_segments(self, stream: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` on the event loop whenever the segment list changes; returns a stop
        function. Watches survive reconnections."""

    async def lock(self, stream: str, timeout_s: float, holder: dict[str, Any] | None = None) -> str | None:
        """Take the stream's writer lock within `timeout_s`: its token, or None (nothing left
        behind). The lock lives as long as this client's session. `holder` describes who holds
        it (a serving-tier server names itself), where the store can keep it."""

    async def unlock(self, token: str) -> None:
        """Release a lock; releasing one that is gone (session lost) is no error."""

    async def claim_runner(self, stream: str, runner: str) -> str | None:
        """Claim the running of the stream's policies for `runner` (one runner per stream): None
        when `runner` holds the claim now (taken, or held already), else the holder's id. The claim
        lives as long as this client's session; asking again after a lost answer is safe."""

    async def claim_offloader(self, stream: str, offloader: str) -> str | None:
        """Claim the offloading of the stream's segments for `offloader` (one at a time per
        stream): None when it holds the claim now, else the holder's id. Lives as long as this
        client's session, or until `release_offloader`."""

    async def release_offloader(self, stream: str, offloader: str) -> None:
        """Give the claim up if `offloader` holds it (no error otherwise)."""

    async def tier_status(self, stream: str) -> dict[str, Any] | None:
        """What the last offload run of the stream reported (`store_tier_status`), or None."""

    async def store_tier_status(self, stream: str, status: dict[str, Any]) -> None:
        """Record the stream's offload status (the last run's outcome, its error): the status page
        and `dlog tier status` show it, whichever process offloaded."""

    async def namespace_tier(self) -> TierPolicy | None:
        """The namespace's default tier policy, or None when it has none."""

    async def set_namespace_tier(self, policy: TierPolicy) -> None:
        """Set the namespace's default tier policy (an empty policy removes it)."""

    async def subscriptions(self, stream: str) -> dict[str, dict[str, int]]: ...

    async def commit_subscription(self, stream: str, subscription: str, offset_json: dict[str, int]) -> None: ...

    async def delete_subscription(self, stream: str, subscription: str) -> None: ...

    async def replace_subscription(self, stream: str, subscription: str, expected: dict[str, int],
                                   document: dict[str, int] | None) -> bool:
        """Store `document` as the subscription (None: delete it) if it is still `expected`, as one
        compare-and-set; False when it changed or is gone (a commit meanwhile wins)."""

    async def sink_batch(self, stream: str, sink_id: str) -> SinkBatch | None:
        """The last batch `sink_id` committed to `stream`, or None before its first."""

    async def dedup_snapshot(self, stream: str) -> tuple[bytes, int] | None:
        """The producer-dedup snapshot a serving-tier owner stored (`dlog.core.dedup.encode_stored`)
        and its version, or None before any owner stored one."""

    async def store_dedup_snapshot(self, stream: str, data: bytes, version: int | None) -> int:
        """Store the snapshot if it is still at `version` (None: there is none yet), compare-and-set;
        the new version. MetadataVersionError when another owner stored one since."""


class RetryingSegmentStore:
    """Any SegmentStore, with retryable failures retried within `policy` (see module docstring).
    Attributes not in the port (ZooKeeper paths, fault switches) pass through to the inner one."""

    def __init__(self, inner: SegmentStore, policy: Backoff = METADATA_RETRY, *,
                 clock: Clock = SYSTEM_CLOCK, sleep: Callable[[float], Awaitable[Any]] | None = None,
                 rng: Callable[[], float] | None = None) -> None:
        """`rng`: the jitter's random source (default: the `random` module's)."""
        self.inner = inner
        self.policy = policy
        self.clock = clock
        self._sleep = sleep
        self._rng = rng

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _retry(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        options: dict[str, Any] = {"clock": self.clock}
        if self._sleep is not None:
            options["sleep"] = self._sleep
        if self._rng is not None:
            options["rng"] = self._rng
        return await retry(operation, self.policy, what=what, **options)

    # ------------------------------------------------------------------ idempotent calls

    async def config(self, stream: str) -> StreamConfig:
        return await self._retry(f"config of stream {stream!r}", lambda: self.inner.config(stream))

    async def update_config(self, config: StreamConfig, based_on: StreamConfig | None = None) -> None:
        await self._retry(f"config update of stream {config.name!r}",
                          lambda: self.inner.update_config(config, based_on))

    async def list_streams(self) -> list[str]:
        return await self._retry("stream list", self.inner.list_streams)

    async def segments(self, stream: str) -> SegmentList:
        return await self._retry(f"segment list of stream {stream!r}", lambda: self.inner.segments(stream))

    def watch_segments(self, stream: str, callback: Callable[[], None]) -> Callable[[], None]:
        return self.inner.watch_segments(stream, callback)

    async def unlock(self, token: str) -> None:
        await self._retry("writer lock release", lambda: self.inner.unlock(token))

    async def subscriptions(self, stream: str) -> dict[str, dict[str, int]]:
        return await self._retry(f"subscriptions of stream {stream!r}", lambda: self.inner.subscriptions(stream))

    async def commit_subscription(self, stream: str, subscription: str, offset_json: dict[str, int]) -> None:
        await self._retry(f"subscription {subscription!r} commit",
                          lambda: self.inner.commit_subscription(stream, subscription, offset_json))

    async def replace_subscription(self, stream: str, subscription: str, expected: dict[str, int],
                                   document: dict[str, int] | None) -> bool:
        # a lost answer retried finds the node changed (by us): False, and the caller's next run sees it done
        return await self._retry(f"subscription {subscription!r} change",
                                 lambda: self.inner.replace_subscription(stream, subscription, expected, document))

    async def sink_batch(self, stream: str, sink_id: str) -> SinkBatch | None:
        return await self._retry(f"sink {sink_id!r} record", lambda: self.inner.sink_batch(stream, sink_id))

    # ------------------------------------------------------------------ calls that need a look back

    async def create_stream(self, config: StreamConfig) -> None:
        first = True

        async def attempt() -> None:
            nonlocal first
            try:
                await self.inner.create_stream(config)
            except StreamExistsError:
                if first:
                    raise
                # an earlier attempt whose answer was lost may have created it: ours if equal
                if await self.inner.config(config.name) != config:
                    raise
            finally:
                first = False

        await self._retry(f"creation of stream {config.name!r}", attempt)

    async def delete_stream_metadata(self, stream: str) -> None:
        first = True

        async def attempt() -> None:
            nonlocal first
            try:
                await self.inner.delete_stream_metadata(stream)
            except StreamNotFoundError:
                if first:
                    raise  # gone before we asked; after a lost answer, gone means done
            finally:
                first = False

        await self._retry(f"deletion of stream {stream!r}", attempt)

    async def delete_subscription(self, stream: str, subscription: str) -> None:
        await self._retry(f"subscription {subscription!r} deletion",
                          lambda: self.inner.delete_subscription(stream, subscription))

    async def lock(self, stream: str, timeout_s: float, holder: dict[str, Any] | None = None) -> str | None:
        # implementations make the lock node findable after a lost answer (see store.py)
        return await self._retry(f"writer lock of stream {stream!r}",
                                 lambda: self.inner.lock(stream, timeout_s, holder))

    async def claim_runner(self, stream: str, runner: str) -> str | None:
        return await self._retry(f"policy runner claim of stream {stream!r}",
                                 lambda: self.inner.claim_runner(stream, runner))

    async def claim_offloader(self, stream: str, offloader: str) -> str | None:
        return await self._retry(f"offloader claim of stream {stream!r}",
                                 lambda: self.inner.claim_offloader(stream, offloader))

    async def release_offloader(self, stream: str, offloader: str) -> None:
        await self._retry(f"offloader release of stream {stream!r}",
                          lambda: self.inner.release_offloader(stream, offloader))

    async def tier_status(self, stream: str) -> dict[str, Any] | None:
        return await self._retry(f"tier status of stream {stream!r}", lambda: self.inner.tier_status(stream))

    async def store_tier_status(self, stream: str, status: dict[str, Any]) -> None:
        await self._retry(f"tier status of stream {stream!r}", lambda: self.inner.store_tier_status(stream, status))

    async def namespace_tier(self) -> TierPolicy | None:
        return await self._retry("the namespace's tier policy", self.inner.namespace_tier)

    async def set_namespace_tier(self, policy: TierPolicy) -> None:
        await self._retry("the namespace's tier policy", lambda: self.inner.set_namespace_tier(policy))

    async def commit(self, stream: str, based_on: SegmentList, change: SegmentChange) -> SegmentList:
        """One compare-and-set; after a lost answer, read back before trying again."""
        return (await self.commit_many([(stream, based_on, change)]))[0]

    async def commit_many(self, commits: Sequence[tuple[str, SegmentList, SegmentChange]]) -> list[SegmentList]:
        """One compare-and-set over several streams; after a lost answer, read every list back:
        all unchanged, try again; all changed and holding their change, done (they land
        together); anything else is a lost compare-and-set."""
        uncertain = False
        names = [stream for stream, _, _ in commits]

        async def attempt() -> list[SegmentList]:
            nonlocal uncertain
            if uncertain:
                landed = []
                for stream, based_on, change in commits:
                    current = await self.inner.segments(stream)
                    if current.version == based_on.version:
                        break
                    sink = None
                    if change.sink is not None:
                        sink = await self.inner.sink_batch(stream, change.sink.sink_id)
                    if not change.landed_in(current, sink):
                        raise MetadataVersionError(f"the segment list of stream {stream!r} changed "
                                                   f"(version {based_on.version} -> {current.version})")
                    landed.append(current)
                if len(landed) == len(commits):
                    log.info("streams %s: a segment-list change whose answer was lost had landed", names)
                    return landed
                if landed:
                    raise MetadataVersionError(f"the segment lists of streams {names} changed meanwhile")
            try:
                return await self.inner.commit_many(commits)
            except MetadataError as exc:
                uncertain = exc.retryable  # a lost CAS is final; a lost answer needs a look back
                raise

        what = f"stream {names[0]!r}" if len(names) == 1 else f"streams {names}"
        return await self._retry(f"segment-list change of {what}", attempt)
