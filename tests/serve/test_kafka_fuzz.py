"""Fuzzed frames and record sets never make the Kafka codec raise: every input becomes a request or
one of the codec's own refusal values, and a refused connection yields nothing more."""

from __future__ import annotations

import struct

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlog.serve.kafka import (
    SUPPORTED_APIS,
    BatchRefused,
    ProducedBatch,
    Record,
    Request,
    RequestDecoder,
    RequestRefused,
    decode_produce_records,
    encode_record_batch,
)
from tests.serve.samples import framed_request, sample_message

VALID_FRAMES = [framed_request(sample_message(api.request, version), 1)
                for api in SUPPORTED_APIS.values() for version in (api.min_version, api.max_version)]
VALID_BATCH = encode_record_batch(0, [Record(n, b"k", b"v" * n, (("h", None),)) for n in range(20)])


def mutated(data: bytes, draw) -> bytes:
    """`data` with a few bytes flipped, cut or inserted: past the size check, into the decoders."""
    buffer = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(len(buffer) - 1, 0)))
        if kind == "flip" and buffer:
            buffer[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del buffer[at: at + draw(st.integers(1, 8))]
        else:
            buffer[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(buffer)


@st.composite
def frame_streams(draw) -> bytes:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["valid", "mutated", "random", "random-body"]))
        if kind == "valid":
            parts.append(draw(st.sampled_from(VALID_FRAMES)))
        elif kind == "mutated":
            frame = draw(st.sampled_from(VALID_FRAMES))
            body = mutated(frame[4:], draw)
            parts.append(struct.pack(">i", len(body)) + body)
        elif kind == "random":
            parts.append(draw(st.binary(max_size=64)))
        else:
            api_key = draw(st.sampled_from(sorted(SUPPORTED_APIS) + [7, 99, -1]))
            frame = struct.pack(">hhih", api_key, draw(st.integers(-1, 12)), 1, -1) + draw(st.binary(max_size=64))
            parts.append(struct.pack(">i", len(frame)) + frame)
    return b"".join(parts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=frame_streams(), chunk=st.integers(1, 97))
def test_any_byte_stream_gives_requests_or_refusals_and_stops_after_a_closing_refusal(stream, chunk):
    decoder = RequestDecoder(request_bytes_max=4096)
    events = []
    for start in range(0, len(stream), chunk):
        decoder.receive_data(stream[start: start + chunk])
        while (event := decoder.next_event()) is not None:
            events.append(event)
    assert all(isinstance(event, (Request, RequestRefused)) for event in events)
    closing = [index for index, event in enumerate(events)
               if isinstance(event, RequestRefused) and event.close_connection]
    assert not closing or closing[0] == len(events) - 1
    assert decoder.closed == bool(closing)


def resealed(batch: bytes) -> bytes:
    """`batch` with a CRC-32C that matches its (mutated) bytes: the fuzz reaches the records."""
    if len(batch) < 21:
        return batch
    return batch[:17] + struct.pack(">I", crc32c.crc32c(batch[21:])) + batch[21:]


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_any_record_set_gives_a_batch_or_a_refusal(data):
    records = data.draw(st.one_of(st.binary(max_size=200),
                                  st.builds(lambda: VALID_BATCH).map(lambda batch: mutated(batch, data.draw)),
                                  st.builds(lambda: VALID_BATCH).map(lambda batch: resealed(mutated(batch, data.draw)))))
    result = decode_produce_records(records, data.draw(st.integers(3, 7)), batch_bytes_max=4096,
                                    batch_decompressed_bytes_max=4096)
    assert isinstance(result, (ProducedBatch, BatchRefused))
