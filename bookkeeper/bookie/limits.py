"""What one client can make a bookie hold (S4): the limits of its connections, named once.

Their own module, below the server (server.py, which enforces them and says how), the connection
(connection.py) and the bookie's config record (config.py), so that those three need not import
each other for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from bookkeeper.protocol.frame import AUTH_CREDENTIALS_BYTES_MAX, ENTRY_BYTES_MAX_DEFAULT, FRAME_BYTES_MAX_DEFAULT

# the longest credentials (a token) the codec takes and the frame around them
AUTH_FRAME_BYTES_MAX = AUTH_CREDENTIALS_BYTES_MAX + 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT
    in_flight_max: int = 10_000
    idle_timeout_s: float = 30.0
    connections_max: int = 4096
    connections_per_host_max: int = 1024
    unsent_bytes_max: int = 16 * 2**20
    unsent_timeout_s: float = 30.0
    first_frame_timeout_s: float = 10.0
    partial_bytes_max: int = 256 * 2**20
    global_unsent_bytes_max: int = 256 * 2**20
    unsent_connections_max: int = 64
    unauthenticated_partial_bytes_max: int = 16 * 2**10
    reserved_open_files: int = 256
