"""Where things live in ZooKeeper under the cluster root (default `/bookkeeper`).

    <root>/INSTANCEID                       cluster UUID, created once with the root
    <root>/cookies/<bookie id>              persistent: the bookie's cookie (JSON)
    <root>/available/<bookie id>            ephemeral: address, HTTP URL, state, rack (JSON)
    <root>/idgen/next                       the ledger id counter (compare-and-set; with ACLs only
                                            bookies and admins write it)
    <root>/ledgers/000/0000/0000/0000/L0001 ledger metadata, 19-digit id split 3-4-4-4-4
    <root>/underreplication/                auto-recovery (docs/design.md, "Auto-recovery"):
        ledgers/000/0000/0000/0000/L0001    a mark: the ledger is under-replicated (JSON)
        locks/<ledger id>                   ephemeral: the worker repairing that ledger
        auditor/                            kazoo Lock recipe contenders: the first is the auditor
        disable                             exists while auto-recovery is disabled
        trigger                             written to ask the auditor for an audit now
        audit                               the auditor's scan cursors and last runs (JSON)

The hierarchical split keeps at most 10,000 children under any node, so millions of ledgers
never sit under one parent. Bookie ids are `host:port`, safe as node names.
"""

from __future__ import annotations

DEFAULT_ROOT = "/bookkeeper"
LEDGER_ID_MAX = 2**63 - 1
LEDGER_ID_DIGITS = 19  # of LEDGER_ID_MAX: the width the split layout pads every id to


def instance_id_path(root: str) -> str:
    return f"{root}/INSTANCEID"


def cookies_path(root: str) -> str:
    return f"{root}/cookies"


def cookie_path(root: str, bookie_id: str) -> str:
    return f"{root}/cookies/{bookie_id}"


def available_path(root: str) -> str:
    return f"{root}/available"


def bookie_path(root: str, bookie_id: str) -> str:
    return f"{root}/available/{bookie_id}"


def ledgers_path(root: str) -> str:
    return f"{root}/ledgers"


def quotas_path(root: str) -> str:
    return f"{root}/quotas"


def quota_path(root: str, namespace: str) -> str:
    """A namespace's quota (bookkeeper/security/quota.py); written by admins only."""
    return f"{root}/quotas/{namespace}"


def idgen_path(root: str) -> str:
    return f"{root}/idgen"


def ledger_path(root: str, ledger_id: int) -> str:
    return f"{root}/ledgers/{split_ledger_id(ledger_id)}"


def split_ledger_id(ledger_id: int) -> str:
    """`000/0000/0000/0000/L0001`: the 19-digit id split 3-4-4-4-4, at most 10,000 per level."""
    if not 0 <= ledger_id <= LEDGER_ID_MAX:
        raise ValueError(f"ledger id {ledger_id} is outside 0..{LEDGER_ID_MAX}")
    digits = f"{ledger_id:0{LEDGER_ID_DIGITS}d}"
    return f"{digits[0:3]}/{digits[3:7]}/{digits[7:11]}/{digits[11:15]}/L{digits[15:19]}"


def split_ledger_id_parts(ledger_id: int) -> list[str]:
    return split_ledger_id(ledger_id).split("/")


def marks_path(root: str) -> str:
    return f"{root}/underreplication/ledgers"


def mark_path(root: str, ledger_id: int) -> str:
    return f"{root}/underreplication/ledgers/{split_ledger_id(ledger_id)}"


def mark_locks_path(root: str) -> str:
    return f"{root}/underreplication/locks"


def mark_lock_path(root: str, ledger_id: int) -> str:
    return f"{root}/underreplication/locks/{ledger_id}"


def auditor_election_path(root: str) -> str:
    return f"{root}/underreplication/auditor"


def autorecovery_disable_path(root: str) -> str:
    return f"{root}/underreplication/disable"


def audit_trigger_path(root: str) -> str:
    return f"{root}/underreplication/trigger"


def audit_state_path(root: str) -> str:
    return f"{root}/underreplication/audit"


def ledger_id_from_path(path: str) -> int:
    """Inverse of `ledger_path` for the part below `<root>/ledgers/`."""
    parts = path.strip("/").split("/")[-5:]
    if len(parts) != 5 or not parts[4].startswith("L"):
        raise ValueError(f"not a ledger metadata path: {path!r}")
    return int("".join(parts[:4]) + parts[4][1:])
