"""When garbage collection may drop a ledger: the rule, as pure code.

A bookie drops a ledger's entries once its metadata is gone. Deciding "gone" wrongly deletes
acknowledged entries, so the decision rests on two guards (apache/bookkeeper's GC has the same
hazards):

- an up-to-date view: on a ZooKeeper ensemble a lagging follower can answer "no such node" for a
  ledger created a moment ago on the leader; `sync` on the path first brings the follower up to
  date (`SYNC_BEFORE_CHECK`);
- a grace period: a ledger this bookie first saw less than `grace_s` ago is never dropped,
  whatever the lookup says, so a lookup racing the ledger's creation cannot hurt it.

The bookie service (service.py) and the stream simulator's GC both decide through `may_collect`.
"""

from __future__ import annotations

SYNC_BEFORE_CHECK = True
GC_GRACE_S_DEFAULT = 600.0


def may_collect(*, exists: bool, first_seen_s: float, now_s: float, grace_s: float) -> bool:
    """Whether a ledger whose metadata lookup (made after a sync) said `exists` may be dropped."""
    return not exists and now_s - first_seen_s >= grace_s
