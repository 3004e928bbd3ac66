"""A real single-node ZooKeeper server, run as a child java process, for tests and local clusters.

The jars come from the installed pyspark wheel (it ships ZooKeeper), else ``$ZK_CLASSPATH``,
else Debian's ``/usr/share/java``. The server binds 127.0.0.1 only and dies with its parent.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import ConfigError, MetadataError
from bookkeeper.meta.ports import check_port_free, listens_on, port_in_use

ZOOKEEPER_MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"  # a member of an ensemble

# Measured on a 2-CPU box (median of 6 starts, log4j on the classpath): no flags 0.40 s,
# these flags 0.31 s. SerialGC and C1-only also keep a tiny test server from claiming
# GC threads and heap sized for a big machine.
#
# Sizes: the largest packet dlog sends or receives is a multi of a Spark sink's routed commit or
# the children of a stream directory (well under 1 MiB each); `jute.maxbuffer` refuses anything
# bigger, on the request path (a node of 1 MiB is refused, not stored). The heap holds the data tree
# plus a snapshot being written and the requests in flight: 512 MiB keeps a tree of about 150 MiB
# (millions of dlog's small nodes) with room. Only the cluster's identities may create nodes at all
# on a secure cluster (dlog_tools/secure.lock_down): anonymous clients cannot fill it.
JUTE_MAX_BUFFER_BYTES = 1024 * 1024
HEAP_BYTES_MAX = 512 * 1024 * 1024
JVM_FLAGS = [f"-Xmx{HEAP_BYTES_MAX // 2**20}m", f"-Djute.maxbuffer={JUTE_MAX_BUFFER_BYTES}", "-XX:+UseSerialGC",
             "-XX:TieredStopAtLevel=1", "-Dzookeeper.admin.enableServer=false"]

# Globs inside pyspark/jars: ZooKeeper itself and what ZooKeeperServerMain needs to run.
PYSPARK_JAR_GLOBS = ["zookeeper-[0-9]*.jar", "zookeeper-jute-*.jar", "slf4j-api-*.jar",
                     "metrics-core-*.jar", "snappy-java-*.jar"]
# Optional: an slf4j provider, so the server's errors (e.g. "Address already in use") reach the
# log file instead of slf4j's no-op logger. Without a config file log4j2 prints ERROR and up.
PYSPARK_LOGGING_JAR_GLOBS = ["log4j-slf4j2-impl-*.jar", "log4j-api-*.jar", "log4j-core-*.jar"]

DEBIAN_JAVA_DIR = Path("/usr/share/java")
DEBIAN_DEPENDENCY_JARS = ["zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar", "metrics-core.jar",
                          "snappy-java.jar", "netty-all.jar", "audience-annotations.jar",
                          "commons-cli.jar", "commons-io.jar", "jline.jar"]

LOG_TAIL_LINES = 20
READY_POLL_INTERVAL_S = 0.05
PROBE_TIMEOUT_S = 1.0
PR_SET_PDEATHSIG = 1
PORTS_REMEMBERED = 1024  # ports pick_free_port handed out that it does not hand out again
_handed_out: dict[int, None] = {}  # in the order handed out (oldest forgotten first)
PRIVATE_PORTS_FROM = 20000  # ports we pick for servers: [20000, start of the ephemeral range)
PORT_PICK_ATTEMPTS = 50
PORT_HINT = "stop that process or choose another port"
PRIVATE_DIR_MODE = 0o700  # the server's data is its user's only: directories 0700,
PRIVATE_UMASK = 0o077  # and the files java creates 0600


# ---------------------------------------------------------------------------------- discovery


def find_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise ConfigError("java not found: install a JRE (apt-get install -y openjdk-17-jre-headless)")
    return java


def find_classpath() -> str:
    """The classpath for ZooKeeperServerMain: pyspark's jars, then $ZK_CLASSPATH, then Debian's."""
    for finder in (_pyspark_classpath, _environment_classpath, _debian_classpath):
        classpath = finder()
        if classpath:
            return classpath
    raise ConfigError("ZooKeeper jars not found: install the spark extra (pip install 'dlog[spark]'), "
                      "set ZK_CLASSPATH to the server's classpath, "
                      "or apt-get install -y zookeeper (for /usr/share/java/zookeeper.jar)")


def _pyspark_classpath() -> str | None:
    # find_spec locates the package without importing it (importing pyspark takes seconds).
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    jars_dir = Path(next(iter(spec.submodule_search_locations))) / "jars"
    required = [_newest_match(jars_dir, pattern) for pattern in PYSPARK_JAR_GLOBS]
    if any(jar is None for jar in required):
        return None
    logging_jars = [_newest_match(jars_dir, pattern) for pattern in PYSPARK_LOGGING_JAR_GLOBS]
    if any(jar is None for jar in logging_jars):
        logging_jars = []
    return os.pathsep.join(str(jar) for jar in required + logging_jars)


def _newest_match(directory: Path, pattern: str) -> Path | None:
    matches = sorted(directory.glob(pattern))
    return matches[-1] if matches else None


def _environment_classpath() -> str | None:
    return os.environ.get("ZK_CLASSPATH") or None


def _debian_classpath() -> str | None:
    main_jar = DEBIAN_JAVA_DIR / "zookeeper.jar"
    if not main_jar.is_file():
        return None
    dependencies = [DEBIAN_JAVA_DIR / name for name in DEBIAN_DEPENDENCY_JARS]
    return os.pathsep.join(str(jar) for jar in [main_jar, *dependencies] if jar.is_file())


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, chosen below the kernel's ephemeral range, and not one
    this process handed out recently (the last `PORTS_REMEMBERED`).

    Another process can still take it before our server binds. Outgoing connections and servers bound
    to port 0 are the usual thieves, and both draw from the ephemeral range, so a port picked outside
    it is far less likely to be stolen than one the kernel hands out from it. The memory keeps two
    servers started together (a cluster's bookies, each picked before any binds) off one port: a
    bookie given its sibling's port found the sibling's cookie and refused to start.
    """
    low, _high = _ephemeral_range()
    first = min(PRIVATE_PORTS_FROM, max(1024, low - 1))
    for _ in range(PORT_PICK_ATTEMPTS):
        port = random.randrange(first, low)
        if port not in _handed_out and _bindable(host, port):
            _handed_out[port] = None
            while len(_handed_out) > PORTS_REMEMBERED:
                del _handed_out[next(iter(_handed_out))]
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # crowded: let the kernel choose
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def four_letter_word(host: str, port: int, word: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Send a ZooKeeper four-letter command and return the whole answer ('' if none)."""
    with socket.create_connection((host, port), timeout=timeout_s) as connection:
        connection.sendall(word.encode("ascii"))
        chunks = []
        while chunk := connection.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


# ---------------------------------------------------------------------------------- dies with parent


def _parent_death_signal_setter() -> Callable[[], None] | None:
    """A preexec_fn making the child get SIGKILL when its parent dies (Linux only, else None)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent_pid = os.getpid()

    def set_parent_death_signal() -> None:
        # Runs in the forked child, so it only calls what was resolved before the fork.
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return set_parent_death_signal


# ---------------------------------------------------------------------------------- the server


class EmbeddedZooKeeper:
    """One ZooKeeper server process we started and alone may stop, bound to ``host``.

    Call ``start`` from a long-lived thread: Linux delivers the parent-death signal when the
    *thread* that forked the child exits, not only when the whole process does.
    """

    def __init__(self, data_dir: Path | str, port: int = 0, host: str = "127.0.0.1", tick_ms: int = 500,
                 log_path: Path | None = None, super_digest: str | None = None, *, server_id: int = 0,
                 peers: list[tuple[int, int]] | None = None) -> None:
        """`super_digest`: "user:base64(sha1(user:password))" of a ZooKeeper super user (dlog's
        admins under ACLs, bookkeeper/meta/acl.py). `server_id` and `peers` (every member's (quorum
        port, election port), in server-id order from 1) make this server a member of an ensemble
        (bookkeeper/meta/zkensemble.py)."""
        self.data_dir = Path(data_dir).absolute()
        self.super_digest = super_digest
        self.host = host
        self.tick_ms = tick_ms
        self.server_id = server_id
        self.peers = peers
        self.log_path = Path(log_path) if log_path is not None else self.data_dir / "zookeeper.log"
        self._port = port
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 30.0, *, wait: bool = True) -> None:
        """Start java and return once the server answers (`wait`; an ensemble member answers only
        once a quorum runs, so its ensemble starts every member first and waits after); the port
        is chosen on the first start."""
        if self.running:
            return
        java, classpath = find_java(), find_classpath()
        if self._port == 0:
            self._port = pick_free_port(self.host)
        check_port_free(self.host, self._port, "ZooKeeper", PORT_HINT)
        config_path = self._write_config()
        properties = []
        if self.super_digest:
            properties.append(f"-Dzookeeper.DigestAuthenticationProvider.superDigest={self.super_digest}")
        main_class = QUORUM_MAIN_CLASS if self.peers else ZOOKEEPER_MAIN_CLASS
        self._process = self._spawn([java, *JVM_FLAGS, *properties, "-cp", classpath, main_class,
                                     str(config_path)])
        self._paused = False
        if wait:
            self.wait_until_serving(timeout_s)

    def wait_until_serving(self, timeout_s: float = 30.0) -> None:
        """Return once the server answers requests; MetadataError with its log's tail if it does not."""
        self._wait_until_serving(monotonic_s() + timeout_s, timeout_s)

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Signal our process (by its pid) and, for a signal that ends it, reap it."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        if signum in (signal.SIGKILL, signal.SIGTERM):
            process.wait(timeout=30)
            self._process = None
            self._paused = False

    @property
    def mode(self) -> str | None:
        """"leader", "follower" or "standalone" (from `srvr`), or None when it does not serve."""
        try:
            answer = four_letter_word(self.host, self._port, "srvr")
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM our process, then SIGKILL if it lingers. Does nothing if it is not running."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            # A stopped (paused) process keeps SIGTERM pending until it is continued.
            process.send_signal(signal.SIGCONT)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None
        self._paused = False

    def restart(self, timeout_s: float = 30.0) -> None:
        """Stop, then start again on the same port and data directory."""
        self.stop()
        self.start(timeout_s=timeout_s)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open but nothing answers."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self._paused = False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as log_file:
                return "".join(deque(log_file, maxlen=lines))
        except FileNotFoundError:
            return ""

    def __enter__(self) -> EmbeddedZooKeeper:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedZooKeeper(address={self.address!r}, pid={self.pid}, data_dir={str(self.data_dir)!r})"

    # ------------------------------------------------------------------------------ internals

    def _write_config(self) -> Path:
        (self.data_dir / "data").mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        self.data_dir.chmod(PRIVATE_DIR_MODE)  # snapshots and logs hold ACLs, digests, sealed passwords
        settings = {
            "tickTime": self.tick_ms,
            "dataDir": self.data_dir / "data",
            "clientPort": self._port,
            "clientPortAddress": self.host,  # never listen on every interface
            "admin.enableServer": "false",
            "maxClientCnxns": 0,
            "4lw.commands.whitelist": "ruok,srvr,stat,mntr",
            "minSessionTimeout": 2 * self.tick_ms,
            "maxSessionTimeout": 60000,
            "autopurge.purgeInterval": 0,
        }
        if self.peers:
            settings.update({"initLimit": 10, "syncLimit": 5})
            for number, (quorum_port, election_port) in enumerate(self.peers, start=1):
                settings[f"server.{number}"] = f"{self.host}:{quorum_port}:{election_port}"
            (self.data_dir / "data" / "myid").write_text(f"{self.server_id}\n")
        config_path = self.data_dir / "zoo.cfg"
        config_path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return config_path

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            # The child keeps its own copy of the log descriptor, so ours can close now.
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                cwd=self.data_dir, preexec_fn=_parent_death_signal_setter(), umask=PRIVATE_UMASK,
                # Own session: a Ctrl-C on our terminal reaches us, and we decide how java stops.
                start_new_session=True,
            )

    def _wait_until_serving(self, deadline: float, timeout_s: float) -> None:
        while True:
            exit_code = self._process.poll() if self._process is not None else None
            if exit_code is not None:
                self._process = None
                raise MetadataError(f"ZooKeeper exited with code {exit_code} while starting on {self.address}; "
                                    f"last lines of {self.log_path}:\n{self.log_tail()}")
            if self._is_serving():
                self._check_own_port()
                return
            if monotonic_s() >= deadline:
                self.stop(timeout_s=0)
                raise MetadataError(f"ZooKeeper did not answer on {self.address} within {timeout_s}s; "
                                    f"last lines of {self.log_path}:\n{self.log_tail()}")
            time.sleep(READY_POLL_INTERVAL_S)

    def _check_own_port(self) -> None:
        """What answers on our port must be our process: another ZooKeeper that took the port first
        answers `ruok` too, while ours fails to bind and exits."""
        assert self._process is not None
        if listens_on(self._process.pid, self._port) is False or self._process.poll() is not None:
            self.stop(timeout_s=0)
            raise port_in_use(self.host, self._port, "ZooKeeper", PORT_HINT)

    def _is_serving(self) -> bool:
        # 'ruok' says imok as soon as the port is open; 'srvr' only reports a Mode once the
        # server has loaded its data and accepts sessions.
        try:
            return (four_letter_word(self.host, self._port, "ruok") == "imok"
                    and "Mode:" in four_letter_word(self.host, self._port, "srvr"))
        except OSError:
            return False

    def _signal(self, signal_number: int) -> None:
        if self._process is None or self._process.poll() is not None:
            raise MetadataError(f"ZooKeeper on {self.address} is not running")
        self._process.send_signal(signal_number)
