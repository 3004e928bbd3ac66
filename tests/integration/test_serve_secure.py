"""The Kafka port of a secure cluster (issue 22, item 8): a `dlog serve` process given the bookies'
certificate and token key speaks TLS and SASL only. Real clients (librdkafka through confluent-kafka,
kafka-python, aiokafka) produce and consume with a dlog token as the PLAIN password or the
OAUTHBEARER token; anonymous clients, a token the cluster did not sign, a token of another
namespace and a consume-only token that produces are refused with Kafka's errors; garbage SASL
bytes close that one connection with one log line."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest

from bookkeeper.security.tokens import TokenKey, create_token
from dlog_tools.secure import write_admin_config
from tests.integration.serving import ServeProcess, serve_processes
from tests.serve.samples import framed_request

NAMESPACE = "orders"  # provisioned by the secure_cluster fixture
DEADLINE_S = 60.0
SASL_AUTHENTICATION_FAILED, TOPIC_AUTHORIZATION_FAILED = 58, 29


def start_secure(start, secure_cluster) -> ServeProcess:
    """A server of namespace `orders` on the secure cluster, run with the admin's client.toml and
    the bookies' certificate and token key, as `dlog standalone --secure` runs its own."""
    secure = secure_cluster.secure_dir
    admin_toml = write_admin_config(secure, secure_cluster.zk_address)
    return start(secure_cluster, NAMESPACE, "--auto-create-topics", "--tls-cert", str(secure.server_cert),
                 "--tls-key", str(secure.server_key), "--token-key", str(secure.token_key), replication=2,
                 env={"DLOG_CONFIG": str(admin_toml)})


@pytest.fixture(scope="module")
def secure_server(secure_cluster) -> Iterator[tuple[ServeProcess, object, str]]:
    with serve_processes(None) as start:
        yield start_secure(start, secure_cluster), secure_cluster.secure_dir, str(secure_cluster.secure_dir.ca_file)


def token(secure, *roles: str) -> str:
    return secure.token("app", list(roles), ttl_s=3600)


def topic_name() -> str:
    return f"secure-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------ the clients, as a user configures them


def librdkafka_config(server: ServeProcess, ca: str, mechanism: str, secret: str) -> dict[str, object]:
    config: dict[str, object] = {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_SSL",
                                 "ssl.ca.location": ca, "sasl.mechanisms": mechanism}
    if mechanism == "PLAIN":
        config.update({"sasl.username": "app", "sasl.password": secret})
    else:  # librdkafka asks confluent-kafka's oauth_cb for (token, expiry in seconds since the epoch)
        config["oauth_cb"] = lambda _config: (secret, time.time() + 3600)
    return config


def librdkafka_produce(config: dict[str, object], topic: str, values: list[bytes],
                       timeout_ms: int = 60_000) -> tuple[list[int], list[int]]:
    """(offsets acknowledged, error codes of the deliveries that failed)."""
    from confluent_kafka import Producer
    producer = Producer({**config, "linger.ms": 5, "message.timeout.ms": timeout_ms})
    offsets: list[int] = []
    errors: list[int] = []

    def delivered(error, message) -> None:
        if error is not None:
            errors.append(error.code())
        else:
            offsets.append(message.offset())

    for value in values:
        producer.produce(topic, value=value, on_delivery=delivered)
        producer.poll(0)
    producer.flush(DEADLINE_S)
    return offsets, errors


def librdkafka_consume(config: dict[str, object], topic: str, count: int) -> list[bytes]:
    from confluent_kafka import Consumer
    consumer = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message.value())
    finally:
        consumer.close()
    return got


def kafka_python_options(server: ServeProcess, ca: str, mechanism: str, secret: str) -> dict[str, object]:
    options: dict[str, object] = {"bootstrap_servers": server.bootstrap, "security_protocol": "SASL_SSL",
                                  "ssl_cafile": ca, "sasl_mechanism": mechanism}
    if mechanism == "PLAIN":
        options.update(sasl_plain_username="app", sasl_plain_password=secret)
    else:
        from kafka.net.sasl.oauth import AbstractTokenProvider

        class Provider(AbstractTokenProvider):
            def token(self) -> str:
                return secret

        options["sasl_oauth_token_provider"] = Provider()
    return options


