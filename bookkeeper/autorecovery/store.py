"""Auto-recovery's state in ZooKeeper: marks, ledger locks, the disable switch, audit requests,
the auditor's cursors and the election (layout in `bookkeeper/meta/layout.py`, docs/design.md).

Every write that can race is a compare-and-set (a mark merged by the auditor while a worker updates
it) or a create that fails when the node exists (a ledger lock). The marks' parent node is touched
after every new mark, so workers wake on a data watch instead of listing the marks in a loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from bookkeeper.autorecovery.policy import Mark, Missing
from bookkeeper.errors import (
    CorruptMetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
)
from bookkeeper.meta import layout
from bookkeeper.meta.zk import AsyncZooKeeper, Election, lock_contenders
from bookkeeper.meta.zkstore import ledger_ids_page
from bookkeeper.retry import Backoff, retry

log = logging.getLogger(__name__)
MARK_RETRY = Backoff(attempts_max=20, delay_s_first=0.005, delay_s_max=0.2)
MARKS_PAGE_MAX = 1000  # ids per listing of the marks


class RecoveryStore:
    def __init__(self, zk: AsyncZooKeeper, root: str = layout.DEFAULT_ROOT) -> None:
        self.zk = zk
        self.root = root

    async def ensure_layout(self) -> None:
        for path in (layout.marks_path(self.root), layout.mark_locks_path(self.root),
                     layout.auditor_election_path(self.root)):
            await self.zk.ensure_path(path)

    # ------------------------------------------------------------------ marks

    async def mark(self, ledger_id: int, missing: Iterable[Missing], now_ms: int) -> bool:
        """Mark the ledger under-replicated, or add bookies to its mark; True if anything changed."""
        missing = list(missing)
        if not missing:
            return False
        path = layout.mark_path(self.root, ledger_id)

        async def attempt() -> bool:
            found = await self.read_mark(ledger_id)
            if found is None:
                try:
                    await self.zk.create(path, Mark(ledger_id, tuple(missing), now_ms).to_bytes(),
                                         makepath=True)
                except MetadataExistsError as exc:
                    raise MetadataVersionError("marked meanwhile") from exc
                return True
            mark, version = found
            merged = mark.merged(missing)
            if merged is mark:
                return False
            await self.zk.set(path, merged.to_bytes(), version)
            return True

        changed = await retry(attempt, MARK_RETRY, what=f"marking ledger {ledger_id}", quiet=True)
        if changed:
            await self.zk.set(layout.marks_path(self.root), str(now_ms).encode())  # wakes workers
        return changed

    async def read_mark(self, ledger_id: int) -> tuple[Mark, int] | None:
        found = await self.zk.get_or_none(layout.mark_path(self.root, ledger_id))
        if found is None:
            return None
        data, version = found
        return Mark.from_bytes(data), version

    async def write_mark(self, mark: Mark, version: int) -> int:
        """Compare-and-set; MetadataVersionError when the auditor changed it meanwhile."""
        return await self.zk.set(layout.mark_path(self.root, mark.ledger_id), mark.to_bytes(), version)

    async def unmark(self, ledger_id: int, version: int) -> None:
        """Delete the mark if it is still the version the worker repaired (MetadataVersionError if
        the auditor added a bookie meanwhile); a mark already gone is fine."""
        try:
            await self.zk.delete(layout.mark_path(self.root, ledger_id), version)
        except MetadataNotFoundError:
            pass

    async def marked_page(self, after: int = -1, limit: int = MARKS_PAGE_MAX) -> list[int]:
        return await ledger_ids_page(self.zk, layout.marks_path(self.root), after, limit)

    async def marks(self, limit: int = MARKS_PAGE_MAX) -> list[Mark]:
        """Up to `limit` marks in ledger order (one that cannot be parsed shows its error)."""
        result: list[Mark] = []
        after = -1
        while len(result) < limit:
            page = await self.marked_page(after, min(MARKS_PAGE_MAX, limit - len(result)))
            if not page:
                break
            after = page[-1]
            for ledger_id in page:
                try:
                    found = await self.read_mark(ledger_id)
                except CorruptMetadataError as exc:
                    result.append(Mark(ledger_id, (), 0, error=str(exc)))
                    continue
                if found is not None:
                    result.append(found[0])
        return result

    async def count_marks(self, limit: int = 10**7) -> int:
        count, after = 0, -1
        while count < limit:
            page = await self.marked_page(after)
            if not page:
                break
            count += len(page)
            after = page[-1]
        return count

    def watch_marks(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call back (on the loop) when marks are added."""
        return self.zk.watch_data(layout.marks_path(self.root), lambda data, version: callback())

    # ------------------------------------------------------------------ ledger locks

    async def try_lock(self, ledger_id: int, owner: str) -> bool:
        """Take the ledger's lock (an ephemeral node: it goes with the holder's session)."""
        try:
            await self.zk.create(layout.mark_lock_path(self.root, ledger_id), owner.encode(),
                                 ephemeral=True, makepath=True)
        except MetadataExistsError:
            return False
        return True

    async def lock_version(self, ledger_id: int) -> int | None:
        found = await self.zk.get_or_none(layout.mark_lock_path(self.root, ledger_id))
        return None if found is None else found[1]

    async def unlock(self, ledger_id: int) -> None:
        try:
            await self.zk.delete(layout.mark_lock_path(self.root, ledger_id))
        except MetadataNotFoundError:
            pass

    async def locks(self) -> dict[int, str]:
        """Ledger id -> the worker holding it."""
        try:
            names = await self.zk.children(layout.mark_locks_path(self.root))
        except MetadataNotFoundError:
            return {}
        held: dict[int, str] = {}
        for name in names:
            found = await self.zk.get_or_none(f"{layout.mark_locks_path(self.root)}/{name}")
            if found is not None and name.isdigit():
                held[int(name)] = found[0].decode(errors="replace")
        return held

    # ------------------------------------------------------------------ switches and requests

    async def enabled(self) -> bool:
        return not await self.zk.exists(layout.autorecovery_disable_path(self.root))

    async def set_enabled(self, enabled: bool) -> None:
        path = layout.autorecovery_disable_path(self.root)
        try:
            if enabled:
                await self.zk.delete(path)
            else:
                await self.zk.create(path, b"disabled by an operator", makepath=True)
        except (MetadataNotFoundError, MetadataExistsError):
            pass  # already as asked

    def watch_enabled(self, callback: Callable[[bool], None]) -> Callable[[], None]:
        return self.zk.watch_data(layout.autorecovery_disable_path(self.root),
                                  lambda data, version: callback(data is None))

    async def trigger_audit(self, replica_check: bool, now_ms: int) -> None:
        body = json.dumps({"requested_ms": now_ms, "replica_check": replica_check}).encode()
        path = layout.audit_trigger_path(self.root)
        try:
            await self.zk.set(path, body)
        except MetadataNotFoundError:
            await self.zk.create(path, body, makepath=True)

    def watch_trigger(self, callback: Callable[[dict[str, Any] | None], None]) -> Callable[[], None]:
        def changed(data: bytes | None, version: int) -> None:
            try:
                callback(json.loads(data) if data else None)
            except ValueError:
                callback(None)

        return self.zk.watch_data(layout.audit_trigger_path(self.root), changed)

    # ------------------------------------------------------------------ the auditor

    async def audit_state(self) -> dict[str, Any]:
        found = await self.zk.get_or_none(layout.audit_state_path(self.root))
        try:
            return json.loads(found[0]) if found and found[0] else {}
        except ValueError:
            return {}

    async def write_audit_state(self, state: dict[str, Any]) -> None:
        """Written by the auditor only (it serializes its own writes)."""
        body = json.dumps(state, sort_keys=True).encode()
        path = layout.audit_state_path(self.root)
        try:
            await self.zk.set(path, body)
        except MetadataNotFoundError:
            try:
                await self.zk.create(path, body, makepath=True)
            except MetadataExistsError:  # created meanwhile (by a deposed auditor's last write)
                await self.zk.set(path, body)

    def election(self, identifier: str) -> Election:
        return Election(self.zk, layout.auditor_election_path(self.root), identifier)

    async def auditor(self) -> str | None:
        contenders = await lock_contenders(self.zk, layout.auditor_election_path(self.root))
        return contenders[0] if contenders else None

    async def cookie_bookies(self) -> set[str]:
        try:
            return set(await self.zk.children(layout.cookies_path(self.root)))
        except MetadataNotFoundError:
            return set()
