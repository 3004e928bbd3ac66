"""A bookie's identity in ZooKeeper: the cookie check at start-up and the ephemeral registration.

The cookie ties a data directory to a bookie id and a cluster instance. It is written to the
directory and to ZooKeeper when a bookie first starts; afterwards both must agree, so a wiped disk
(cookie in ZooKeeper, none on disk) or a directory moved to another bookie id or cluster cannot
silently rejoin with fewer entries than the ledgers' metadata assumes.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bookkeeper.clock import wall_ms
from bookkeeper.errors import (
    CookieMismatchError,
    MetadataExistsError,
    MetadataNotFoundError,
)
from bookkeeper.meta import layout

if TYPE_CHECKING:
    from bookkeeper.meta.zk import AsyncZooKeeper

log = logging.getLogger(__name__)
COOKIE_FILE = "cookie.json"
COOKIE_VERSION = 1


async def ensure_cluster(zk: AsyncZooKeeper, root: str) -> str:
    """Create the cluster's nodes if missing; return the cluster instance id."""
    for path in (layout.cookies_path(root), layout.available_path(root), layout.ledgers_path(root),
                 layout.idgen_path(root)):
        await zk.ensure_path(path)
    try:
        await zk.create(layout.instance_id_path(root), str(uuid.uuid4()).encode())
    except MetadataExistsError:
        pass
    if zk.acl_policy is not None:
        await _announce_identity(zk, root)
        await _close_open_directories(zk, root)
    data, _ = await zk.get(layout.instance_id_path(root))
    return data.decode()


async def _close_open_directories(zk: AsyncZooKeeper, root: str) -> None:
    """Earlier versions let anyone create in the ledger directories and write the id counter (an
    intruder could plant directories and swap ledgers, acl.py): give every such node the cluster's
    ACL again where this bookie may. A directory it may not change stays as it is, and no new
    ledger goes below it (ZooKeeperMetadataStore skips it)."""
    from bookkeeper.errors import MetadataPermissionError
    from bookkeeper.meta.acl import parse_bookie_ids, security_path, world_writable

    found = await zk.get_or_none(security_path(root))
    zk.acl_policy.learn_bookies(parse_bookie_ids(found[0]) if found is not None else [])
    paths = [layout.idgen_path(root), f"{layout.idgen_path(root)}/next"]
    level = [layout.ledgers_path(root)]
    for _depth in range(5):  # the ledgers root and the four directory levels above the L nodes
        paths += level
        below = []
        for path in level:
            try:
                below += [f"{path}/{name}" for name in await zk.children(path) if not name.startswith("L")]
            except MetadataNotFoundError:
                continue
        level = below
    closed = 0
    for path in paths:
        try:
            if not world_writable(await zk.get_acls(path)):
                continue
            await zk.set_acls(path, zk.acl_policy.acl_for(path))
            closed += 1
        except MetadataNotFoundError:
            continue
        except MetadataPermissionError:
            log.warning("%s lets anyone create or delete there and this bookie may not change that: no new "
                        "ledger goes below it (an admin can: dlog cluster secure)", path)
    if closed:
        log.info("closed %d ledger directories that anyone could write (made by an earlier version)", closed)


async def _announce_identity(zk: AsyncZooKeeper, root: str) -> None:
    """Add this bookie's ZooKeeper identity to <root>/security, which clients read to give bookies
    their rights on ledger nodes (bookkeeper/meta/acl.py); only bookies may write it."""
    from bookkeeper.errors import MetadataVersionError
    from bookkeeper.meta.acl import parse_bookie_ids, security_path

    own = zk.acl_policy.own.id.id
    for _ in range(10):
        found = await zk.get_or_none(security_path(root))
        if found is None:
            try:
                await zk.create(security_path(root), json.dumps({"bookie_ids": [own]}).encode())
                return
            except MetadataExistsError:
                continue
        ids = parse_bookie_ids(found[0])
        if own in ids:
            return
        try:
            await zk.set(security_path(root), json.dumps({"bookie_ids": sorted({*ids, own})}).encode(),
                         found[1])
            return
        except MetadataVersionError:
            continue


