"""Every setting of a bookie, with its default and its check (dlog_tools/bookie_settings.py makes the
flags, the config file's keys and the docs from these fields and their defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bookkeeper.autorecovery.settings import RecoverySettings
from bookkeeper.bookie.gc import GC_GRACE_S_DEFAULT
from bookkeeper.bookie.limits import AUTH_FRAME_BYTES_MAX, ServerLimits
from bookkeeper.errors import ConfigError
from bookkeeper.meta.layout import DEFAULT_ROOT

if TYPE_CHECKING:  # only named here: the command line reads this module and need not load TLS or JWT
    from bookkeeper.security.tls import ServerTls
    from bookkeeper.security.tokens import TokenKey


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """A bookie's security settings. With neither a token key nor required client certificates,
    and without TLS, the bookie is open (every connection acts as `anonymous`, an admin)."""

    tls: ServerTls | None = None
    token_key: TokenKey | None = None
    allow_anonymous: bool = False  # connections that skip AUTH act as an admin: asked by name only

    @property
    def requires_auth(self) -> bool:
        certificates = self.tls is not None and self.tls.require_client_cert
        return (self.token_key is not None or certificates) and not self.allow_anonymous


@dataclass(frozen=True, slots=True)
class BookieConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 3181  # 0: any free port
    http_port: int | None = 0  # 0: any free port; None: no admin server
    zk: str | None = None  # "host:port[,host:port]"; None: no registration, cookie or GC (tests)
    zk_root: str = DEFAULT_ROOT
    zk_session_timeout_s: float = 10.0
    bookie_id: str | None = None  # default "host:port"
    rack: str | None = None
    # journal
    journal_sync: bool = True
    journal_group_bytes_max: int = 512 * 2**10
    journal_group_wait_us: int = 0
    journal_file_bytes_max: int = 256 * 2**20
    journal_prealloc_bytes: int = 16 * 2**20
    journal_buffered_bytes_max: int = 64 * 2**20
    # ledger storage
    entry_log_bytes_max: int = 256 * 2**20
    write_cache_bytes_max: int = 64 * 2**20
    entry_log_flush_bytes: int = 2 * 2**20  # fdatasync entry logs every this many bytes (0: at checkpoints)
    checkpoint_interval_s: float = 10.0
    # disk and read-only mode
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 10.0
    # garbage collection
    gc_interval_s: float = 600.0  # 0: only when asked (POST /api/v1/gc)
    # how often a secure bookie publishes its stored bytes per namespace and reads the cluster's
    # (the stored-bytes quota; bookkeeper/meta/usage.py); 0: never (no stored-bytes quota here)
    usage_interval_s: float = 30.0
    gc_grace_s: float = GC_GRACE_S_DEFAULT  # never drop a ledger first seen less than this ago
    compaction_live_fraction: float = 0.5
    # wire limits
    limits: ServerLimits = field(default_factory=ServerLimits)
    long_poll_waiters_max: int = 10_000
    # security (S1-S3): TLS and authentication on the bookie protocol and the admin endpoint,
    # ZooKeeper digest credentials of the bookie identity
    security: ServerSecurity = field(default_factory=ServerSecurity)
    http_open_paths: tuple[str, ...] = ("/health", "/metrics")  # served without a token
    zk_user: str | None = None
    zk_password: str | None = None
    # auto-recovery in this process (auditor candidate and replication worker); None: neither
    autorecovery: RecoverySettings | None = field(default_factory=RecoverySettings)
    # latency probes (bookkeeper/bookie/probes.py): event-loop lag and journal waits as histograms
    latency_probes: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is outside 0..65535")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http port {self.http_port} is outside 0..65535")
        if not 0 < self.disk_usage_threshold <= 1:
            raise ConfigError(f"disk usage threshold {self.disk_usage_threshold} must be in (0, 1]")
        if not 0 < self.disk_usage_lwm <= self.disk_usage_threshold:
            raise ConfigError(f"disk usage low-water mark {self.disk_usage_lwm} must be in "
                              f"(0, threshold {self.disk_usage_threshold}]")
        if self.gc_grace_s < 0:
            raise ConfigError(f"gc grace {self.gc_grace_s} s must be >= 0")
        if not 0 <= self.compaction_live_fraction <= 1:
            raise ConfigError("compaction live fraction must be in [0, 1]")
        if self.limits.entry_bytes_max > self.limits.frame_bytes_max:
            raise ConfigError(f"maximum entry size {self.limits.entry_bytes_max} exceeds the "
                              f"maximum frame size {self.limits.frame_bytes_max}")
        if self.limits.unauthenticated_partial_bytes_max < AUTH_FRAME_BYTES_MAX:
            raise ConfigError(f"bytes before AUTH {self.limits.unauthenticated_partial_bytes_max} are "
                              f"fewer than the longest AUTH frame ({AUTH_FRAME_BYTES_MAX}): raise "
                              "--max-partial-bytes-before-auth")
        if (self.zk_user is None) != (self.zk_password is None):
            raise ConfigError("ZooKeeper credentials need both a user and a password")
        if not self.zk_root.startswith("/") or self.zk_root.endswith("/"):
            raise ConfigError(f"zk root {self.zk_root!r} must start with '/' and not end with it")

    @property
    def journal_dir(self) -> Path:
        return Path(self.data_dir) / "journal"

    @property
    def ledgers_dir(self) -> Path:
        return Path(self.data_dir) / "ledgers"
