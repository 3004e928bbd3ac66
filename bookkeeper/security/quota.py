"""Namespace quotas: what they are, and the pure token bucket that paces a namespace's writes.

A namespace's quota lives in ZooKeeper at `<bookkeeper root>/quotas/<namespace>` (JSON, written by
admins only: the node's ACL): `streams_max` (checked when a stream is created), `write_bytes_per_s`
(enforced by every bookie on the ADDs of that namespace's ledgers: a connection over it is not
refused but slowed, by not reading it until the bucket refills), `stored_bytes_max` (the bytes of
the namespace's entries on all bookies, every copy counted: each bookie publishes what it stores
per namespace under `<bookkeeper root>/usage/<bookie>` and refuses the namespace's ADDs with
QUOTA_EXCEEDED while the cluster's total is at or over it; the total is as fresh as the bookies'
last publication, so a namespace may pass it by what it writes in one usage interval). Bookies
also back `streams_max` up (`StreamSlots`): no data for a stream beyond it. Zero or missing means
unlimited.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bookkeeper.errors import ConfigError

BURST_S = 1.0  # a bucket holds this many seconds of its rate
DELAY_S_MAX = 5.0  # never pause a connection longer than this at once


@dataclass(frozen=True, slots=True)
class Quota:
    streams_max: int = 0
    write_bytes_per_s: int = 0
    stored_bytes_max: int = 0

    def __post_init__(self) -> None:
        for name in ("streams_max", "write_bytes_per_s", "stored_bytes_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"quota {name} must be a whole number >= 0 (0: unlimited), got {value!r}")

    def to_bytes(self) -> bytes:
        return json.dumps(self.as_dict(), sort_keys=True).encode()

    def as_dict(self) -> dict[str, int]:
        return {"streams_max": self.streams_max, "write_bytes_per_s": self.write_bytes_per_s,
                "stored_bytes_max": self.stored_bytes_max}

    @classmethod
    def from_bytes(cls, data: bytes) -> Quota:
        try:
            document = json.loads(data)
            return cls(int(document.get("streams_max", 0)), int(document.get("write_bytes_per_s", 0)),
                       int(document.get("stored_bytes_max", 0)))
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"quota node is not valid quota JSON: {exc}") from exc


UNLIMITED = Quota()


class TokenBucket:
    """Bytes allowed at `rate_per_s` with a burst of BURST_S seconds; `charge` takes the bytes now
    and returns how long the caller should wait before taking more (0: none)."""

    def __init__(self, rate_per_s: int, now_s: float) -> None:
        self.rate_per_s = rate_per_s
        self.tokens = rate_per_s * BURST_S
        self.updated_s = now_s

    def charge(self, size_bytes: int, now_s: float) -> float:
        self.tokens = min(self.rate_per_s * BURST_S, self.tokens + (now_s - self.updated_s) * self.rate_per_s)
        self.updated_s = now_s
        self.tokens -= size_bytes
        if self.tokens >= 0:
            return 0.0
        return min(DELAY_S_MAX, -self.tokens / self.rate_per_s)


STREAMS_RANKED_MAX = 10_000  # streams of one namespace a bookie ranks (and publishes); beyond, none are refused


class StreamSlots:
    """The bookies' backstop for `streams_max` (clients check it when they create a stream, but a
    namespace's principal that writes ZooKeeper directly could pass that): the streams the cluster
    stores data for, ranked by their first ledger id (ids only grow, so older streams rank first).
    An ADD to a stream outside the first `streams_max`, or to a new stream once they are taken, is
    refused. `cluster` comes from the bookies' published usage; `local` adds what this bookie
    admitted since, so two new streams at once are not both let in here."""

    def __init__(self) -> None:
        self.cluster: dict[str, dict[str, int]] = {}
        self.local: dict[str, dict[str, int]] = {}

    def set_cluster(self, streams: dict[str, dict[str, int]]) -> None:
        self.cluster = streams
        self.local = {}

    def known(self, namespace: str) -> dict[str, int]:
        merged = dict(self.cluster.get(namespace, {}))
        for stream, ledger_id in self.local.get(namespace, {}).items():
            merged[stream] = min(ledger_id, merged.get(stream, ledger_id))
        return merged

    def refusal(self, namespace: str, stream: str, ledger_id: int, streams_max: int) -> str | None:
        known = self.known(namespace)
        if len(known) > STREAMS_RANKED_MAX:
            return None
        if stream in known:
            ranked = sorted(known, key=lambda name: (known[name], name))
            if stream in ranked[:streams_max]:
                return None
            return (f"stream {stream!r} of namespace {namespace!r} is one of {len(known)} streams holding data, "
                    f"over its quota streams_max {streams_max} (older streams keep their place): delete "
                    "streams, or raise it with `dlog quota set --streams`")
        if len(known) >= streams_max:
            return (f"namespace {namespace!r} already stores data for {len(known)} streams, its quota "
                    f"streams_max {streams_max}: stream {stream!r} may not take any (delete streams, or "
                    "raise it with `dlog quota set --streams`)")
        self.local.setdefault(namespace, {})[stream] = ledger_id
        return None
