"""The serving tier's asyncio driver (`dlog serve`): a server that registers in ZooKeeper, owns
streams through their writer locks, and serves them to Kafka clients over the codec of
`dlog.serve.kafka`, following the routing rules of `dlog.serve.ownership`.

- `settings`: the server's settings and named limits.
- `registry`: this server's ephemeral registration, the live servers, who holds a stream's lock.
- `owned`: a stream this server owns: its one writer (every producer's records go through it),
  the durable end position, the recent tail kept in memory for fetches, the producer dedup table.
- `streams`: which streams this server owns; taking and handing back ownership.
- `connection`: one client connection: TLS, SASL authentication, framing, in-order answers, the
  in-flight and unsent bounds.
- `api`: the Kafka requests, answered over dlog streams and authorized with the roles of the
  namespace (`bookkeeper.security.authz`).
- `server`: the listener, the connection bound, start and a clean stop (writers closed, locks
  released, registration removed).
"""

from dlog.server.server import KafkaServer
from dlog.server.settings import ServerSettings

__all__ = ["KafkaServer", "ServerSettings"]
