"""The namespace: named streams, their writers and readers, truncation, retention, subscriptions.

    async with Namespace(zk="127.0.0.1:2181", name="default") as ns:
        await ns.create_stream("orders", ensemble=3, write_quorum=2, ack_quorum=2)
        async with ns.open_writer("orders") as writer:
            offset = await writer.write(b"value", key=b"k")
        async with ns.open_reader("orders", start="earliest") as reader:
            async for record in reader: ...
        await ns.truncate("orders", before=offset)

A namespace is a ZooKeeper subtree (`/dlog/<name>`); its streams' ledgers live in the BookKeeper
cluster under `/bookkeeper` of the same ZooKeeper. Its writers, readers and descriptions of one
stream get what they need of it in a `StreamContext` (`context_of`), and never the namespace.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import random
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import replace
from functools import partial
from typing import Any, Generic, TypeVar

import pyarrow as pa

import dlog.describe as describe  # (not `from dlog import`: the package imports this module)
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import (
    ConfigError,
    DlogError,
    MetadataContentionError,
    MetadataPermissionError,
    MetadataVersionError,
    NoSuchLedgerError,
    QuotaExceededError,
    known,
)
from bookkeeper.meta import layout
from bookkeeper.retry import Backoff, retry
from bookkeeper.runtime import tune_garbage_collector
from bookkeeper.security.quota import Quota
from bookkeeper.security.settings import (
    SecuritySettings,
    load_client_settings,
    load_cluster_table,
    seal_new_password,
    unseal_password,
)
from dlog.context import StreamContext
from dlog.core import backlog, changes, tiering
from dlog.core.dedup import DedupTable, encode_stored, native_producer
from dlog.core.errors import StreamBusyError, SubscriptionEvictedError, WriterLockedError
from dlog.iceberg import IcebergTarget, SyncResult, sync_table
from dlog.names import check_stream_name, check_subscription_name, stream_node_name
from dlog.offsets import Offset
from dlog.producers import rebuild_producers
from dlog.reader import StreamReader
from dlog.segments.codec import (
    arrow_conversions_warm,
    default_schema,
    schema_from_text,
    schema_to_text,
    warm_arrow_conversions,
)
from dlog.segments.metadata import Segment, SegmentChange, SegmentList, StreamConfig, TierPolicy
from dlog.segments.port import RetryingSegmentStore, SegmentStore, StreamExistsError
from dlog.segments.schemas import check_mode, evolve, first_schema
from dlog.segments.tier import TierOptions, TierStore, check_tier_uri, file_schema, stream_table_uri
from dlog.snapshot import READ_HANDLES_MAX, SegmentReads
from dlog.writer import StreamWriter

log = logging.getLogger(__name__)
T = TypeVar("T")
ALTERABLE_SETTINGS = ("roll_bytes", "roll_age_ms", "roll_records", "retention_age_ms", "retention_bytes",
                      "retention_keeps_unconsumed", "ensemble", "write_quorum", "ack_quorum", "tier",
                      "iceberg_catalog", "iceberg_warehouse", "backlog_bytes", "backlog_age_ms", "backlog_policy",
                      "subscription_expiry_ms", "schema", "schema_compatibility", "compaction",
                      "min_compaction_lag_ms", "delete_retention_ms")
# a truncation or retention run re-plans from a fresh list when a concurrent change won the
# compare-and-set (a writer rolling, a sink committing); this many tries, quickly
CHANGE_RETRY = Backoff(attempts_max=20, delay_s_first=0.005, delay_s_max=0.2, jitter_fraction=1.0)


class Namespace:
    def __init__(self, zk: str | None = None, name: str = "default", *, root: str = "/dlog",
                 bookkeeper_root: str = layout.DEFAULT_ROOT, zk_timeout_s: float = 10.0,
                 zk_session_timeout_s: float = 10.0,
                 read_handles_max: int = READ_HANDLES_MAX, security: SecuritySettings | None = None,
                 config: str | None = None, clock: Clock = SYSTEM_CLOCK, store: SegmentStore | None = None,
                 client: Any = None, rng: Callable[[], float] = random.random, create: bool = True,
                 tier_options: TierOptions | None = None, tune_gc: bool = True, **client_options: Any) -> None:
        """`security` (TLS, token, ZooKeeper credentials) defaults to client.toml named by `config`
        or $DLOG_CONFIG (and $DLOG_TOKEN); `zk` defaults to its [cluster] zk, else 127.0.0.1:2181.
        `create=False` creates nothing in ZooKeeper at start (neither the namespace's node nor the
        cluster's layout): what commands that only look, or use existing streams, pass.
        `store` and `client` replace the ZooKeeper segment store and the BookKeeper client (the
        stream simulator passes its own, and its own `rng` for the retries' jitter); otherwise
        both are made from `zk` at start(). `tier_options` say how to reach an S3 tier beyond its
        URI (default: the environment, as pyarrow and boto3 read it). `tune_gc`: at start, set up
        Python's cycle collector for many records and futures in flight, once per process
        (`bookkeeper.runtime.tune_garbage_collector`: the process's start-up objects frozen, young
        objects collected every 50,000 allocations instead of 700); False leaves it as it is."""
        self.security = security if security is not None else load_client_settings(config)
        self.zk_hosts = zk or str(load_cluster_table(config).get("zk") or "127.0.0.1:2181")
        self.name = check_subscription_name(name)
        self.namespace_root = root
        self.root = f"{root}/{self.name}"
        self.bookkeeper_root = bookkeeper_root
        self.zk_timeout_s = zk_timeout_s
        self.zk_session_timeout_s = zk_session_timeout_s  # its writer locks end this long after a crash
        self.client_options = client_options
        self.create = create
        self.tune_gc = tune_gc
        self.clock = clock
        self.zk: Any = None  # the AsyncZooKeeper, when the stores are ZooKeeper's
        self.client: Any = client  # bookkeeper.client.BookKeeper (or the simulator's ledgers)
        self.rng = rng  # the jitter of this namespace's retries
        self.store: Any = RetryingSegmentStore(store, clock=clock, rng=rng) if store is not None else None
        self._owns_client = client is None
        self._schemas: dict[str, pa.Schema] = {}
        # read handles of segment ledgers and entry headers: the one bounded cache (dlog.snapshot)
        self.reads = SegmentReads(client, handles_max=read_handles_max, tier=TierStore(tier_options))

    async def start(self) -> Namespace:
        if self.tune_gc:
            tune_garbage_collector()
        if self.store is not None:
            return self
        from bookkeeper.client import BookKeeper
        from bookkeeper.meta.acl import zk_options
        from bookkeeper.meta.zk import AsyncZooKeeper
        from bookkeeper.meta.zkstore import ZooKeeperMetadataStore
        from dlog.segments.store import ZooKeeperSegmentStore

        self.zk = AsyncZooKeeper(self.zk_hosts, timeout_s=self.zk_timeout_s,
                                 session_timeout_s=self.zk_session_timeout_s,
                                 **zk_options(self.security, self.bookkeeper_root, self.name,
                                              self.namespace_root))
        await self.zk.start()
        metadata = ZooKeeperMetadataStore(self.zk, self.bookkeeper_root)
        try:
            if self.create:
                await metadata.ensure_layout()
            self.client = await BookKeeper(store=metadata, security=self.security,
                                           **self.client_options).start()
            self.reads.client = self.client
        except BaseException:
            await self.zk.close()
            raise
        self.store = RetryingSegmentStore(ZooKeeperSegmentStore(self.zk, self.root, self.clock), clock=self.clock,
                                          rng=self.rng)
        try:
            await self._learn_role_identities()
            if self.create:
                await self.zk.ensure_path(f"{self.root}/streams")
            else:  # a namespace closed to this client says so now, as when it is created
                await self.store.list_streams()
        except MetadataPermissionError as exc:
            await self.close()
            raise MetadataPermissionError(
                f"namespace {self.name!r} is not open to this client's ZooKeeper identity "
                f"({self.security.zk_user or 'none: no client.toml given'}): an admin creates it and its "
                f"credentials with "
                f"`dlog token create --namespace {self.name} ...`") from exc
        return self

    async def _learn_role_identities(self) -> None:
        """With ZooKeeper ACLs, the namespace node names its role identities (written by an admin):
        the nodes this client creates give each role its rights (bookkeeper/meta/acl.py)."""
        policy = self.zk.acl_policy
        if policy is None:
            return
        from bookkeeper.meta.acl import parse_namespace_node

        found = await self.zk.get_or_none(self.root)
        if found is not None:
            policy.learn_namespace(self.name, parse_namespace_node(found[0]))

    def password_of(self, config: StreamConfig) -> bytes:
        """The ledger password of a stream's segments (unsealed with the namespace's credentials)."""
        return unseal_password(config.password, self.security.seal_key(self.name)).encode()

    def context_of(self, config: StreamConfig) -> StreamContext:
        """What a writer, a reader or a description of this stream needs of the namespace."""
        return StreamContext(
            namespace=self.name, config=config, store=self.store, client=self.client, password=self.password_of(config),
            schema=self.schema_of(config), clock=self.clock, reads=self.reads, delete_ledger=self.delete_ledger_quietly,
            apply_retention=partial(self.apply_retention, config.name))

    async def close(self) -> None:
        if self.client is not None and self._owns_client:
            await self.client.close()
        if self.zk is not None:
            await self.zk.close()

    async def __aenter__(self) -> Namespace:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ streams

    async def create_stream(self, name: str, *, ensemble: int = 3, write_quorum: int = 2,
                            ack_quorum: int = 2, roll_bytes: int | None = None,
                            roll_age_ms: int | None = None, roll_records: int = 0,
                            retention_age_ms: int = 0, retention_bytes: int = 0,
                            schema: pa.Schema | str | None = None, exist_ok: bool = False,
                            tier: TierPolicy | None = None, backlog_bytes: int = 0, backlog_age_ms: int = 0,
                            backlog_policy: str = "hold", subscription_expiry_ms: int = 0,
                            schema_compatibility: str = "BACKWARD", **compaction: Any) -> StreamConfig:
        """Create a stream; with `exist_ok` an existing one is left as it is and its config returned.
        `tier`: its own tier settings (what it leaves None, the namespace's default gives). The
        backlog limits and subscription expiry: `dlog.core.backlog`.
        `schema`: a typed stream's schema (a pyarrow.Schema or the spec text, `dlog.segments.schemas`),
        its version 1, its fields numbered with ids; `schema_compatibility`: what its later
        versions must keep (BACKWARD, FORWARD, FULL or NONE).
        `compaction`: key compaction's settings (`compaction`, `min_compaction_lag_ms`,
        `delete_retention_ms`: `StreamConfig`'s)."""
        check_stream_name(name)
        options: dict[str, Any] = {"schema_compatibility": check_mode(schema_compatibility)}
        if tier is not None:
            options["tier"] = checked_tier(tier)
        if roll_bytes is not None:
            options["roll_bytes"] = roll_bytes
        if roll_age_ms is not None:
            options["roll_age_ms"] = roll_age_ms
        unknown = sorted(set(compaction) - {"compaction", "min_compaction_lag_ms", "delete_retention_ms"})
        if unknown:
            raise ConfigError(f"create_stream() got unknown settings {', '.join(unknown)}")
        options.update({key: value for key, value in compaction.items() if value is not None})
        await self._check_stream_quota(name)
        config = StreamConfig(name, ensemble, write_quorum, ack_quorum, roll_records=roll_records,
                              retention_age_ms=retention_age_ms, retention_bytes=retention_bytes,
                              schema=schema_to_text(first_schema(schema)) if schema is not None else "",
                              password=seal_new_password(self.security.seal_key(self.name))[0],
                              created_ms=self.clock.wall_ms(), **options, backlog_bytes=backlog_bytes,
                              backlog_age_ms=backlog_age_ms, backlog_policy=backlog_policy,
                              subscription_expiry_ms=subscription_expiry_ms)
        try:
            await self.store.create_stream(config)
        except StreamExistsError:
            if not exist_ok:
                raise
            return await self.store.config(name)
        return config

    async def _check_stream_quota(self, name: str) -> None:
        if self.zk is None:  # stores other than ZooKeeper's hold no quotas
            return
        found = await self.zk.get_or_none(layout.quota_path(self.bookkeeper_root, self.name))
        if found is None:
            return
        quota = Quota.from_bytes(found[0])
        if quota.streams_max <= 0:
            return
        streams = await self.store.list_streams()
        if len(streams) >= quota.streams_max and name not in streams:
            raise QuotaExceededError(f"namespace {self.name!r} has {len(streams)} streams: its quota "
                                     f"streams_max is {quota.streams_max} (dlog quota set)")

    async def config(self, name: str) -> StreamConfig:
        return await self.store.config(name)

    def schema_of(self, config: StreamConfig) -> pa.Schema:
        if not config.schema:
            return default_schema()
        schema = self._schemas.get(config.schema)
        if schema is None:
            schema = self._schemas[config.schema] = schema_from_text(config.schema)
        return schema

    async def list_streams(self) -> list[str]:
        return await self.store.list_streams()

    async def delete_stream(self, name: str) -> list[int]:
        """Delete every segment's ledger and tier file, then the stream's metadata; returns the
        ledgers deleted. Only a namespace admin may; its config is written first, a write nobody
        else may make, so a principal ZooKeeper refuses is refused before anything is touched."""
        self.security.require_role(self.name, "admin", f"deleting stream {name!r}")
        config = await self.store.config(name)
        await self.store.update_config(config)
        listing = await self.store.segments(name)
        deleted = []
        for segment in listing.segments:
            if segment.on_bookies and await self.delete_ledger_quietly(segment.ledger_id):
                deleted.append(segment.ledger_id)
        await self.sync_iceberg(name, config=config, listing=SegmentList((), listing.version, listing.max_sequence))
        await self._delete_tier_files(listing.segments)
        policy = await self.tier_policy(name, config)
        if policy.enabled:  # and whatever an attempt left that no segment names any more
            table = stream_table_uri(policy.uri or "", self.name, name)
            for uri in await self.reads.blocking(self.reads.tier.list_files, table):
                await self.reads.blocking(self.reads.tier.delete, uri)
        await self.store.delete_stream_metadata(name)
        return deleted

    async def _delete_tier_files(self, segments: Iterable[Segment]) -> None:
        for segment in segments:
            for uri in tiering.tier_files(segment):
                await self.reads.blocking(self.reads.tier.delete, uri)
                self.reads.forget_tier(uri)

    # ------------------------------------------------------------------ tiered storage

    async def tier_policy(self, name: str, config: StreamConfig | None = None) -> TierPolicy:
        """The stream's effective tier policy: its own settings over the namespace's default."""
        config = config or await self.store.config(name)
        return tiering.effective_policy(config, await self.store.namespace_tier())

    async def namespace_tier(self) -> TierPolicy | None:
        return await self.store.namespace_tier()

    async def set_namespace_tier(self, policy: TierPolicy) -> TierPolicy:
        """Set the namespace's default tier policy (a namespace admin's change)."""
        self.security.require_role(self.name, "admin", f"setting the default tier of namespace {self.name!r}")
        await self.store.set_namespace_tier(checked_tier(policy))
        return policy

    def iceberg_target(self, config: StreamConfig) -> IcebergTarget | None:
        """The Iceberg table a stream's tier files are registered in (None: not registered)."""
        if not config.iceberg_catalog:
            return None
        options = self.reads.tier.options
        io_properties = {key: value for key, value in (
            ("s3.endpoint", options.s3_endpoint), ("s3.region", options.s3_region),
            ("s3.access-key-id", options.s3_access_key), ("s3.secret-access-key", options.s3_secret_key))
            if value}
        return IcebergTarget(config.iceberg_catalog, config.iceberg_warehouse, self.name,
                             stream_node_name(config.name), io_properties)

    async def register_iceberg(self, name: str, catalog: str | None = None,
                               warehouse: str | None = None) -> SyncResult:
        """Register the stream's tier files in an Iceberg table (`<namespace>.<stream>` on a SQL
        catalog, SQLite by default: beside a local tier, `<tier>/_iceberg/iceberg.db`), kept in
        step by offloads and retention from then on; returns the first sync's result."""
        config = await self.store.config(name)
        policy = await self.tier_policy(name, config)
        if not policy.enabled:
            raise ConfigError(f"stream {name!r} has no tier: set one first (dlog tier set {name} --uri URI)")
        base = f"{policy.uri}/_iceberg"
        if catalog is None:
            if not base.startswith("file://"):
                raise ConfigError(f"the tier of stream {name!r} is not local: name the catalog (a SQLAlchemy URL, "
                                  "e.g. sqlite:////var/lib/dlog/iceberg.db)")
            os.makedirs(base.removeprefix("file://"), exist_ok=True)
            catalog = f"sqlite:///{base.removeprefix('file://')}/iceberg.db"
        config = await self.alter_stream(name, iceberg_catalog=catalog,
                                         iceberg_warehouse=warehouse or f"{base}/warehouse")
        result = await self.sync_iceberg(name, config=config)
        return known(result, "a registered stream syncs")

    async def sync_iceberg(self, name: str, *, config: StreamConfig | None = None,
                           listing: SegmentList | None = None) -> SyncResult | None:
        """Make the stream's Iceberg table (if it has one) hold exactly its live tier files."""
        config = config or await self.store.config(name)
        target = self.iceberg_target(config)
        if target is None:
            return None
        listing = listing or await self.store.segments(name)
        files = [s.tier.uri for s in listing.segments if s.tier is not None and not s.is_truncated]
        schema = file_schema(self.schema_of(config), True) if not files else None
        return await self.reads.blocking(sync_table, target, files, schema)

    async def set_tier(self, name: str, policy: TierPolicy) -> StreamConfig:
        """Change a stream's own tier settings: the fields `policy` sets replace the stream's."""
        config = await self.store.config(name)
        return await self.alter_stream(name, tier=checked_tier(policy).over(config.tier))

    async def delete_ledger_quietly(self, ledger_id: int) -> bool:
        try:
            await self.client.delete_ledger(ledger_id)
            self.reads.forget(ledger_id)
            return True
        except NoSuchLedgerError:
            return False

    async def stream_info(self, name: str) -> dict[str, Any]:
        """Config, segments (records, bytes, damage), totals and subscriptions with their lag; see
        dlog/describe.py for what is exact and what is estimated."""
        context = self.context_of(await self.store.config(name))
        listing = await self.store.segments(name)
        segments = await describe.segment_summaries(context, listing.segments)
        alive = describe.live(segments)
        offsets = await self.subscriptions(name)
        subscriptions = [{"name": subscription, **await describe.lag_of(context, listing.segments, segments, offset)}
                         for subscription, offset in sorted(offsets.items())]
        first_position, next_position = await self._position_bounds(context)
        return {"name": name, "config": context.config.public_json(), "segments": segments,
                "records": sum(s["records"] or 0 for s in alive), "bytes": sum(s["bytes"] or 0 for s in alive),
                "first_offset": describe.first_offset(segments),
                "last_offset": await describe.last_offset(context, listing.segments, segments),
                "first_position": first_position, "next_position": next_position,
                "damaged_segments": [s["sequence"] for s in segments if s["damaged"]],
                "subscriptions": subscriptions}

    async def position_bounds(self, name: str) -> tuple[int | None, int | None]:
        """(the stream position of the first readable record, the position the next record written
        gets): Kafka's log start and log end offsets, equal when nothing is readable; (None, None)
        for a stream written before positions existed, until a writer opens it (V4)."""
        return await self._position_bounds(self.context_of(await self.store.config(name)))

    async def _position_bounds(self, context: StreamContext) -> tuple[int | None, int | None]:
        try:
            view = await context.reads.view(context.store, context.config.name, context.password)
            return await context.reads.position_bounds(view, context.password)
        except DlogError:  # a damaged segment, unreachable bookies: `segments` says which; bounds unknown
            return None, None

    async def subscription_lag(self, name: str, subscription: str | None = None) -> dict[str, dict[str, Any]]:
        """Per subscription (or just `subscription`): its committed offset, and the records and bytes
        after it (`lag_records`, `lag_bytes`, exact for records; see dlog/describe.py)."""
        context = self.context_of(await self.store.config(name))
        offsets = await self.subscriptions(name)
        if subscription is not None:
            if subscription not in offsets:
                raise ConfigError(f"stream {name!r} has no subscription {subscription!r} "
                                  f"(it has: {', '.join(sorted(offsets)) or 'none'})")
            offsets = {subscription: offsets[subscription]}
        listing = await self.store.segments(name)
        segments = await describe.segment_summaries(context, listing.segments)
        return {key: await describe.lag_of(context, listing.segments, segments, offset)
                for key, offset in sorted(offsets.items())}

    # ------------------------------------------------------------------ writers and readers

    def open_writer(self, name: str, **options: Any) -> _Opening[StreamWriter]:
        """`async with ns.open_writer(name) as writer:` (or `writer = await ns.open_writer(name)`)."""

        async def open_it() -> StreamWriter:
            if self.zk is not None and not arrow_conversions_warm():
                # pyarrow's first conversion imports pandas: in a thread, once per process, before
                # the first writer, not at its first entry on the loop (warm_arrow_conversions; a
                # simulated namespace has no ZooKeeper and no threads)
                await asyncio.to_thread(warm_arrow_conversions)
            config = await self.store.config(name)
            if not options.get("takeover") and options.get("lock_holder") is None:
                await self._refuse_if_served(name)
            writer = await StreamWriter(self.context_of(config), **options).open()
            if writer.producer_id is not None:
                try:
                    await self._restore_producers(name, writer)
                except BaseException:
                    writer.abort()
                    raise
            return writer

        return _Opening(open_it)

    async def _restore_producers(self, name: str, writer: StreamWriter) -> None:
        """A named producer's writer gets the stream's producer table before its first write: the
        stored snapshot and the producer sections of the entries after it (the previous writer's
        in-progress segment is recovered by now), stored again at the stream's end so the next
        writer replays only what this one writes (docs/design.md, "Idempotent writers")."""
        segment = writer.segment
        end = None if segment is None else segment.first_position
        if end is None:
            raise DlogError(f"stream {name!r} has no record positions: a named producer needs them")
        table, version = await self._rebuilt_producers(name, end)
        await self.store.store_dedup_snapshot(name, encode_stored(end, table.snapshot()), version)
        writer.restore_producers(table)

    async def _rebuilt_producers(self, name: str, end: int) -> tuple[DedupTable, int | None]:
        table, version, _, _ = await rebuild_producers(
            self.store, lambda start: self.open_reader(name, start, follow=False, skip_truncated=True), name, end,
            self.clock.wall_ms())
        return table, version

    async def producer_table(self, name: str, listing: SegmentList | None = None) -> tuple[DedupTable, int | None, int]:
        """The stream's idempotent producers as its segments hold them: the stored snapshot and the
        producer sections after it, up to the end of the last completed segment (an in-progress
        segment's records are its writer's, still to be sealed); also the dedup node's version
        (None: there is none) and that end position. `listing`: the segment list just read."""
        listing = listing if listing is not None else await self.store.segments(name)
        live = listing.in_progress
        if live is not None:
            end = live.first_position
        elif listing.segments:
            last = listing.segments[-1]
            end = None if last.first_position is None else last.first_position + last.records
        else:
            end = 0
        if end is None:  # a stream from before positions: no named producer ever wrote it
            return DedupTable(), None, 0
        table, version = await self._rebuilt_producers(name, end)
        return table, version, end

    async def last_sequence(self, name: str, producer_id: str) -> int | None:
        """The last sequence of named producer `producer_id` that the stream holds (Pulsar's
        getLastSequenceId, without opening a writer), or None when it holds none (or it expired)."""
        table, _, _ = await self.producer_table(name)
        return table.last_sequence(native_producer(producer_id))

    async def _refuse_if_served(self, name: str) -> None:
        """A stream a serving-tier server owns (`dlog serve`) is written through it: a native
        writer gets one clear error naming the server at once, rather than waiting for the lock."""
        lock_holder = getattr(self.store, "lock_holder", None)  # the ZooKeeper store's
        holder = await lock_holder(name) if lock_holder is not None else None
        if holder and "server" in holder:
            raise WriterLockedError(
                f"stream {name!r} is served by dlog server {holder['server']} (Kafka clients at "
                f"{holder.get('kafka', '?')}): write to it there, or open with takeover=True to fence it "
                "and take over (the server then stops serving it)")

    def open_reader(self, name: str, start: str | Offset | int | datetime.datetime = "earliest",
                    **options: Any) -> _Opening[StreamReader]:
        """`async with ns.open_reader(name, start) as reader:` (or `await ns.open_reader(...)`).
        `subscription=NAME` starts at its committed offset (`start` when it has none); an evicted
        one fails (SubscriptionEvictedError) unless `skip_evicted=True`, which starts at `start`."""

        async def open_it() -> StreamReader:
            begin = start
            if options.get("subscription") is not None:  # start at its committed offset, if it has one
                subscription = options.pop("subscription")
                at = await self.subscription_start(name, subscription, skip_evicted=options.pop("skip_evicted", False))
                begin = at if at is not None else start
            options.pop("subscription", None)
            options.pop("skip_evicted", None)
            return await StreamReader(self.context_of(await self.store.config(name)), begin, **options).open()

        return _Opening(open_it)

    async def open_segment_ledger(self, config: StreamConfig, segment: Segment) -> Any:
        """A read handle of a segment's ledger (cached and shared: reads of it may run at once).
        For an in-progress segment its LAC is refreshed; for a completed one it may read up to the
        segment's last entry, which the committed segment list vouches for even before the ledger's
        close lands."""
        return await self.reads.segment_handle(segment, self.password_of(config))

    # ------------------------------------------------------------------ truncation and retention

    async def truncate(self, name: str, before: Offset | str) -> list[Segment]:
        """Remove every record strictly below `before` (L5): whole segments below it are marked
        truncated then deleted; a segment it falls inside records the new minimum active offset
        (its writer, if live, keeps writing: its later updates keep that point)."""
        offset = Offset.parse(before) if isinstance(before, str) else before
        self.security.require_role(self.name, "admin", f"truncating stream {name!r}")

        async def attempt() -> list[Segment]:
            listing = await self.store.segments(name)
            target = listing.by_ledger(offset.ledger_id)
            end = -1
            if target is not None and not target.is_truncated:
                end = target.last_entry
                if target.is_in_progress:
                    end = (await self.open_segment_ledger(await self.store.config(name), target)).last_add_confirmed
            change, marked = changes.truncation_change(listing, offset, end, name)
            if change.empty:
                return []
            await self._commit_planned(name, listing, change)
            return marked

        marked = await self.replanned(name, "truncation", attempt)
        await self._remove_truncated(name, marked)
        return marked

    async def _commit_planned(self, name: str, listing: SegmentList, change: SegmentChange) -> SegmentList:
        """Commit a change planned from `listing`; a lost compare-and-set means plan again."""
        try:
            return await self.store.commit(name, listing, change)
        except MetadataVersionError as exc:
            raise MetadataContentionError(f"the segment list of stream {name!r} changed meanwhile") from exc

    async def replanned(self, name: str, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` (which plans a segment-list change from a fresh list and commits it)
        again while another change wins the compare-and-set (MetadataContentionError)."""
        try:
            return await retry(attempt, CHANGE_RETRY, what=f"{what} of stream {name!r}", quiet=True,
                               clock=self.clock, rng=self.rng)
        except MetadataContentionError as exc:
            raise StreamBusyError(f"stream {name!r} kept changing; {what} gave up after "
                                  f"{CHANGE_RETRY.attempts_max} tries") from exc

    async def _remove_truncated(self, name: str, segments: list[Segment]) -> None:
        """Second phase: delete the ledgers of segments just marked truncated. Their nodes stay as
        tombstones (so an offset in them reads as truncated, not unknown); only the oldest beyond
        changes.TOMBSTONES_MAX are removed."""
        for segment in segments:
            if segment.on_bookies:
                await self.delete_ledger_quietly(segment.ledger_id)
        compaction_ledgers = {s.compacted.ledger_id for s in segments if s.compacted is not None}
        if compaction_ledgers:  # a compaction ledger goes with the last live segment it holds records of
            listing = await self.store.segments(name)
            for ledger_id in sorted(compaction_ledgers - {s.compacted.ledger_id for s in listing.live
                                                          if s.compacted is not None}):
                await self.delete_ledger_quietly(ledger_id)
        if any(segment.tier is not None for segment in segments):
            try:  # the table first: it must never list a file that is gone
                await self.sync_iceberg(name)
            except DlogError as exc:
                log.warning("stream %s: its Iceberg table could not drop the removed files: %s", name, exc)
        await self._delete_tier_files(segments)

        async def trim() -> None:
            listing = await self.store.segments(name)
            change = changes.tombstone_trim(listing)
            if change is not None:
                await self._commit_planned(name, listing, change)

        await self.replanned(name, "tombstone trimming", trim)

    async def set_retention(self, name: str, *, age_ms: int | None = None, size_bytes: int | None = None,
                            keep_unconsumed: bool | None = None) -> StreamConfig:
        self.security.require_role(self.name, "admin", f"setting the retention of stream {name!r}")
        config = await self.store.config(name)
        changes_: dict[str, Any] = {}
        if age_ms is not None:
            changes_["retention_age_ms"] = age_ms
        if size_bytes is not None:
            changes_["retention_bytes"] = size_bytes
        if keep_unconsumed is not None:
            changes_["retention_keeps_unconsumed"] = keep_unconsumed
        updated = StreamConfig(**{**_fields(config), **changes_})
        await self.store.update_config(updated)
        return updated

    async def retention_plan(self, name: str, now_ms: int | None = None) -> list[Segment]:
        """Completed segments the policy removes now (see `dlog.core.changes.retention_plan`)."""
        plan, _, _ = await self._retention_plan(name, now_ms)
        return plan

    async def _retention_plan(self, name: str, now_ms: int | None) -> tuple[list[Segment], SegmentList, StreamConfig]:
        config = await self.store.config(name)
        policy = await self.tier_policy(name, config)
        listing = await self.store.segments(name)
        stored = await self.store.subscriptions(name) if backlog.keeps_unconsumed(config) else {}
        now_ms = self.clock.wall_ms() if now_ms is None else now_ms
        leaving = backlog.leaving(listing, config, stored, now_ms)  # evicted or expired by this run
        subscriptions = backlog.retention_holders(config, stored, leaving)  # never the evicted
        return tiering.tiered_retention_plan(listing, config, policy, subscriptions, now_ms), listing, config

    async def apply_retention(self, name: str, *, dry_run: bool = False,
                              now_ms: int | None = None) -> list[Segment]:
        """Remove what the retention policy says (L5); safe beside a live writer (L7). Then evict and
        expire subscriptions as the stream's backlog limits and expiry say (the plan already kept
        nothing for them): `enforce_subscription_limits`."""
        if not dry_run:
            self.security.require_role(self.name, "admin", f"applying the retention of stream {name!r}")

        async def attempt() -> tuple[list[Segment], StreamConfig]:
            plan, listing, config = await self._retention_plan(name, now_ms)
            if dry_run or not plan:
                return plan, config
            await self._commit_planned(name, listing, changes.retention_change(plan))
            return plan, config

        plan, config = await self.replanned(name, "retention", attempt)
        if plan and not dry_run:
            await self._remove_truncated(name, plan)
        if not dry_run and (backlog.has_limits(config) or config.subscription_expiry_ms):
            await self.enforce_subscription_limits(name, now_ms, config)
        return plan

    # ------------------------------------------------------------------ subscriptions

    async def commit_subscription(self, name: str, subscription: str, offset: Offset | str) -> None:
        """Store a subscriber's committed offset (the next record it will read), with the time (its
        last activity, for expiry); a commit clears an eviction mark."""
        offset = Offset.parse(offset) if isinstance(offset, str) else offset
        self.security.require_role(self.name, "consume", f"committing subscription {subscription!r}")
        await self.store.commit_subscription(name, check_subscription_name(subscription),
                                             backlog.committed(offset.to_json(), self.clock.wall_ms()))

    async def subscriptions(self, name: str) -> dict[str, Offset]:
        return {key: Offset.from_json(backlog.offset_of(value))
                for key, value in (await self.store.subscriptions(name)).items()}

    async def subscription_start(self, name: str, subscription: str, *, skip_evicted: bool = False) -> Offset | None:
        """Where a reader of `subscription` starts: its committed offset (None: it has none). An
        evicted subscription raises SubscriptionEvictedError, unless `skip_evicted`: then None (the
        caller starts at the earliest record kept); its next commit clears the mark."""
        stored = (await self.store.subscriptions(name)).get(check_subscription_name(subscription))
        if stored is None:
            return None
        if backlog.is_evicted(stored):
            if skip_evicted:
                return None
            raise SubscriptionEvictedError(
                f"subscription {subscription!r} of stream {name!r} was evicted at {stored['evicted_ms']} ms: its "
                "backlog passed the stream's limit (backlog policy evict), so retention may have removed records "
                "it had not read; read with skip_evicted (dlog read --skip-evicted) to go on from the earliest "
                "record kept, or commit an offset")
        return Offset.from_json(backlog.offset_of(stored))

    async def backlogs(self, name: str, now_ms: int | None = None) -> list[backlog.Backlog]:
        """Each subscription's backlog against the stream's limits, from the segment list (for the
        status page, the metrics, `dlog subscription list`)."""
        config = await self.store.config(name)
        listing = await self.store.segments(name)
        stored = await self.store.subscriptions(name)
        return backlog.backlogs(listing, config, stored, self.clock.wall_ms() if now_ms is None else now_ms)

    async def enforce_subscription_limits(self, name: str, now_ms: int | None = None,
                                          config: StreamConfig | None = None) -> dict[str, list[str]]:
        """What a retention run does to subscriptions (after it planned without them): mark evicted
        those over a backlog limit (evict policy), remove those inactive past the expiry. Each change
        is a compare-and-set on what was read: a subscription that commits meanwhile wins, and the
        next run looks again. Returns the names evicted and expired."""
        config = await self.store.config(name) if config is None else config
        done: dict[str, list[str]] = {"evicted": [], "expired": []}
        if not (backlog.has_limits(config) or config.subscription_expiry_ms):
            return done
        now_ms = self.clock.wall_ms() if now_ms is None else now_ms
        stored = await self.store.subscriptions(name)
        for subscription in backlog.expired(config, stored, now_ms):
            if await self.store.replace_subscription(name, subscription, stored[subscription], None):
                log.info("stream %s: subscription %r expired (no commit for over %d ms)", name, subscription,
                         config.subscription_expiry_ms)
                done["expired"].append(subscription)
        listing = await self.store.segments(name)
        found = backlog.backlogs(listing, config, stored, now_ms)
        for subscription in backlog.to_evict(config, found):
            if subscription in done["expired"]:
                continue
            if await self.store.replace_subscription(name, subscription, stored[subscription],
                                                     backlog.evicted(stored[subscription], now_ms)):
                log.warning("stream %s: subscription %r evicted: %s", name, subscription,
                            backlog.describe(next(b for b in found if b.subscription == subscription), config))
                done["evicted"].append(subscription)
        return done

    async def delete_subscription(self, name: str, subscription: str) -> None:
        self.security.require_role(self.name, "admin", f"deleting subscription {subscription!r}")
        await self.store.delete_subscription(name, subscription)

    # ------------------------------------------------------------------ settings

    async def alter_stream(self, name: str, **changes: Any) -> StreamConfig:
        """Change roll, retention and replication settings (ALTERABLE_SETTINGS). A writer takes new
        roll and replication settings when it next opens the stream (replication: for the segments
        it creates; existing ledgers keep theirs); retention applies its settings at its next run.
        `schema` (a pyarrow.Schema or spec text) adds the typed stream's next schema version when
        its compatibility mode allows it (ConfigError naming the field and the rule otherwise); a
        writer writes the new version from when it next opens the stream.
        The quorums are checked together: ensemble >= write quorum >= ack quorum >= 1."""
        if "tier" in changes:
            changes["tier"] = checked_tier(changes["tier"])
        if "schema_compatibility" in changes:
            changes["schema_compatibility"] = check_mode(changes["schema_compatibility"])
        unknown = sorted(set(changes) - set(ALTERABLE_SETTINGS))
        if unknown:
            raise ConfigError(f"cannot alter {', '.join(unknown)}: the settings that can change are "
                              f"{', '.join(ALTERABLE_SETTINGS)}")
        self.security.require_role(self.name, "admin", f"altering stream {name!r}")
        schema = changes.pop("schema", None)
        if schema is not None:
            return await self.replanned(name, "schema change", partial(self._change_schema, name, schema, changes))
        config = await self.store.config(name)
        updated = StreamConfig(**{**_fields(config), **changes})
        await self.store.update_config(updated)
        return updated

    async def _change_schema(self, name: str, schema: pa.Schema | str, changes: dict[str, Any]) -> StreamConfig:
        """The next schema version (checked under the new compatibility mode, if one is given) with
        the other changes, by compare-and-set on the config: two changes at once never lose a
        version (a version number names one schema forever: segments record it)."""
        config = await self.store.config(name)
        updated = evolve(StreamConfig(**{**_fields(config), **changes}), schema)
        try:
            await self.store.update_config(updated, based_on=config)
        except MetadataVersionError as exc:
            if await self.store.config(name) == updated:
                return updated  # it landed; only the answer was lost
            raise MetadataContentionError(f"the config of stream {name!r} changed meanwhile") from exc
        return updated


class _Opening(Generic[T]):
    """What open_writer/open_reader return: await it for the object, or use it directly in
    `async with`, which opens on entry and closes on exit."""

    def __init__(self, open_it: Callable[[], Awaitable[T]]) -> None:
        self._open_it = open_it
        self._opened: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._open_it().__await__()

    async def __aenter__(self) -> T:
        self._opened = await self._open_it()
        return self._opened

    async def __aexit__(self, *exc_info: object) -> None:
        if self._opened is not None:
            await self._opened.close()  # type: ignore[attr-defined]


def _fields(item: Any) -> dict[str, Any]:
    return {name: getattr(item, name) for name in item.__dataclass_fields__}


def checked_tier(policy: TierPolicy) -> TierPolicy:
    """A tier policy with its URI checked (ConfigError, one line, otherwise)."""
    if not isinstance(policy, TierPolicy):
        raise ConfigError(f"tier must be a dlog.segments.metadata.TierPolicy, got {type(policy).__name__}")
    if policy.uri:
        return replace(policy, uri=check_tier_uri(policy.uri))
    return policy