def kafka_python_round_trip(options: dict[str, object], topic: str, values: list[bytes]) -> tuple[list[int], list]:
    from kafka import KafkaConsumer, KafkaProducer
    producer = KafkaProducer(**options)
    try:
        futures = [producer.send(topic, value=value) for value in values]
        producer.flush(DEADLINE_S)
        offsets = [future.get(DEADLINE_S).offset for future in futures]
    finally:
        producer.close()
    consumer = KafkaConsumer(topic, group_id=f"kp-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest", **options)
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < len(values) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                got.extend(message.value for message in batch)
    finally:
        consumer.close()
    return offsets, got


async def aiokafka_round_trip(server: ServeProcess, ca: str, secret: str, topic: str,
                              values: list[bytes]) -> tuple[list[int], list[bytes]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context
    options = {"bootstrap_servers": server.bootstrap, "security_protocol": "SASL_SSL",
               "ssl_context": create_ssl_context(cafile=ca), "sasl_mechanism": "PLAIN",
               "sasl_plain_username": "app", "sasl_plain_password": secret}
    producer = AIOKafkaProducer(**options)
    await producer.start()
    try:
        offsets = [(await producer.send_and_wait(topic, value=value)).offset for value in values]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, group_id=f"aio-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
                                **options)
    await consumer.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(DEADLINE_S):
            while len(got) < len(values):
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(message.value for message in batch)
    finally:
        await consumer.stop()
    return offsets, got


# ------------------------------------------------------------------ a raw TLS client, for what clients hide


class RawClient:
    """One TLS connection speaking Kafka frames (kafka-python's message classes) by hand."""

    def __init__(self, server: ServeProcess, ca: str) -> None:
        context = ssl.create_default_context(cafile=ca)
        self.sock = context.wrap_socket(socket.create_connection((server.host, server.port), timeout=20),
                                        server_hostname=server.host)
        self.correlation = 0

    def request(self, message) -> bytes | None:
        """Send `message`; its answer without the size prefix, or None when the server closed."""
        self.correlation += 1
        self.sock.sendall(framed_request(message, self.correlation))
        return self.frame()

    def authenticate(self, message: bytes, mechanism: str = "PLAIN", handshake: bool = True) -> int:
        """SaslHandshake v1 (unless done) and SaslAuthenticate v1 with `message`: its error code."""
        if handshake:
            assert self.request(SaslHandshakeRequest(version=1, mechanism=mechanism)) is not None
        answer = self.request(SaslAuthenticateRequest(version=1, auth_bytes=message))
        assert answer is not None, "closed without an answer"
        return SaslAuthenticateResponse[1].decode(answer, header=True).error_code

    def frame(self) -> bytes | None:
        head = self._exactly(4)
        if head is None:
            return None
        return self._exactly(struct.unpack(">i", head)[0])

    def _exactly(self, count: int) -> bytes | None:
        data = b""
        while len(data) < count:
            try:
                chunk = self.sock.recv(count - len(data))
            except (ConnectionError, ssl.SSLError):
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------ what works


@pytest.mark.parametrize("mechanism", ["PLAIN", "OAUTHBEARER"])
def test_librdkafka_produces_and_consumes_over_sasl_ssl_with_a_dlog_token(secure_server, mechanism):
    server, secure, ca = secure_server
    config = librdkafka_config(server, ca, mechanism, token(secure, f"produce:{NAMESPACE}", f"consume:{NAMESPACE}"))
    topic = topic_name()
    values = [f"{mechanism}-{n}".encode() for n in range(20)]
    offsets, errors = librdkafka_produce(config, topic, values)
    assert errors == [] and offsets == list(range(20))
    assert librdkafka_consume(config, topic, 20) == values


@pytest.mark.parametrize("mechanism", ["PLAIN", "OAUTHBEARER"])
def test_kafka_python_produces_and_consumes_over_sasl_ssl_with_a_dlog_token(secure_server, mechanism):
    server, secure, ca = secure_server
    options = kafka_python_options(server, ca, mechanism, token(secure, f"produce:{NAMESPACE}",
                                                                f"consume:{NAMESPACE}"))
    values = [f"kp-{mechanism}-{n}".encode() for n in range(15)]
    offsets, got = kafka_python_round_trip(options, topic_name(), values)
    assert offsets == list(range(15)) and got == values


