"""What each bookie stores per namespace, as it publishes it for the stored-bytes quota.

    <bk>/usage/<bookie id>    ephemeral, written by that bookie (the bookie identity's ACL):
                              {"format": 1, "published_ms": ..., "namespaces": {"<ns>": bytes}}

Every copy counts (a namespace writing at Qw=2 stores each entry twice). The node goes with the
bookie's session: a bookie that is down publishes nothing, and its copies are re-replicated and
then counted where they land. Bookies read every node to get the cluster's total per namespace
(`cluster_usage`); `dlog quota show` does the same.
"""

from __future__ import annotations

import json
import logging

from bookkeeper.errors import MetadataNotFoundError
from bookkeeper.meta.zk import AsyncZooKeeper

log = logging.getLogger(__name__)
USAGE_NODE_FORMAT = 1
USAGE_NODES_MAX = 10_000  # bookies whose usage one reader sums; more are left out, with a warning


def usage_dir(root: str) -> str:
    return f"{root}/usage"


def usage_path(root: str, bookie_id: str) -> str:
    return f"{usage_dir(root)}/{bookie_id}"


def encode_usage(namespaces: dict[str, int], now_ms: int) -> bytes:
    return json.dumps({"format": USAGE_NODE_FORMAT, "published_ms": now_ms, "namespaces": namespaces},
                      sort_keys=True).encode()


def decode_usage(data: bytes) -> dict[str, int]:
    """The namespaces' bytes of one node; ValueError when it is not a usage node of this format."""
    document = json.loads(data)
    if not isinstance(document, dict) or document.get("format") != USAGE_NODE_FORMAT:
        raise ValueError(f"not a usage node of format {USAGE_NODE_FORMAT}")
    namespaces = document.get("namespaces")
    if not isinstance(namespaces, dict):
        raise ValueError("no namespaces object")
    return {str(name): int(size) for name, size in namespaces.items()}


async def publish_usage(zk: AsyncZooKeeper, root: str, bookie_id: str, namespaces: dict[str, int],
                        now_ms: int) -> None:
    path = usage_path(root, bookie_id)
    data = encode_usage(namespaces, now_ms)
    try:
        await zk.set(path, data)
    except MetadataNotFoundError:  # first publication, or the session that owned it ended
        await zk.create(path, data, ephemeral=True, makepath=True)


async def cluster_usage(zk: AsyncZooKeeper, root: str) -> dict[str, int]:
    """Bytes per namespace over every bookie's last publication (a corrupt node is skipped)."""
    try:
        bookies = await zk.children(usage_dir(root))
    except MetadataNotFoundError:
        return {}
    if len(bookies) > USAGE_NODES_MAX:
        log.warning("%d usage nodes under %s; summing the first %d", len(bookies), usage_dir(root),
                    USAGE_NODES_MAX)
        bookies = sorted(bookies)[:USAGE_NODES_MAX]
    totals: dict[str, int] = {}
    for bookie_id in bookies:
        found = await zk.get_or_none(usage_path(root, bookie_id))
        if found is None:
            continue
        try:
            namespaces = decode_usage(found[0])
        except (ValueError, TypeError) as exc:
            log.warning("usage node of bookie %s is not valid: %s", bookie_id, exc)
            continue
        for namespace, size_bytes in namespaces.items():
            totals[namespace] = totals.get(namespace, 0) + size_bytes
    return totals


async def stored_bytes_of(zk: AsyncZooKeeper, root: str, namespace: str) -> int:
    return (await cluster_usage(zk, root)).get(namespace, 0)
