"""Ensemble placement: writable bookies at random, spread across racks when bookies name one."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable

from bookkeeper.errors import NotEnoughBookiesError
from bookkeeper.meta.store import BookieInfo


def choose_ensemble(bookies: Iterable[BookieInfo], size: int, rng: random.Random,
                    exclude: Iterable[str] = ()) -> tuple[str, ...]:
    """Pick `size` distinct writable bookies, never a read-only one. With racks, take one bookie
    per rack in turn (racks in random order), so a write quorum spans as many racks as possible."""
    excluded = set(exclude)
    writable = sorted((b for b in bookies if b.writable and b.bookie_id not in excluded),
                      key=lambda b: b.bookie_id)
    if len(writable) < size:
        raise NotEnoughBookiesError(
            f"need {size} writable bookies, {len(writable)} available"
            f"{' (' + ', '.join(b.bookie_id for b in writable) + ')' if writable else ''}; "
            "start more bookies or lower the ensemble size")
    by_rack: dict[str, list[str]] = defaultdict(list)
    for bookie in writable:
        by_rack[bookie.rack or ""].append(bookie.bookie_id)
    racks = sorted(by_rack)
    rng.shuffle(racks)
    for rack in racks:
        rng.shuffle(by_rack[rack])
    chosen: list[str] = []
    while len(chosen) < size:
        for rack in racks:
            if by_rack[rack] and len(chosen) < size:
                chosen.append(by_rack[rack].pop())
    return tuple(chosen)