def test_aiokafka_produces_and_consumes_over_sasl_ssl_with_plain(secure_server):
    server, secure, ca = secure_server
    values = [f"aio-{n}".encode() for n in range(10)]
    offsets, got = asyncio.run(aiokafka_round_trip(server, ca, token(secure, f"produce:{NAMESPACE}",
                                                                     f"consume:{NAMESPACE}"), topic_name(), values))
    assert offsets == list(range(10)) and got == values


# ------------------------------------------------------------------ what is refused


def test_a_token_of_another_namespace_or_a_consume_only_token_cannot_produce(secure_server):
    server, secure, ca = secure_server
    topic = topic_name()
    good = librdkafka_config(server, ca, "PLAIN", token(secure, f"produce:{NAMESPACE}", f"consume:{NAMESPACE}"))
    assert librdkafka_produce(good, topic, [b"first"]) == ([0], [])
    for roles in (["produce:shop", "consume:shop"], [f"consume:{NAMESPACE}"]):
        config = librdkafka_config(server, ca, "PLAIN", token(secure, *roles))
        offsets, errors = librdkafka_produce(config, topic, [b"refused"], timeout_ms=10_000)
        assert offsets == [] and errors == [TOPIC_AUTHORIZATION_FAILED], (roles, errors)
    consumer = librdkafka_config(server, ca, "OAUTHBEARER", token(secure, f"consume:{NAMESPACE}"))
    assert librdkafka_consume(consumer, topic, 1) == [b"first"]  # nothing refused was written; a consumer reads


def test_a_token_the_cluster_did_not_sign_fails_sasl_authentication(secure_server):
    server, secure, ca = secure_server
    forged = create_token(TokenKey("HS256", b"x" * 40), "app", [f"produce:{NAMESPACE}"], ttl_s=3600)
    from confluent_kafka import KafkaError, Producer
    failures: list[int] = []
    producer = Producer({**librdkafka_config(server, ca, "PLAIN", forged),
                         "error_cb": lambda error: failures.append(error.code())})
    deadline = time.monotonic() + DEADLINE_S
    while KafkaError._AUTHENTICATION not in failures and time.monotonic() < deadline:
        producer.poll(0.2)
    assert KafkaError._AUTHENTICATION in failures, failures
    # the answer librdkafka read: SaslAuthenticate with SASL_AUTHENTICATION_FAILED, then the close
    raw = RawClient(server, ca)
    try:
        assert raw.authenticate(f"\0app\0{forged}".encode()) == SASL_AUTHENTICATION_FAILED
        assert raw.frame() is None
    finally:
        raw.close()


def test_an_anonymous_client_gets_api_versions_and_then_the_connection_closes(secure_server):
    server, _, ca = secure_server
    raw = RawClient(server, ca)
    try:
        assert raw.request(ApiVersionsRequest(version=2)) is not None
        assert raw.request(MetadataRequest(version=1, topics=None)) is None
    finally:
        raw.close()
    # a client configured without SASL: nothing it produces is acknowledged
    offsets, errors = librdkafka_produce({"bootstrap.servers": server.bootstrap, "security.protocol": "SSL",
                                          "ssl.ca.location": ca}, topic_name(), [b"anonymous"], timeout_ms=5_000)
    assert offsets == [] and len(errors) == 1, errors


def test_garbage_sasl_bytes_close_that_connection_only_with_one_log_line(secure_cluster):
    secure, ca = secure_cluster.secure_dir, str(secure_cluster.secure_dir.ca_file)
    with serve_processes(None) as start:
        server = start_secure(start, secure_cluster)
        garbage_sasl(server, secure, ca)
        assert server.stop() == 0
        log = server.process.stderr.read()
    assert "Traceback" not in log, log
    refused = [line for line in log.splitlines() if "authentication failed" in line]
    assert len(refused) == 1 and "SASL PLAIN" in refused[0], log  # rate-limited: one line for three


def garbage_sasl(server: ServeProcess, secure, ca: str) -> None:
    good = RawClient(server, ca)
    try:
        assert good.request(SaslHandshakeRequest(version=1, mechanism="OAUTHBEARER")) is not None
        for garbage in (b"\xff\xfe not sasl", b"n,,\x01auth=Basic x\x01\x01", b"\0\0\0\0"):
            bad = RawClient(server, ca)
            try:
                assert bad.authenticate(garbage) == SASL_AUTHENTICATION_FAILED
                assert bad.frame() is None
            finally:
                bad.close()
        # the other connection, mid-handshake, is untouched: it authenticates and is served
        message = f"n,,\x01auth=Bearer {token(secure, f'consume:{NAMESPACE}')}\x01\x01".encode()
        assert good.authenticate(message, handshake=False) == 0
        assert good.request(MetadataRequest(version=1, topics=None)) is not None
    finally:
        good.close()


