"""Ledger metadata fails closed on anything malformed; placement never picks a read-only bookie and
spreads across racks; a bookie turns read-only above its disk threshold and back below the lwm."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from bookkeeper.bookie.config import BookieConfig
from bookkeeper.bookie.service import BookieService, next_read_only
from bookkeeper.client.placement import choose_ensemble
from bookkeeper.errors import CorruptMetadataError, NotEnoughBookiesError
from bookkeeper.meta.layout import ledger_id_from_path, ledger_path
from bookkeeper.meta.store import BookieInfo
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState

METADATA = LedgerMetadata(3, 2, 2, ((0, ("a:1", "b:1", "c:1")), (10, ("a:1", "d:1", "c:1"))),
                          state=LedgerState.CLOSED, last_entry_id=20, length=999)


def test_metadata_round_trips():
    assert LedgerMetadata.from_bytes(METADATA.to_bytes()) == METADATA
    assert METADATA.ensemble_for(9) == ("a:1", "b:1", "c:1")
    assert METADATA.ensemble_for(10) == ("a:1", "d:1", "c:1")


def _mutated(**changes) -> bytes:
    document = json.loads(METADATA.to_bytes())
    document.update(changes)
    return json.dumps(document).encode()


@pytest.mark.parametrize("data, words", [
    (b"not json", "not valid JSON"),
    (b"[]", "format"),
    (_mutated(format=2), "format 2 is not supported"),
    (_mutated(state="HALF_OPEN"), "malformed"),
    (_mutated(ensembles=[]), "first fragment"),
    (_mutated(ensembles=[[0, ["a:1", "b:1"]]]), "3 distinct bookies"),
    (_mutated(ensembles=[[0, ["a:1", "a:1", "b:1"]]]), "3 distinct bookies"),
    (_mutated(ensembles=[[0, ["a", "b", "c"]], [0, ["a", "b", "d"]]]), "strictly increase"),
    (_mutated(write_quorum=5), "malformed"),
    (_mutated(digest_type="MD5"), "malformed"),
])
def test_corrupt_or_unknown_metadata_fails_closed(data, words):
    with pytest.raises(CorruptMetadataError, match=words):
        LedgerMetadata.from_bytes(data)


@pytest.mark.parametrize("ledger_id", [0, 1, 9999, 10_000, 2**31 + 7, 2**63 - 1])
def test_ledger_paths_are_hierarchical_and_invertible(ledger_id):
    path = ledger_path("/bk", ledger_id)
    assert ledger_id_from_path(path) == ledger_id
    assert all(len(part) <= 5 for part in path.split("/")[3:])  # at most 10,000 children a level


def bookies(spec: dict[str, str | None], read_only: set[str] = frozenset()) -> list[BookieInfo]:
    return [BookieInfo(name, name, "read_only" if name in read_only else "writable", rack)
            for name, rack in spec.items()]


def test_placement_never_picks_a_read_only_bookie():
    pool = bookies({f"b{i}": None for i in range(5)}, read_only={"b1", "b3"})
    for seed in range(50):
        assert set(choose_ensemble(pool, 3, random.Random(seed))) == {"b0", "b2", "b4"}
    with pytest.raises(NotEnoughBookiesError, match="need 4 writable bookies, 3 available"):
        choose_ensemble(pool, 4, random.Random(0))


def test_placement_spreads_an_ensemble_across_racks():
    pool = bookies({"a1": "rack-a", "a2": "rack-a", "a3": "rack-a", "b1": "rack-b", "b2": "rack-b",
                    "c1": "rack-c"})
    for seed in range(50):
        chosen = choose_ensemble(pool, 3, random.Random(seed))
        assert Counter(name[0] for name in chosen) == {"a": 1, "b": 1, "c": 1}


def test_placement_is_random_among_equals():
    pool = bookies({f"b{i}": None for i in range(6)})
    seen = {choose_ensemble(pool, 3, random.Random(seed)) for seed in range(30)}
    assert len(seen) > 5


@pytest.mark.parametrize("read_only, usage, expected", [
    (False, 0.50, False), (False, 0.95, True), (True, 0.93, True),  # hysteresis: stays read-only
    (True, 0.89, False), (False, 0.93, False)])
def test_read_only_threshold_has_hysteresis(read_only, usage, expected):
    assert next_read_only(read_only, usage, 0.95, 0.90) is expected


def test_a_bookie_turns_read_only_when_its_disk_fills_and_back_when_it_empties(tmp_path, monkeypatch):
    service = BookieService(BookieConfig(data_dir=tmp_path, port=0, http_port=None))
    usage = {"usage": 0.5}
    monkeypatch.setattr(service, "disk_usage", lambda: {"usage": usage["usage"], "free_bytes": 1,
                                                        "total_bytes": 2, "used_bytes": 1})
    assert not service._check_disk() and not service.core.read_only
    usage["usage"] = 0.97
    assert service._check_disk() and service.core.read_only
    assert "disk usage 97.0%" in service.core.read_only_reason
    usage["usage"] = 0.92
    assert not service._check_disk() and service.core.read_only  # between lwm and threshold
    usage["usage"] = 0.80
    assert service._check_disk() and not service.core.read_only
