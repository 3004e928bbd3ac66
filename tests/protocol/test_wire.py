"""The wire codec round-trips every message and refuses every malformed frame with a clean error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper.protocol import wire
from bookkeeper.protocol.wire import (
    CHECK_ENTRIES_MAX,
    PROTOCOL_VERSION,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    BookieState,
    CheckEntriesRequest,
    CheckEntriesResponse,
    EntryCheck,
    ErrorResponse,
    FrameError,
    OpCode,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    RequestDecoder,
    ResponseDecoder,
    Status,
    WriteLacRequest,
    WriteLacResponse,
    encode_request,
    encode_response,
)

ids = st.integers(min_value=-(2**63), max_value=2**63 - 1)
request_ids = st.integers(min_value=0, max_value=2**64 - 1)
keys = st.binary(min_size=32, max_size=32)
lacs = st.integers(min_value=-1, max_value=2**63 - 1)
timeouts = st.integers(min_value=0, max_value=2**32 - 1)

requests = st.one_of(
    st.builds(AddRequest, request_ids, ids, ids, keys, st.binary(max_size=300), st.booleans()),
    st.builds(lambda rid, lid, eid, key, fence, poll, prev, t: ReadRequest(
        rid, lid, eid, fence, key if fence else b"", poll, prev if poll else -1, t if poll else 0),
        request_ids, ids, ids, keys, st.booleans(), st.booleans(), lacs, timeouts),
    st.builds(lambda rid, lid, poll, prev, t: ReadLacRequest(
        rid, lid, poll, prev if poll else -1, t if poll else 0),
        request_ids, ids, st.booleans(), lacs, timeouts),
    st.builds(WriteLacRequest, request_ids, ids, keys, lacs),
    st.builds(BookieInfoRequest, request_ids),
    st.builds(CheckEntriesRequest, request_ids, ids, ids, st.integers(1, CHECK_ENTRIES_MAX)),
)
responses = st.one_of(
    st.builds(AddResponse, request_ids, ids, ids),
    st.builds(ReadResponse, request_ids, ids, ids, lacs, st.binary(max_size=300)),
    st.builds(ReadLacResponse, request_ids, ids, lacs),
    st.builds(WriteLacResponse, request_ids, ids),
    st.builds(BookieInfoResponse, request_ids, st.integers(0, 2**62), st.integers(0, 2**62),
              st.sampled_from(BookieState), st.text(max_size=40)),
    st.builds(lambda rid, lid, first, entries: CheckEntriesResponse(rid, lid, first, tuple(entries)),
              request_ids, ids, ids,
              st.lists(st.tuples(st.sampled_from(EntryCheck), st.integers(0, 2**32 - 1)),
                       max_size=CHECK_ENTRIES_MAX)),
    st.builds(ErrorResponse, request_ids, st.sampled_from([op.value for op in OpCode]),
              st.sampled_from([status for status in Status if status != Status.OK]),
              st.text(max_size=100)),
)


def decode_all(decoder, data: bytes) -> list:
    decoder.receive_data(data)
    messages = []
    while (message := decoder.next_message()) is not None:
        messages.append(message)
    return messages


@given(st.lists(requests, min_size=1, max_size=8), st.integers(1, 64))
def test_requests_round_trip_even_when_split_anywhere(messages, chunk_bytes):
    stream = b"".join(encode_request(message) for message in messages)
    decoder = RequestDecoder()
    decoded = []
    for start in range(0, len(stream), chunk_bytes):
        decoded += decode_all(decoder, stream[start: start + chunk_bytes])
    assert decoded == messages
    assert decoder.pending_bytes == 0


@given(st.lists(responses, min_size=1, max_size=8))
def test_responses_round_trip(messages):
    stream = b"".join(encode_response(message) for message in messages)
    assert decode_all(ResponseDecoder(), stream) == messages


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(junk):
    decoder = RequestDecoder(frame_bytes_max=4096)
    decoder.receive_data(junk)
    for _ in range(100):
        try:
            if decoder.next_message() is None:
                return
        except FrameError as exc:
            if exc.fatal:
                with pytest.raises(FrameError):  # a broken stream stays broken
                    decoder.next_message()
                return


@given(requests, st.data())
def test_a_truncated_frame_is_only_waited_for(message, data):
    frame = encode_request(message)
    cut = data.draw(st.integers(0, len(frame) - 1))
    decoder = RequestDecoder()
    decoder.receive_data(frame[:cut])
    assert decoder.next_message() is None
    assert decoder.pending_bytes == cut


def frame(opcode: int, body: bytes, *, version: int = 1, flags: int = 0, request_id: int = 7,
          length: int | None = None) -> bytes:
    header = struct.pack(">BBHQ", version, opcode, flags, request_id)
    return struct.pack(">I", len(header) + len(body) if length is None else length) + header + body


@pytest.mark.parametrize("length", [0, 1, 11, 2**31, 2**32 - 1, 5000])
def test_bad_lengths_are_fatal(length):
    decoder = RequestDecoder(frame_bytes_max=4096)
    decoder.receive_data(struct.pack(">I", length) + b"x" * 20)
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    assert caught.value.fatal
    assert str(length) in str(caught.value)


def test_unknown_version_is_fatal_and_names_the_expected_one():
    decoder = RequestDecoder()
    decoder.receive_data(frame(OpCode.GET_BOOKIE_INFO, b"", version=9))
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    assert caught.value.fatal and caught.value.status == Status.BAD_VERSION
    assert "expected 1" in str(caught.value)


@pytest.mark.parametrize("raw, words", [
    (frame(99, b""), "unknown opcode 99"),
    (frame(OpCode.READ, b"\x00" * 5), "malformed"),
    (frame(OpCode.READ, b"\x00" * 17), "trailing"),
    (frame(OpCode.GET_BOOKIE_INFO, b"junk"), "trailing"),
    (frame(OpCode.READ, b"\x00" * 16, flags=0x80), "unknown flags"),
    (frame(OpCode.READ, b"\x00" * 20, flags=wire.Flag.FENCE), "master key"),
])
def test_bad_bodies_are_refused_and_the_stream_continues(raw, words):
    decoder = RequestDecoder()
    decoder.receive_data(raw + encode_request(BookieInfoRequest(8)))
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    assert not caught.value.fatal and caught.value.request_id == 7
    assert words in str(caught.value)
    assert decoder.next_message() == BookieInfoRequest(8)


def test_an_entry_over_the_maximum_is_refused_as_too_large():
    decoder = RequestDecoder(entry_bytes_max=100)
    decoder.receive_data(encode_request(AddRequest(1, 1, 0, b"k" * 32, b"e" * 101)))
    with pytest.raises(FrameError) as caught:
        decoder.next_message()
    assert caught.value.status == Status.TOO_LARGE and not caught.value.fatal


@pytest.mark.parametrize("count", [0, CHECK_ENTRIES_MAX + 1, 2**32 - 1])
def test_a_check_of_too_many_or_no_entries_is_refused_and_the_connection_kept(count):
    body = struct.pack(">qqI", 1, 0, count)
    frame = struct.pack(">IBBHQ", 12 + len(body), PROTOCOL_VERSION, OpCode.CHECK_ENTRIES, 0, 9) + body
    decoder = RequestDecoder()
    decoder.receive_data(frame + encode_request(CheckEntriesRequest(10, 1, 0, 5)))
    with pytest.raises(FrameError, match=f"count {count} is outside 1..{CHECK_ENTRIES_MAX}") as caught:
        decoder.next_message()
    assert not caught.value.fatal and caught.value.request_id == 9
    assert decoder.next_message() == CheckEntriesRequest(10, 1, 0, 5)