def test_a_connection_whose_token_expires_is_closed_at_its_next_request(secure_server):
    server, secure, ca = secure_server
    raw = RawClient(server, ca)
    try:
        short = secure.token("app", [f"consume:{NAMESPACE}"], ttl_s=2)
        assert raw.authenticate(f"\0app\0{short}".encode()) == 0
        assert raw.request(MetadataRequest(version=1, topics=None)) is not None  # served while valid
        deadline = time.monotonic() + 30
        while raw.request(MetadataRequest(version=1, topics=None)) is not None:
            assert time.monotonic() < deadline, "the connection outlived its token"
            time.sleep(0.2)
    finally:
        raw.close()


def test_a_server_off_loopback_without_tls_and_tokens_refuses_to_start_in_one_line():
    import subprocess
    import sys

    from tests.helpers import one_error_line
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "serve", "--zk", "127.0.0.1:1", "--host",
                             "10.0.0.1"], capture_output=True, text=True, timeout=60)
    line = one_error_line(result)
    assert "a Kafka server on 10.0.0.1" in line and "--insecure-plaintext" in line, line
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "serve", "--zk", "127.0.0.1:1", "--host",
                             "10.0.0.1", "--insecure-plaintext"], capture_output=True, text=True, timeout=60)
    line = one_error_line(result)
    assert "--token-key" in line and "--allow-anonymous" in line, line


def test_a_produce_only_token_cannot_join_groups_and_only_an_admin_creates_topics(secure_server):
    """Groups commit subscriptions, which only consumers (and admins) may; CreateTopics is an
    admin's (a producer's topics are created by its first produce)."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic
    server, secure, ca = secure_server
    producer_only = librdkafka_config(server, ca, "PLAIN", token(secure, f"produce:{NAMESPACE}"))
    topic = topic_name()
    assert librdkafka_produce(producer_only, topic, [b"x"]) == ([0], [])  # auto-created by a producer
    consumer = Consumer({**producer_only, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        error = None
        while error is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is not None, "a producer-only token joined a group"
                error = message.error().code()
        assert error == KafkaError.GROUP_AUTHORIZATION_FAILED, error
    finally:
        consumer.close()
    for roles, expected in (([f"produce:{NAMESPACE}", f"consume:{NAMESPACE}"], KafkaError.TOPIC_AUTHORIZATION_FAILED),
                            ([f"admin:{NAMESPACE}"], None)):
        admin = AdminClient(librdkafka_config(server, ca, "PLAIN", token(secure, *roles)))
        created = admin.create_topics([NewTopic(topic_name(), 1, 2)], request_timeout=30)
        (future,) = created.values()
        if expected is None:
            assert future.result(DEADLINE_S) is None
        else:
            with pytest.raises(Exception) as refused:
                future.result(DEADLINE_S)
            assert refused.value.args[0].code() == expected, refused.value


def test_allow_anonymous_serves_clients_without_sasl_and_still_authenticates_those_with_it(secure_cluster):
    """`--allow-anonymous` (asked for by name) lets clients that skip SASL act as admin; a client
    that authenticates is its token's principal, so a consume-only token still cannot produce."""
    secure = secure_cluster.secure_dir
    namespace = "billing"  # its own: a namespace's servers share one security setting (Metadata names them all)
    admin_toml = write_admin_config(secure, secure_cluster.zk_address)
    with serve_processes(None) as start:
        server = start(secure_cluster, namespace, "--auto-create-topics", "--token-key", str(secure.token_key),
                       "--allow-anonymous", replication=2, env={"DLOG_CONFIG": str(admin_toml)})
        topic = topic_name()
        assert librdkafka_produce({"bootstrap.servers": server.bootstrap}, topic, [b"anonymous"]) == ([0], [])
        consumer_only = {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "PLAIN", "sasl.username": "app",
                         "sasl.password": token(secure, f"consume:{namespace}")}
        offsets, errors = librdkafka_produce(consumer_only, topic, [b"refused"], timeout_ms=10_000)
        assert offsets == [] and errors == [TOPIC_AUTHORIZATION_FAILED], errors
        assert librdkafka_consume(consumer_only, topic, 1) == [b"anonymous"]
