"""A server's settings: where it listens, what it creates, and its named limits (docs/serving.md
lists each; the server exports them with its counters)."""

from __future__ import annotations

from dataclasses import dataclass

from bookkeeper.errors import ConfigError
from bookkeeper.security.tls import ServerTls
from bookkeeper.security.tokens import TokenKey
from dlog.serve.kafka import BATCH_BYTES_MAX_DEFAULT, REQUEST_BYTES_MAX_DEFAULT

SERVER_ID_MAX = 2**31 - 1  # a Kafka node id is an int32
SERVER_IDS_TRIED_MAX = 1_000  # without --id: the lowest free id below this


@dataclass(frozen=True, slots=True)
class ServerSettings:
    server_id: int | None = None  # None: the lowest id no live server has
    host: str = "127.0.0.1"  # the address the Kafka port listens on
    kafka_port: int = 9092  # 0: any free port
    advertised_host: str | None = None  # what clients are told to connect to (default: host)
    session_timeout_s: float = 6.0  # ZooKeeper session: a killed server's streams move after it
    auto_create_topics: bool = False  # a produce or metadata request for an unknown topic creates it
    ensemble: int = 3  # of the streams the server creates
    write_quorum: int = 2
    ack_quorum: int = 2
    linger_ms: float = 1.0  # how long the writer waits to put more producers' records into one entry
    lock_wait_s: float = 2.0  # how long taking a free stream waits for its writer lock
    connections_max: int = 1_024  # client connections; one more is closed at once
    in_flight_per_connection_max: int = 32  # requests read and not yet answered, per connection
    unsent_bytes_max: int = 16 << 20  # answers queued on one connection before it stops reading
    request_bytes_max: int = REQUEST_BYTES_MAX_DEFAULT  # one request frame
    batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT  # one produced record batch
    owned_streams_max: int = 10_000  # streams one server owns at once
    tail_bytes_max: int = 8 << 20  # per owned stream: recent durable records kept for fetches
    readers_per_connection_max: int = 64  # open stream readers one connection's fetches keep
    fetch_bytes_max: int = 64 << 20  # one fetch answer, whatever the client asks
    writer_buffer_bytes_max: int = 64 << 20  # per owned stream: records buffered and in flight
    # security (docs/serving.md, "Security"): as a bookie's, made by the same flags
    tls: ServerTls | None = None  # the Kafka port speaks TLS (SSL / SASL_SSL)
    token_key: TokenKey | None = None  # clients authenticate with SASL PLAIN or OAUTHBEARER carrying a dlog token
    allow_anonymous: bool = False  # with a token key: clients that skip SASL act as admin (asked by name)
    auth_timeout_s: float = 10.0  # from accept: the TLS handshake and SASL done within it, else closed
    request_bytes_before_auth_max: int = 64 << 10  # one request frame before SASL succeeded
    dedup_replay_bytes_max: int = 8 << 20  # per owned stream: records durable between dedup snapshots
    offload: bool = True  # the policy runner offloads owned streams with a tier (docs/operations.md)

    def __post_init__(self) -> None:
        if self.server_id is not None and not 0 <= self.server_id <= SERVER_ID_MAX:
            raise ConfigError(f"bad server id {self.server_id}: use 0..{SERVER_ID_MAX}")
        if not 0 <= self.kafka_port <= 65535:
            raise ConfigError(f"bad Kafka port {self.kafka_port}: use 0..65535 (0: any free port)")
        if not 0.5 <= self.session_timeout_s <= 600:
            raise ConfigError(f"bad session timeout {self.session_timeout_s} s: use 0.5..600 s")
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble:
            raise ConfigError(f"bad replication {self.ensemble}/{self.write_quorum}/{self.ack_quorum}: "
                              "need ensemble >= write quorum >= ack quorum >= 1")
        for name in ("connections_max", "in_flight_per_connection_max", "unsent_bytes_max", "request_bytes_max",
                     "batch_bytes_max", "owned_streams_max", "tail_bytes_max", "readers_per_connection_max",
                     "fetch_bytes_max", "writer_buffer_bytes_max", "request_bytes_before_auth_max",
                     "dedup_replay_bytes_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"bad {name} {getattr(self, name)}: it must be at least 1")
        if not 0.1 <= self.auth_timeout_s <= 600:
            raise ConfigError(f"bad auth timeout {self.auth_timeout_s} s: use 0.1..600 s")

    @property
    def requires_auth(self) -> bool:
        """Clients must authenticate with SASL before anything but ApiVersions is answered."""
        return self.token_key is not None and not self.allow_anonymous

    @property
    def client_host(self) -> str:
        return self.advertised_host or self.host