def _write_local_cookie(data_dir: Path, cookie: dict[str, Any]) -> None:
    path = data_dir / COOKIE_FILE
    temporary = path.with_suffix(".tmp")
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(cookie, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _read_local_cookie(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / COOKIE_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CookieMismatchError(f"cookie file {path} is not valid JSON: {exc}") from exc


async def check_cookie(zk: AsyncZooKeeper, root: str, bookie_id: str, data_dir: Path,
                       instance_id: str) -> dict[str, Any]:
    """Verify or create the cookie; raise CookieMismatchError when disk and ZooKeeper disagree."""
    local = _read_local_cookie(data_dir)
    remote_raw = await zk.get_or_none(layout.cookie_path(root, bookie_id))
    remote = json.loads(remote_raw[0]) if remote_raw is not None else None
    if local is None and remote is None:
        cookie = {"version": COOKIE_VERSION, "bookie_id": bookie_id, "instance_id": instance_id,
                  "created_ms": wall_ms()}
        _write_local_cookie(data_dir, cookie)
        await zk.create(layout.cookie_path(root, bookie_id),
                        json.dumps(cookie, sort_keys=True).encode())
        log.info("new bookie %s: cookie written to %s and ZooKeeper", bookie_id, data_dir)
        return cookie
    if local is None:
        raise CookieMismatchError(
            f"ZooKeeper has a cookie for bookie {bookie_id} but data directory {data_dir} has none: "
            "the disk was wiped or this is the wrong directory. Refusing to start; to rejoin as a "
            f"new, empty bookie, decommission it first (delete {layout.cookie_path(root, bookie_id)}).")
    if remote is None:
        raise CookieMismatchError(
            f"data directory {data_dir} has a cookie for bookie {local.get('bookie_id')} of cluster "
            f"{local.get('instance_id')}, but ZooKeeper has no cookie for {bookie_id}: wrong cluster "
            "or ZooKeeper was reset. Refusing to start.")
    for key in ("bookie_id", "instance_id"):
        if local.get(key) != remote.get(key) or (key == "instance_id" and local.get(key) != instance_id):
            raise CookieMismatchError(
                f"cookie mismatch for bookie {bookie_id}: {key} is {local.get(key)!r} in "
                f"{data_dir / COOKIE_FILE} but {remote.get(key)!r} in ZooKeeper "
                f"(cluster instance {instance_id}). Refusing to start.")
    return local


class Registration:
    """The bookie's ephemeral node; re-created after a ZooKeeper session is lost and regained."""

    def __init__(self, zk: AsyncZooKeeper, root: str, bookie_id: str) -> None:
        self.zk = zk
        self.root = root
        self.bookie_id = bookie_id
        self.info: dict[str, Any] = {}
        self._registered = False

    @property
    def path(self) -> str:
        return layout.bookie_path(self.root, self.bookie_id)

    async def register(self, info: dict[str, Any]) -> None:
        self.info = dict(info)
        data = json.dumps(self.info, sort_keys=True).encode()
        # after a crash-restart our previous session's node may still be there until it expires
        if await self.zk.exists(self.path):
            await self.zk.delete(self.path)
        await self.zk.create(self.path, data, ephemeral=True)
        self._registered = True

    async def update(self, **changes: Any) -> None:
        self.info.update(changes)
        if self._registered:
            await self.zk.set(self.path, json.dumps(self.info, sort_keys=True).encode())

    async def reregister(self) -> None:
        if self._registered and not await self.zk.exists(self.path):
            log.warning("registration %s vanished (session expired); registering again", self.path)
            await self.register(self.info)

    async def unregister(self) -> None:
        if self._registered:
            self._registered = False
            if await self.zk.exists(self.path):
                await self.zk.delete(self.path)


async def list_bookies(zk: AsyncZooKeeper, root: str) -> list[dict[str, Any]]:
    """Every registered bookie's info, sorted by id."""
    try:
        names = await zk.children(layout.available_path(root))
    except MetadataNotFoundError:
        return []
    bookies = []
    for name in sorted(names):
        found = await zk.get_or_none(layout.bookie_path(root, name))
        if found is not None:
            bookies.append(json.loads(found[0]))
    return bookies


async def list_bookies_and_down(zk: AsyncZooKeeper, root: str) -> list[dict[str, Any]]:
    """Registered bookies (state writable or read_only), then bookies that have a cookie but are not
    registered: state "down" (stopped, crashed or partitioned away; a decommissioned bookie has no
    cookie left)."""
    registered = await list_bookies(zk, root)
    try:
        cookies = await zk.children(layout.cookies_path(root))
    except MetadataNotFoundError:
        cookies = []
    known = {item.get("id") for item in registered}
    down = [{"id": name, "address": name, "state": "down", "http": None, "rack": None}
            for name in sorted(cookies) if name not in known]
    return [*registered, *down]
