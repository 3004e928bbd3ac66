"""The BookKeeper ledger client."""

from bookkeeper.client.bookkeeper import BookKeeper
from bookkeeper.client.ledger import LedgerEntry, LedgerHandle, ReadHandle

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle", "ReadHandle"]
