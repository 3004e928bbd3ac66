"""The batched messages of protocol version 2 (ADD_BATCH, READ_RANGE) round-trip, survive any split,
truncation and random bytes, refuse malformed bodies cleanly, and versions 1 and 2 meet cleanly."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper.protocol import batch, wire
from bookkeeper.protocol.batch import (
    ADD_BATCH_ENTRIES_MAX,
    AddBatchRequest,
    AddBatchResponse,
    AddFailure,
    AddGroup,
    ReadRangeRequest,
    ReadRangeResponse,
)
from bookkeeper.protocol.wire import (
    BookieInfoRequest,
    ErrorResponse,
    FrameError,
    OpCode,
    ReadLacResponse,
    RequestDecoder,
    ResponseDecoder,
    Status,
    encode_request,
    encode_response,
)

ids = st.integers(min_value=-(2**63), max_value=2**63 - 1)
entry_ids = st.integers(min_value=0, max_value=2**62)
request_ids = st.integers(min_value=0, max_value=2**64 - 1)
keys = st.binary(min_size=32, max_size=32)
groups = st.builds(AddGroup, ids, keys, st.lists(st.binary(max_size=80), min_size=1, max_size=6).map(tuple),
                   st.booleans())
add_batches = st.builds(AddBatchRequest, request_ids, st.lists(groups, min_size=1, max_size=4).map(tuple))


@st.composite
def read_ranges(draw):  # type: ignore[no-untyped-def]
    first = draw(entry_ids)
    fence = draw(st.booleans())
    return ReadRangeRequest(draw(request_ids), draw(ids), first, first + draw(st.integers(0, 10_000)),
                            draw(st.integers(1, 2**16 - 1)), draw(st.integers(0, 2**32 - 1)), fence,
                            draw(keys) if fence else b"")


@st.composite
def add_answers(draw):  # type: ignore[no-untyped-def]
    count = draw(st.integers(1, 50))
    failures = draw(st.lists(st.builds(AddFailure, st.integers(0, count - 1),
                                       st.sampled_from([s for s in Status if s != Status.OK]),
                                       st.text(max_size=60)), max_size=5))
    return AddBatchResponse(draw(request_ids), count, tuple(failures))


range_answers = st.builds(ReadRangeResponse, request_ids, ids, ids, ids,
                          st.lists(st.tuples(entry_ids, st.binary(max_size=80)), max_size=5).map(tuple))


def decode_all(decoder, data: bytes) -> list:  # type: ignore[no-untyped-def]
    decoder.receive_data(data)
    messages = []
    while (message := decoder.next_message()) is not None:
        messages.append(message)
    return messages


@given(st.lists(st.one_of(add_batches, read_ranges()), min_size=1, max_size=5), st.integers(1, 64))
def test_batched_requests_round_trip_even_when_split_anywhere(messages, chunk_bytes):
    stream = b"".join(encode_request(message) for message in messages)
    decoder = RequestDecoder()
    decoded = []
    for start in range(0, len(stream), chunk_bytes):
        decoded += decode_all(decoder, stream[start: start + chunk_bytes])
    assert decoded == messages
    assert decoder.pending_bytes == 0


@given(add_batches)
def test_a_decoded_group_keeps_its_entries_exactly_as_framed(message):
    decoded = decode_all(RequestDecoder(), encode_request(message))[0]
    for group in decoded.groups:
        expected = b"".join(struct.pack(">I", len(entry)) + entry for entry in group.entries)
        assert group.section == expected  # what the bookie journals as it is


@given(st.lists(st.one_of(add_answers(), range_answers), min_size=1, max_size=5))
def test_batched_responses_round_trip(messages):
    stream = b"".join(encode_response(message) for message in messages)
    decoded = decode_all(ResponseDecoder(), stream)
    assert [type(m) for m in decoded] == [type(m) for m in messages]
    for got, sent in zip(decoded, messages):
        if isinstance(sent, AddBatchResponse):  # messages are cut at 256 bytes of UTF-8
            assert (got.entry_count, [(f.index, f.status) for f in got.failures]) == (
                sent.entry_count, [(f.index, f.status) for f in sent.failures])
        else:
            assert got == sent


@given(st.one_of(add_batches, read_ranges()), st.data())
def test_a_truncated_batched_frame_is_only_waited_for(message, data):
    frame = encode_request(message)
    cut = data.draw(st.integers(0, len(frame) - 1))
    decoder = RequestDecoder()
    decoder.receive_data(frame[:cut])
    assert decoder.next_message() is None
    assert decoder.pending_bytes == cut


@settings(max_examples=300)
@given(st.sampled_from([OpCode.ADD_BATCH, OpCode.READ_RANGE]), st.integers(0, 3), st.binary(max_size=200))
def test_random_batched_bodies_are_refused_cleanly_and_the_stream_goes_on(opcode, flags, junk):
    raw = frame(opcode, junk, flags=flags)
    decoder = RequestDecoder(frame_bytes_max=4096)
    decoder.receive_data(raw + encode_request(BookieInfoRequest(8)))
    try:
        decoder.next_message()
    except FrameError as exc:
        assert not exc.fatal and exc.request_id == 7
    assert decoder.next_message() == BookieInfoRequest(8)


def frame(opcode: int, body: bytes, *, version: int = 2, flags: int = 0, request_id: int = 7) -> bytes:
    header = struct.pack(">BBHQ", version, opcode, flags, request_id)
    return struct.pack(">I", len(header) + len(body)) + header + body


def group(ledger_id: int, count: int, *, flags: int = 0, size: int = 40) -> bytes:
    entries = b"".join(struct.pack(">I", size) + b"e" * size for _ in range(count))
    return struct.pack(">q32sHI", ledger_id, b"k" * 32, flags, count) + entries


@pytest.mark.parametrize("raw, words", [
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 0)), "no group"),
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 1) + group(1, 0)), "1..4096"),
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 1) + group(1, 1, flags=0x1)), "unknown group flags"),
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 1) + group(1, 1), flags=0x2), "no frame flags"),
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 1) + group(1, 1) + b"x"), "trailing"),
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 2) + group(1, 1)), "malformed"),
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 1) + group(1, 2)[:-10]), "past the end"),
    (frame(OpCode.ADD_BATCH, struct.pack(">H", 1) + group(1, ADD_BATCH_ENTRIES_MAX + 1, size=0)), "4096"),
    (frame(OpCode.READ_RANGE, struct.pack(">qqqHI", 1, 5, 4, 1, 0)), "first <= last"),
    (frame(OpCode.READ_RANGE, struct.pack(">qqqHI", 1, -1, 4, 1, 0)), "first <= last"),
    (frame(OpCode.READ_RANGE, struct.pack(">qqqHI", 1, 0, 4, 0, 0)), "stride >= 1"),
    (frame(OpCode.READ_RANGE, struct.pack(">qqqHI", 1, 0, 4, 1, 0), flags=0x4), "only the FENCE"),
    (frame(OpCode.READ_RANGE, struct.pack(">qqqHI", 1, 0, 4, 1, 0), flags=0x1), "master key"),
    (frame(OpCode.READ_RANGE, struct.pack(">qqqHI", 1, 0, 4, 1, 0) + b"x"), "trailing"),
    (frame(OpCode.ADD_BATCH, b"", version=1), "need version 2"),
])
def test_bad_batched_bodies_are_refused_and_the_stream_continues(raw, words):
    decoder = RequestDecoder()
    decoder.receive_data(raw + encode_request(BookieInfoRequest(8)))
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    assert not caught.value.fatal and caught.value.request_id == 7
    assert words in str(caught.value)
    assert decoder.next_message() == BookieInfoRequest(8)


def test_an_entry_over_the_maximum_refuses_the_batch_as_too_large():
    decoder = RequestDecoder(entry_bytes_max=100)
    decoder.receive_data(encode_request(AddBatchRequest(1, (AddGroup(1, b"k" * 32, (b"e" * 50, b"e" * 101)),))))
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    assert caught.value.status == Status.TOO_LARGE and not caught.value.fatal


# ---------------------------------------------------------------- versions


def test_a_version_1_client_is_served_and_its_answers_are_version_1():
    decoder = RequestDecoder()
    decoder.receive_data(frame(OpCode.GET_BOOKIE_INFO, b"", version=1))
    assert decoder.next_message() == BookieInfoRequest(7)
    assert decoder.peer_version == 1
    answer = wire.with_version(encode_response(ReadLacResponse(7, 1, 5)), decoder.peer_version)
    assert answer[4] == 1


def test_an_unknown_version_is_refused_in_that_version_naming_those_served():
    decoder = RequestDecoder()
    decoder.receive_data(frame(OpCode.GET_BOOKIE_INFO, b"", version=9))
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    refusal = caught.value
    assert refusal.fatal and refusal.status == Status.BAD_VERSION and refusal.version == 9
    assert "version 9" in str(refusal) and "expected 1 or 2" in str(refusal)


def test_a_new_client_is_told_clearly_when_an_old_bookie_refuses_its_version():
    # what a version 1 bookie answers a version 2 frame: BAD_VERSION in version 1, then it closes
    old_refusal = frame(OpCode.ADD, b"protocol version 2 is not supported (expected 1)", version=1,
                        flags=Status.BAD_VERSION)
    decoder = ResponseDecoder()
    decoder.receive_data(old_refusal)
    answer = decoder.next_message()
    assert isinstance(answer, ErrorResponse) and answer.status == Status.BAD_VERSION
    assert "expected 1" in answer.message  # the client's connection adds what to do (connection.py)
    # and a bookie of a version this client does not know at all is refused clearly too
    decoder = ResponseDecoder()
    decoder.receive_data(frame(OpCode.ADD, b"no", version=5, flags=Status.BAD_VERSION))
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    assert caught.value.fatal and "speaks protocol version 5" in str(caught.value)


def test_an_old_client_decodes_the_refusal_of_a_version_it_does_not_speak():
    # a version 1 decoder (checks version == 1) reads what the bookie sends back to a version 3 frame:
    # the refusal carries the refused frame's version, so any peer can decode it
    refusal = wire.with_version(encode_response(ErrorResponse(7, 0, Status.BAD_VERSION, "no")), 3)
    version, opcode, status, request_id = struct.unpack_from(">BBHQ", refusal, 4)
    assert (version, status, request_id) == (3, Status.BAD_VERSION, 7)


def test_hot_path_encoder_matches_the_request_encoder():
    groups = [(1, b"k" * 32, False, [b"a" * 40, b"b" * 41]), (2, b"j" * 32, True, [b"c" * 33])]
    request = AddBatchRequest(9, tuple(AddGroup(l, k, tuple(e), r) for l, k, r, e in groups))
    assert batch.encode_add_batch(9, groups) == encode_request(request)
