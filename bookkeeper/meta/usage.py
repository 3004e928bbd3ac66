"""What each bookie stores per namespace, as it publishes it for the stored-bytes quota.

    <bk>/usage/<bookie id>    ephemeral, written by that bookie (the bookie identity's ACL):
                              {"format": 1, "published_ms": ..., "namespaces": {"<ns>": bytes},
                               "streams": {"<ns>": {"<stream>": first ledger id stored}}}

Every copy counts (a namespace writing at Qw=2 stores each entry twice). The node goes with the
bookie's session: a bookie that is down publishes nothing, and its copies are re-replicated and
then counted where they land. Bookies read every node to get the cluster's total per namespace and
the streams it holds data for (`cluster_usage`, for `stored_bytes_max` and the bookies' backstop of
`streams_max`); `dlog quota show` does the same.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from bookkeeper.errors import MetadataNotFoundError
from bookkeeper.meta.zk import AsyncZooKeeper

log = logging.getLogger(__name__)
USAGE_NODE_FORMAT = 1
USAGE_NODES_MAX = 10_000  # bookies whose usage one reader sums; more are left out, with a warning
USAGE_LOOKUPS_MAX = 1000  # ledger metadata reads of one bookie's usage round; the rest wait for the next


def usage_dir(root: str) -> str:
    return f"{root}/usage"


def usage_path(root: str, bookie_id: str) -> str:
    return f"{usage_dir(root)}/{bookie_id}"


@dataclass
class Usage:
    """Bytes per namespace, and per namespace the streams with data and their first ledger id."""

    bytes: dict[str, int] = field(default_factory=dict)
    streams: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, other: Usage) -> None:
        for namespace, size_bytes in other.bytes.items():
            self.bytes[namespace] = self.bytes.get(namespace, 0) + size_bytes
        for namespace, streams in other.streams.items():
            mine = self.streams.setdefault(namespace, {})
            for stream, ledger_id in streams.items():
                mine[stream] = min(ledger_id, mine.get(stream, ledger_id))


def encode_usage(usage: Usage, now_ms: int) -> bytes:
    return json.dumps({"format": USAGE_NODE_FORMAT, "published_ms": now_ms, "namespaces": usage.bytes,
                       "streams": usage.streams}, sort_keys=True).encode()


def decode_usage(data: bytes) -> Usage:
    """One node's usage; ValueError when it is not a usage node of this format."""
    document = json.loads(data)
    if not isinstance(document, dict) or document.get("format") != USAGE_NODE_FORMAT:
        raise ValueError(f"not a usage node of format {USAGE_NODE_FORMAT}")
    namespaces, streams = document.get("namespaces"), document.get("streams", {})
    if not isinstance(namespaces, dict) or not isinstance(streams, dict):
        raise ValueError("no namespaces object")
    return Usage({str(name): int(size) for name, size in namespaces.items()},
                 {str(name): {str(stream): int(first) for stream, first in named.items()}
                  for name, named in streams.items()})


async def publish_usage(zk: AsyncZooKeeper, root: str, bookie_id: str, usage: Usage, now_ms: int) -> None:
    path = usage_path(root, bookie_id)
    data = encode_usage(usage, now_ms)
    try:
        await zk.set(path, data)
    except MetadataNotFoundError:  # first publication, or the session that owned it ended
        await zk.create(path, data, ephemeral=True, makepath=True)


async def cluster_usage(zk: AsyncZooKeeper, root: str) -> Usage:
    """Every bookie's last publication, summed (a corrupt node is skipped)."""
    total = Usage()
    try:
        bookies = await zk.children(usage_dir(root))
    except MetadataNotFoundError:
        return total
    if len(bookies) > USAGE_NODES_MAX:
        log.warning("%d usage nodes under %s; summing the first %d", len(bookies), usage_dir(root),
                    USAGE_NODES_MAX)
        bookies = sorted(bookies)[:USAGE_NODES_MAX]
    for bookie_id in bookies:
        found = await zk.get_or_none(usage_path(root, bookie_id))
        if found is None:
            continue
        try:
            total.add(decode_usage(found[0]))
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("usage node of bookie %s is not valid: %s", bookie_id, exc)
    return total


async def stored_bytes_of(zk: AsyncZooKeeper, root: str, namespace: str) -> int:
    return (await cluster_usage(zk, root)).bytes.get(namespace, 0)
