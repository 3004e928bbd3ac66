"""The SASL client messages of the Kafka port (dlog.serve.kafka.sasl): the token comes out of what
clients send for PLAIN and OAUTHBEARER, and anything else is one reason, never an exception."""

from __future__ import annotations

import pytest

from dlog.serve.kafka.sasl import OAUTHBEARER, PLAIN, SASL_BYTES_MAX, SaslCredentials, SaslRefused, client_credentials


@pytest.mark.parametrize("message,expected", [
    (b"\0app\0tok.en.sig", SaslCredentials("tok.en.sig", "app")),
    (b"app\0app\0tok", SaslCredentials("tok", "app")),  # authzid = user: allowed
])
def test_plain_gives_the_password_as_the_token(message, expected):
    assert client_credentials(PLAIN, message) == expected


@pytest.mark.parametrize("message,expected", [
    (b"n,,\x01auth=Bearer tok.en.sig\x01\x01", SaslCredentials("tok.en.sig", None)),  # librdkafka, kafka-python
    (b"n,a=app,\x01host=h\x01auth=Bearer tok\x01port=1\x01\x01", SaslCredentials("tok", None)),  # RFC 7628 pairs
])
def test_oauthbearer_gives_the_bearer_token(message, expected):
    assert client_credentials(OAUTHBEARER, message) == expected


@pytest.mark.parametrize("mechanism,message", [
    (PLAIN, b"no separators"),
    (PLAIN, b"\0app\0"),  # no password
    (PLAIN, b"other\0app\0tok"),  # acting for another principal
    (PLAIN, b"\0a\0b\0c"),
    (PLAIN, b"\xff\xfe\0app\0tok"),  # not UTF-8
    (OAUTHBEARER, b"n,,\x01auth=Basic dXNlcg==\x01\x01"),
    (OAUTHBEARER, b"n,,\x01auth=Bearer tok\x01"),  # not ended by \x01\x01
    (OAUTHBEARER, b"p=tls-unique,,\x01auth=Bearer tok\x01\x01"),  # channel binding: not offered
    (OAUTHBEARER, b"n,,\x01host=h\x01\x01"),  # no auth pair
    (OAUTHBEARER, b"n,,\x01auth=Bearer \x01\x01"),  # empty token
    (OAUTHBEARER, b"\x01"),  # the client's answer to an error challenge, out of turn
    ("SCRAM-SHA-256", b"n,,n=app,r=nonce"),
    (PLAIN, b"\0app\0" + b"t" * SASL_BYTES_MAX),
])
def test_anything_else_is_refused_with_a_reason(mechanism, message):
    refused = client_credentials(mechanism, message)
    assert isinstance(refused, SaslRefused) and refused.reason and "\n" not in refused.reason
