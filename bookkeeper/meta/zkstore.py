"""The metadata store on ZooKeeper (layout in `bookkeeper/meta/layout.py` and docs/design.md).

Retryable failures (ConnectionLoss while a ZooKeeper leader is elected) are retried within
METADATA_RETRY's deadline, with care for writes whose answer was lost: a ledger node that exists
with our very bytes was created by our earlier attempt; a delete that finds nothing after such an
attempt is done. Compare-and-set writes (`write_ledger`) make one attempt: their callers re-read
and decide (the ledger handle's metadata writes, bookkeeper/client/ledger.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from bookkeeper.errors import (
    LedgerIdsExhaustedError,
    MetadataContentionError,
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataPermissionError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from bookkeeper.meta import layout
from bookkeeper.meta.acl import TOMBSTONE, directory_refusal, parse_bookie_ids, security_path, world_writable
from bookkeeper.meta.store import BookieInfo
from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.retry import Backoff, retry

log = logging.getLogger(__name__)
ID_COUNTER = "next"
ID_SQUATTED_RETRIES = 10
# a repaired counter starts this far past the highest existing ledger: ids handed out and deleted
# since may still have entries on bookies until their garbage collection, and are never reused
ID_REPAIR_MARGIN = 1_000_000
TRUSTED_DIRECTORIES_MAX = 1024
LEDGERS_PER_DIRECTORY = 10_000  # the ledger nodes of one directory of the split layout
# short jittered waits for contention on the id counter; the deadline also covers ConnectionLoss
ID_ALLOCATION_RETRY = Backoff(attempts_max=300, delay_s_first=0.002, delay_s_max=0.1,
                              multiplier=1.3, jitter_fraction=1.0, deadline_s=30.0)
METADATA_RETRY = Backoff(attempts_max=40, delay_s_first=0.05, delay_s_max=1.0, deadline_s=30.0)


class ZooKeeperMetadataStore:
    def __init__(self, zk: AsyncZooKeeper, root: str = layout.DEFAULT_ROOT, *, owns_client: bool = False,
                 trusted_registrations_only: bool | None = None) -> None:
        self.zk = zk
        self.root = root
        self._owns_client = owns_client
        self._trusted_directories: set[str] = set()
        # with ZooKeeper credentials, only ACL-protected registrations are used (S3)
        self.trusted_registrations_only = (zk.acl_policy is not None if trusted_registrations_only is None
                                           else trusted_registrations_only)

    @classmethod
    async def connect(cls, hosts: str, root: str = layout.DEFAULT_ROOT, **options: Any) -> ZooKeeperMetadataStore:
        zk = AsyncZooKeeper(hosts, **options)
        await zk.start()
        store = cls(zk, root, owns_client=True)
        await store.ensure_layout()
        return store

    async def ensure_layout(self) -> None:
        if self.zk.acl_policy is not None:
            # with ACLs the bookies create the cluster's nodes (they own registrations and
            # cookies); a client only learns what new ledger directories must look like
            found = await self.zk.get_or_none(security_path(self.root))
            if found is None:
                log.warning("%s does not exist yet: start a bookie first", security_path(self.root))
            else:
                self.zk.acl_policy.learn_bookies(parse_bookie_ids(found[0]))
            return
        for path in (layout.ledgers_path(self.root), layout.available_path(self.root),
                     layout.idgen_path(self.root), layout.cookies_path(self.root)):
            await self.zk.ensure_path(path)

    async def close(self) -> None:
        if self._owns_client:
            await self.zk.close()

    # ------------------------------------------------------------------ ledger ids

    def ledger_writers(self, namespace: str | None) -> list[str] | None:
        """None on an open cluster (this client creates its ledgers itself); with ACLs, the digest
        ids a new ledger of `namespace` gives write to: it is then created by a bookie
        (CREATE_LEDGER), as only the cluster's own identities create ledger nodes (acl.py)."""
        if self.zk.acl_policy is None:
            return None
        return self.zk.acl_policy.ledger_writers(namespace)

    async def _allocate_id(self) -> int:
        """Compare-and-set a counter: unique ids that increase in allocation order. Another
        client's allocation in between costs a retry with jittered back-off, or a crowd of writers
        opening at once keeps colliding (seen with 32 concurrent writers). An id whose allocation
        answer was lost is skipped, never handed out twice. A counter that holds no id (garbage, a
        negative number, or past the maximum) is repaired past every existing ledger, loudly."""
        path = self._counter_path

        async def attempt() -> int:
            found = await self.zk.get_or_none(path)
            if found is None:
                try:
                    await self.zk.create(path, b"2", makepath=True)
                    return 1
                except MetadataExistsError as exc:
                    raise MetadataContentionError("the id counter was created meanwhile") from exc
            data, version = found
            ledger_id = _counter_value(data)
            if ledger_id is None:
                await self._repair_counter(data, version)
                raise MetadataContentionError("the id counter was repaired")
            try:
                await self.zk.set(path, str(ledger_id + 1).encode(), version)
            except MetadataVersionError as exc:
                raise MetadataContentionError(f"id {ledger_id} was taken meanwhile") from exc
            return ledger_id

        return await retry(attempt, ID_ALLOCATION_RETRY, what="ledger id allocation", quiet=True)

    @property
    def _counter_path(self) -> str:
        return f"{layout.idgen_path(self.root)}/{ID_COUNTER}"

    async def _repair_counter(self, data: bytes, version: int) -> None:
        highest = await self.max_ledger_id()
        repaired = (highest or 0) + ID_REPAIR_MARGIN
        if repaired >= layout.LEDGER_ID_MAX:
            raise LedgerIdsExhaustedError(f"ledger ids are exhausted: ledger {highest} exists (63 bits)")
        log.error("the ledger id counter %s held %r, which is no ledger id: set to %d (the highest "
                  "existing ledger is %s, plus a margin for ids handed out and deleted since)",
                  self._counter_path, data[:40], repaired, highest)
        try:
            await self.zk.set(self._counter_path, str(repaired).encode(), version)
        except MetadataVersionError:
            pass  # someone else repaired or allocated meanwhile: read it again

    async def _move_counter(self, next_id: int) -> None:
        """Move the id counter up to `next_id` (never down)."""
        found = await self.zk.get_or_none(self._counter_path)
        if found is not None and (_counter_value(found[0]) or 0) < next_id:
            try:
                await self.zk.set(self._counter_path, str(next_id).encode(), found[1])
            except MetadataVersionError:
                pass  # moved meanwhile: the next allocation looks again

    async def _skip_squatters(self, ledger_id: int) -> None:
        """Metadata for `ledger_id` existed before its allocation: someone created nodes ahead of the
        counter. Move the counter past every such node of its directory at once (one listing), so
        a row of squatted ids costs one retry, not one per id."""
        directory = layout.ledger_path(self.root, ledger_id).rsplit("/", 1)[0]
        base = ledger_id - ledger_id % LEDGERS_PER_DIRECTORY
        ahead = [base + int(name[1:]) for name in await self.zk.children(directory)
                 if name.startswith("L") and len(name) == 5 and name[1:].isdigit()]
        highest = max([ledger_id, *ahead])
        log.warning("ledger id %d already had metadata nobody allocated (so do %d ids up to %d): skipped",
                    ledger_id, sum(1 for found in ahead if found > ledger_id), highest)
        await self._move_counter(highest + 1)

    async def _directory_refusal(self, ledger_id: int) -> tuple[str, str, int] | None:
        """(directory, why, first id past it) when a directory on the way to a new ledger must not
        hold it; None when all may. With ACLs, a directory someone else could create in or delete
        from is never used: a directory made by an intruder could take the ledger away or swap it
        (acl.py). The directories the layout needs are made here, with the cluster's ACLs."""
        policy = self.zk.acl_policy
        if policy is None:
            return None
        parts = layout.split_ledger_id_parts(ledger_id)[:-1]
        trusted_ids = (*policy.bookie_ids, policy.own_id)
        path = layout.ledgers_path(self.root)
        for depth in range(len(parts) + 1):
            if depth:
                path = f"{path}/{parts[depth - 1]}"
            if path in self._trusted_directories:
                continue
            try:
                acls = await self.zk.get_acls(path)
            except MetadataNotFoundError:
                await self.zk.ensure_path(path)  # ours, with our ACLs
                acls = await self.zk.get_acls(path)
            refusal = directory_refusal(acls, trusted_ids)
            if refusal is not None:
                span = 10 ** (layout.LEDGER_ID_DIGITS - sum(len(part) for part in parts[:depth]))
                return path, refusal, (ledger_id // span + 1) * span
            if len(self._trusted_directories) >= TRUSTED_DIRECTORIES_MAX:
                self._trusted_directories.clear()
            self._trusted_directories.add(path)
        return None

    async def max_ledger_id(self) -> int | None:
        """The highest ledger id with metadata (a walk down the last names: a few listings)."""

        async def walk(path: str, depth: int) -> int | None:
            try:
                names = await self.zk.children(path)
            except MetadataNotFoundError:
                return None
            for name in reversed(names):
                if depth == 4:
                    if name.startswith("L") and len(name) == 5 and name[1:].isdigit():
                        return layout.ledger_id_from_path(f"{path}/{name}")
                    continue
                if len(name) != (3 if depth == 0 else 4) or not name.isdigit():
                    continue
                found = await walk(f"{path}/{name}", depth + 1)
                if found is not None:
                    return found
            return None

        return await walk(layout.ledgers_path(self.root), 0)

    async def create_ledger(self, metadata: LedgerMetadata, writers: list[str] | None = None) -> tuple[int, int]:
        """Allocate an id and create its metadata; an id someone created metadata for out of turn
        (a squatter) is skipped, never shared, and so is a directory someone else could write.
        An attempt whose answer was lost (ConnectionLoss while a ZooKeeper leader is elected) is
        tried again; finding the node then with our very bytes means that attempt landed.
        `writers`: the digest ids that may write the node besides the bookies (acl.py)."""
        data = metadata.to_bytes()
        for _ in range(ID_SQUATTED_RETRIES):
            ledger_id = await self._allocate_id()
            refusal = await self._directory_refusal(ledger_id)
            if refusal is not None:
                directory, why, next_id = refusal
                if next_id > layout.LEDGER_ID_MAX:
                    raise MetadataError(f"no ledger directory can hold new ledgers: {directory} ({why})")
                log.error("ledger directory %s cannot hold new ledgers (%s): ids below %d are skipped",
                          directory, why, next_id)
                await self._move_counter(next_id)
                continue
            if await self._create_ledger_node(ledger_id, data, writers):
                return ledger_id, 0
            await self._skip_squatters(ledger_id)
        raise MetadataError(f"{ID_SQUATTED_RETRIES} allocated ledger ids in a row already had metadata or lay in "
                            "directories others could write (see the log; an admin may delete the squatted "
                            f"nodes under {layout.ledgers_path(self.root)})")

    async def _create_ledger_node(self, ledger_id: int, data: bytes, writers: list[str] | None) -> bool:
        """Create ledger `ledger_id`'s node holding `data`, retried; False if a squatter has it."""
        path = layout.ledger_path(self.root, ledger_id)
        acl = self.zk.acl_policy.acl_for(path, writers) if self.zk.acl_policy is not None else None
        uncertain = False

        async def attempt() -> bool:
            nonlocal uncertain
            try:
                await self.zk.create(path, data, makepath=True, acl=acl)
            except MetadataExistsError:
                found = await self.zk.get_or_none(path) if uncertain else None
                return found is not None and found[0] == data  # ours, or a squatter's
            except MetadataError as exc:
                uncertain = uncertain or exc.retryable
                raise
            return True

        return await retry(attempt, METADATA_RETRY, what=f"creation of ledger {ledger_id}")

    async def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        path = layout.ledger_path(self.root, ledger_id)
        found = await retry(lambda: self.zk.get_or_none(path), METADATA_RETRY,
                            what=f"read of ledger {ledger_id}")
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        data, version = found
        if data == TOMBSTONE:
            raise NoSuchLedgerError(f"ledger {ledger_id} was deleted")
        return LedgerMetadata.from_bytes(data), version

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata, expected_version: int) -> int:
        try:
            return await self.zk.set(layout.ledger_path(self.root, ledger_id), metadata.to_bytes(),
                                     expected_version)
        except MetadataNotFoundError as exc:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from exc

    async def delete_ledger(self, ledger_id: int) -> None:
        path = layout.ledger_path(self.root, ledger_id)
        uncertain = False

        async def attempt() -> None:
            nonlocal uncertain
            try:
                await self.zk.delete(path)
            except MetadataNotFoundError as exc:
                if not uncertain:  # gone after an attempt whose answer was lost: that was us
                    raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from exc
            except MetadataPermissionError:
                # ACLs: only bookies and admins may delete under the ledger directories; the ledger's
                # own ACL lets its creator mark it deleted, and bookies' GC removes the node (acl.py)
                found = await self.zk.get_or_none(path)
                if found is None or found[0] == TOMBSTONE:
                    if uncertain:
                        return
                    raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
                await self.zk.set(path, TOMBSTONE, found[1])
            except MetadataError as exc:
                uncertain = uncertain or exc.retryable
                raise

        await retry(attempt, METADATA_RETRY, what=f"deletion of ledger {ledger_id}")

    async def list_ledgers(self) -> list[int]:
        ids: list[int] = []

        async def walk(path: str, depth: int) -> None:
            try:
                children = await self.zk.children(path)
            except MetadataNotFoundError:
                return
            if depth == 4:
                ids.extend(layout.ledger_id_from_path(f"{path}/{name}") for name in children
                           if name.startswith("L"))
                return
            await asyncio.gather(*(walk(f"{path}/{name}", depth + 1) for name in sorted(children)))

        await walk(layout.ledgers_path(self.root), 0)
        return sorted(ids)

    async def list_ledgers_page(self, after: int, limit: int) -> list[int]:
        """Up to `limit` ledger ids above `after`, in order: a scan of millions of ledgers in
        bounded pieces (each ZooKeeper listing holds at most 10,000 names)."""
        return await ledger_ids_page(self.zk, layout.ledgers_path(self.root), after, limit)

    # ------------------------------------------------------------------ bookies

    async def bookies(self) -> list[BookieInfo]:
        try:
            names = await self.zk.children(layout.available_path(self.root))
        except MetadataNotFoundError:
            return []
        if self.trusted_registrations_only:
            names = await self.trusted(names)
        found = await asyncio.gather(*(self.zk.get_or_none(layout.bookie_path(self.root, name))
                                       for name in names))
        infos = (_bookie_info(name, item[0]) for name, item in zip(names, found, strict=True) if item is not None)
        return sorted(infos, key=lambda info: info.bookie_id)

    async def trusted(self, names: list[str]) -> list[str]:
        """The registrations nobody but their owner could have written (S3): the directory and the
        node must not be writable by anyone; the rest are ignored, loudly."""
        if world_writable(await self.zk.get_acls(layout.available_path(self.root))):
            log.warning("%s is writable by anyone: no bookie registration can be trusted",
                        layout.available_path(self.root))
            return []
        acls = await asyncio.gather(*(self.zk.get_acls(layout.bookie_path(self.root, name))
                                      for name in names), return_exceptions=True)
        trusted = []
        for name, acl in zip(names, acls, strict=True):
            if isinstance(acl, MetadataNotFoundError):
                continue
            if isinstance(acl, BaseException):
                raise acl
            if world_writable(acl):
                log.warning("ignoring bookie registration %s: writable by anyone", name)
                continue
            trusted.append(name)
        return trusted

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Callable[[], None]:
        """Call back with every registered bookie whenever one comes, goes, or changes its node
        (a bookie turning read-only or writable again rewrites its node's data)."""
        loop = asyncio.get_running_loop()
        node_watches: dict[str, Callable[[], None]] = {}
        refreshing: set[asyncio.Task[None]] = set()

        def refresh(*_: object) -> None:
            async def deliver() -> None:
                try:
                    bookies = await self.bookies()
                except MetadataError as exc:  # e.g. the client closed meanwhile: nothing to tell
                    log.debug("bookie list refresh failed: %s", exc)
                    return
                callback(bookies)

            task = loop.create_task(deliver())
            refreshing.add(task)
            task.add_done_callback(refreshing.discard)

        def children_changed(names: list[str]) -> None:
            for name in set(node_watches) - set(names):
                node_watches.pop(name)()
            for name in set(names) - set(node_watches):
                node_watches[name] = self.zk.watch_data(layout.bookie_path(self.root, name), refresh)
            refresh()

        stop_children = self.zk.watch_children(layout.available_path(self.root), children_changed)

        def unwatch() -> None:
            stop_children()
            for stop in node_watches.values():
                stop()
            node_watches.clear()
            for task in list(refreshing):
                task.cancel()

        return unwatch

    def watch_ledger_deleted(self, ledger_id: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call back once when the ledger's node is deleted or marked deleted by a tombstone
        (acl.py), at once if it already is; the one data watch of zk.py, re-armed after a
        reconnect."""
        fired = False

        def changed(data: bytes | None, version: int) -> None:
            nonlocal fired
            if fired or (data is not None and data != TOMBSTONE):
                return
            fired = True
            stop()
            callback()

        stop = self.zk.watch_data(layout.ledger_path(self.root, ledger_id), changed)
        return stop


async def ledger_ids_page(zk: AsyncZooKeeper, base: str, after: int, limit: int) -> list[int]:
    """Up to `limit` ids above `after` from a tree of nodes named by `layout.split_ledger_id`
    under `base`, in increasing order. Subtrees wholly below `after` are never listed: a page costs
    one listing per level on the way down plus the leaves it returns."""
    if limit < 1:
        raise ValueError(f"a page holds at least 1 id, got limit {limit}")
    if after >= layout.LEDGER_ID_MAX:
        return []
    lower = layout.split_ledger_id_parts(max(after + 1, 0))
    found: list[int] = []

    async def walk(path: str, depth: int, at_lower: bool) -> None:
        try:
            names = await zk.children(path)
        except MetadataNotFoundError:
            return
        for name in names:  # sorted; the names are fixed-width, so text order is number order
            if len(found) >= limit:
                return
            if len(name) != len(lower[depth]) or (depth == 4) != name.startswith("L"):
                continue  # not part of the layout
            if at_lower and name < lower[depth]:
                continue
            if depth == 4:
                found.append(layout.ledger_id_from_path(f"{path}/{name}"))
            else:
                await walk(f"{path}/{name}", depth + 1, at_lower and name == lower[depth])

    await walk(base, 0, True)
    return found


def _counter_value(data: bytes) -> int | None:
    """The next ledger id a counter node holds, None when it holds none."""
    try:
        value = int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    # the maximum is no id to hand out either: 2**63 allocations cannot have happened, it was written
    return value if 0 <= value < layout.LEDGER_ID_MAX else None


def _bookie_info(name: str, data: bytes) -> BookieInfo:
    try:
        info = json.loads(data)
    except ValueError:
        info = {}
    return BookieInfo(bookie_id=info.get("id", name), address=info.get("address", name),
                      state=info.get("state", "writable"), rack=info.get("rack"), http=info.get("http"))
