"""The BookKeeper ledger client: BookKeeper (create, open, recover, delete), the ledger handles
that drive the protocol machines, the bookie connection pool and placement."""

from bookkeeper.client.bookkeeper import BookKeeper
from bookkeeper.client.ledger import LedgerEntry, LedgerHandle, ReadHandle

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle", "ReadHandle"]
