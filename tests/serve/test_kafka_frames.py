"""The Kafka framing and dispatch codec decodes every listed API version as kafka-python's client
encodes it, answers in a form kafka-python's client decodes, and refuses bad frames as Kafka does."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from bookkeeper.errors import InvariantError
from dlog.serve.kafka import (
    SUPPORTED_APIS,
    ErrorCode,
    Request,
    RequestDecoder,
    RequestHeader,
    RequestRefused,
    SaslToken,
    api_versions_response,
    encode_response,
    encode_sasl_token,
)
from dlog.serve.kafka.apis import API_VERSIONS, PRODUCE
from tests.serve.samples import framed_request, sample_message

EVERY_VERSION = [(api.key, version) for api in SUPPORTED_APIS.values()
                 for version in range(api.min_version, api.max_version + 1)]


def only_event(data: bytes, **decoder_args) -> Request | RequestRefused:
    decoder = RequestDecoder(**decoder_args)
    decoder.receive_data(data)
    event = decoder.next_event()
    assert decoder.next_event() is None
    return event


@pytest.mark.parametrize("api_key,version", EVERY_VERSION,
                         ids=[f"{SUPPORTED_APIS[k].name}-v{v}" for k, v in EVERY_VERSION])
def test_every_listed_version_decodes_what_the_kafka_python_client_encodes(api_key, version):
    api = SUPPORTED_APIS[api_key]
    sent = sample_message(api.request, version)
    event = only_event(framed_request(sent, correlation_id=4242))
    assert isinstance(event, Request), event
    assert event.header == RequestHeader(api_key, version, 4242, "sample-client")
    assert event.body.to_dict() == sent.to_dict()


@pytest.mark.parametrize("api_key,version", EVERY_VERSION,
                         ids=[f"{SUPPORTED_APIS[k].name}-v{v}" for k, v in EVERY_VERSION])
def test_every_listed_version_answers_what_the_kafka_python_client_decodes(api_key, version):
    api = SUPPORTED_APIS[api_key]
    answer = sample_message(api.response, version)
    if api_key == API_VERSIONS:
        answer.error_code = 0  # an error answer is always v0 (below)
    wire = encode_response(RequestHeader(api_key, version, 77, "c"), answer)
    (size,) = struct.unpack_from(">i", wire)
    assert size == len(wire) - 4
    decoded = api.response[version].decode(wire[4:], header=True)
    assert decoded.header.correlation_id == 77
    assert decoded.to_dict() == answer.to_dict()


def test_api_versions_lists_the_table_with_produce_advertised_from_v0():
    answer = ApiVersionsResponse.decode(bytes(api_versions_response(2).encode(version=2)), version=2)
    listed = {entry.api_key: (entry.min_version, entry.max_version) for entry in answer.api_keys}
    assert listed == {api.key: (api.min_version, api.max_version) for api in SUPPORTED_APIS.values()
                      if api.key != PRODUCE} | {PRODUCE: (0, 7)}
    assert SUPPORTED_APIS[PRODUCE].min_version == 3  # decoded from v3 only


def test_an_unknown_api_versions_version_gets_the_v0_list_and_the_connection_stays():
    decoder = RequestDecoder()
    newer = ApiVersionsRequest(version=3, client_software_name="librdkafka", client_software_version="2")
    decoder.receive_data(framed_request(newer, correlation_id=5) + framed_request(ApiVersionsRequest(version=2), 6))
    refused = decoder.next_event()
    assert isinstance(refused, RequestRefused) and not refused.close_connection
    assert (refused.error, refused.correlation_id, refused.api_version) == (ErrorCode.UNSUPPORTED_VERSION, 5, 3)
    # kafka-python's client reads it as it reads a broker's: v0 body (error set), header v0
    answer = ApiVersionsResponse[3].decode(refused.response[4:], header=True)
    assert answer.header.correlation_id == 5 and answer.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert {entry.api_key for entry in answer.api_keys} == set(SUPPORTED_APIS)
    follow = decoder.next_event()
    assert isinstance(follow, Request) and follow.header.api_version == 2


@pytest.mark.parametrize("message", [MetadataRequest(version=9, topics=None),
                                     ProduceRequest(version=2, acks=1, timeout_ms=10, topic_data=[])],
                         ids=["Metadata-v9", "Produce-v2-advertised-not-decoded"])
def test_an_unsupported_version_of_another_api_closes_the_connection_naming_the_request(message):
    decoder = RequestDecoder()
    decoder.receive_data(framed_request(message, correlation_id=31))
    refused = decoder.next_event()
    assert isinstance(refused, RequestRefused) and refused.close_connection and refused.response is None
    assert (refused.error, refused.correlation_id, refused.client_id) == (ErrorCode.UNSUPPORTED_VERSION, 31, "sample-client")
    decoder.receive_data(framed_request(ApiVersionsRequest(version=0), 32))
    assert decoder.closed and decoder.next_event() is None


def test_an_unknown_api_key_closes_the_connection_as_kafka_does():
    frame = struct.pack(">hhih", 1000, 0, 9, 1) + b"x"
    refused = only_event(struct.pack(">i", len(frame)) + frame)
    assert isinstance(refused, RequestRefused) and refused.close_connection
    assert (refused.error, refused.api_key, refused.correlation_id, refused.client_id) == (ErrorCode.INVALID_REQUEST, 1000, 9, "x")


@pytest.mark.parametrize("size", [1025, -1, 2**31 - 1])
def test_a_frame_over_the_limit_or_negative_is_refused_at_its_size_before_its_body(size):
    decoder = RequestDecoder(request_bytes_max=1024)
    decoder.receive_data(struct.pack(">i", size))  # the body never needs to arrive
    refused = decoder.next_event()
    assert isinstance(refused, RequestRefused) and refused.close_connection
    assert refused.error == ErrorCode.INVALID_REQUEST and "request_bytes_max" in refused.reason
    assert decoder.closed and decoder.pending_bytes == 0


def test_a_frame_at_the_limit_is_decoded():
    request = FindCoordinatorRequest(version=0, key="g" * 100)
    wire = framed_request(request, 3)
    assert isinstance(only_event(wire, request_bytes_max=len(wire) - 4), Request)
    assert isinstance(only_event(wire, request_bytes_max=len(wire) - 5), RequestRefused)


def test_requests_split_at_every_byte_come_out_whole_and_in_order():
    wire = b"".join(framed_request(FindCoordinatorRequest(version=1, key=f"group-{n}", key_type=0), n)
                    for n in range(3))
    decoder, events = RequestDecoder(), []
    for index in range(len(wire)):
        decoder.receive_data(wire[index: index + 1])
        while (event := decoder.next_event()) is not None:
            events.append(event)
    assert [(event.header.correlation_id, event.body.key) for event in events] == \
        [(n, f"group-{n}") for n in range(3)]
    assert decoder.pending_bytes == 0


def body_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    frame = struct.pack(">hhih", api_key, version, correlation_id, 3) + b"cli" + body
    return struct.pack(">i", len(frame)) + frame


@pytest.mark.parametrize("body,problem", [
    (struct.pack(">h", 50) + b"short", "ends inside a field"),  # the key string runs past the frame
    (struct.pack(">h", 1) + b"g" + b"extra", "after its last field"),
    (struct.pack(">h", 2) + b"\xff\xfe", "does not parse"),  # not UTF-8
    (b"\x00", "does not parse"),
], ids=["truncated-inside-a-string", "trailing-bytes", "not-utf8", "garbage"])
def test_a_malformed_body_is_invalid_request_naming_its_correlation_id(body, problem):
    refused = only_event(body_frame(10, 0, 4711, body))  # FindCoordinator v0: key string only
    assert isinstance(refused, RequestRefused) and refused.close_connection
    assert (refused.error, refused.correlation_id, refused.api_key) == (ErrorCode.INVALID_REQUEST, 4711, 10)
    assert problem in refused.reason


def test_a_frame_shorter_than_a_header_is_invalid_request():
    refused = only_event(struct.pack(">i", 9) + struct.pack(">hhi", 3, 1, 12) + b"\x00")
    assert isinstance(refused, RequestRefused) and refused.close_connection
    assert (refused.error, refused.correlation_id) == (ErrorCode.INVALID_REQUEST, 12)


def test_produce_with_acks_zero_expects_no_response():
    for acks, expected in [(0, False), (1, True), (-1, True)]:
        produce = ProduceRequest(version=7, transactional_id=None, acks=acks, timeout_ms=10, topic_data=[])
        assert only_event(framed_request(produce, 1)).expects_response is expected


def test_a_response_of_another_api_is_a_bug_not_an_answer():
    request = only_event(framed_request(FetchRequest(version=4, replica_id=-1, max_wait_ms=1, min_bytes=1,
                                                     max_bytes=1, isolation_level=0, topics=[]), 1))
    with pytest.raises(InvariantError):
        encode_response(request.header, api_versions_response(0))
    assert request.response(throttle_time_ms=0, responses=[]).API_KEY == 1


def test_after_sasl_handshake_v0_bare_tokens_come_out_as_tokens():
    decoder = RequestDecoder()
    decoder.raw_sasl_tokens = True
    decoder.receive_data(encode_sasl_token(b"\x00user\x00secret"))
    assert decoder.next_event() == SaslToken(b"\x00user\x00secret")
    decoder.raw_sasl_tokens = False
    decoder.receive_data(framed_request(ApiVersionsRequest(version=1), 2))
    assert isinstance(decoder.next_event(), Request)


def test_the_error_codes_are_the_numbers_kafka_clients_know():
    import kafka.errors
    for code in ErrorCode:
        if code != ErrorCode.NONE:
            known = kafka.errors.for_code(int(code))
            assert known.errno == int(code) and known is not kafka.errors.UnknownError or code == ErrorCode.UNKNOWN_SERVER_ERROR, code
