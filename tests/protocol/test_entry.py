"""Packed entries verify their digest (A12): any flipped byte or wrong password is caught."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper.protocol.entry import (
    Digest,
    DigestMismatchError,
    DigestType,
    master_key,
    pack_entry,
    peek_header,
    unpack_entry,
)

digest_types = st.sampled_from([DigestType.CRC32C, DigestType.HMAC_SHA256])


@given(digest_types, st.binary(max_size=200), st.integers(0, 2**40), st.integers(-1, 2**40))
def test_round_trip(digest_type, payload, entry_id, lac):
    digest = Digest.for_ledger(digest_type, b"pw")
    packed = pack_entry(digest, 5, entry_id, lac, 1000, payload)
    entry = unpack_entry(digest, packed, 5, entry_id)
    assert (entry.payload, entry.lac, entry.length) == (payload, lac, 1000)
    assert peek_header(packed)[:3] == (5, entry_id, lac)


@given(digest_types, st.binary(min_size=1, max_size=100), st.data())
def test_any_flipped_byte_is_detected(digest_type, payload, data):
    digest = Digest.for_ledger(digest_type, b"pw")
    packed = bytearray(pack_entry(digest, 5, 3, 2, 10, payload))
    index = data.draw(st.integers(0, len(packed) - 1))
    packed[index] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(DigestMismatchError):
        unpack_entry(digest, bytes(packed), 5, 3)


def test_hmac_with_a_wrong_password_is_refused():
    packed = pack_entry(Digest.for_ledger(DigestType.HMAC_SHA256, b"right"), 1, 0, -1, 3, b"abc")
    with pytest.raises(DigestMismatchError, match="wrong password"):
        unpack_entry(Digest.for_ledger(DigestType.HMAC_SHA256, b"wrong"), packed, 1, 0)


def test_an_entry_for_another_id_is_refused():
    digest = Digest.for_ledger(DigestType.CRC32C, b"")
    packed = pack_entry(digest, 1, 4, 3, 3, b"abc")
    with pytest.raises(DigestMismatchError, match="returned 1:4"):
        unpack_entry(digest, packed, 1, 5)


def test_master_keys_are_stable_per_password_and_never_the_password():
    assert master_key(b"a") == master_key(b"a") != master_key(b"b")
    assert len(master_key(b"secret-password")) == 32
    assert b"secret" not in master_key(b"secret-password")
