"""A local cluster of real processes: one embedded ZooKeeper and N bookie processes.

Used by `dlog standalone`, `make demo`, the benchmarks and the integration and fault tests. Each
bookie is its own OS process (`python -m dlog_tools.cli bookie start ...`) that dies with its parent.
Ports are chosen once and kept in `<dir>/cluster.json`, so a restart with the same directory gives
every bookie back its identity (its cookie names `127.0.0.1:port`) and its data.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import DlogError
from bookkeeper.meta.ports import command_of, port_bindable, port_in_use
from bookkeeper.meta.zkserver import EmbeddedZooKeeper, pick_free_port

READY_PREFIX = "bookie ready "
STATE_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
PORT_RETRIES = 3
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends SIGKILL when our parent dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the child must be stopped explicitly


def free_port() -> int:
    return pick_free_port("127.0.0.1")


@dataclass
class BookieProcess:
    index: int
    port: int
    data_dir: Path
    process: subprocess.Popen[str] | None = None
    http: str | None = None
    extra_args: list[str] = field(default_factory=list)
    exit_reported: bool = False
    bookie_id: str | None = None  # from its ready line

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class DirectoryInUseError(DlogError):
    """Another live process runs a cluster from this directory."""

    code = 401


class DirectoryLock:
    """`<dir>/cluster.lock`: an flock held while a cluster runs from the directory, with the owner's
    pid in it for the message. The kernel drops the lock when its owner dies, so a crash leaves
    nothing to clean up."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        handle = open(self.path, "a+")  # noqa: SIM115 - held open while the lock is held; release() closes it
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip()
            handle.close()
            raise DirectoryInUseError(
                f"directory {self.directory} is in use by {_owner_text(owner)}; stop that cluster first, "
                "or pass another --dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None


def _owner_text(owner: str) -> str:
    if not owner.isdigit():
        return "another process"
    command = command_of(int(owner))
    return f"pid {owner} ({command})" if command else f"pid {owner}"


class LocalCluster:
    """Start order: lock the directory, start ZooKeeper (it proves the port is its own), check each
    bookie's port, launch the bookies, wait until each is ready AND registered in this cluster's
    ZooKeeper, and only then record the ports in `cluster.json` (atomically). A failed start stops
    what it started and leaves `cluster.json` as the last good start wrote it."""

    def __init__(self, directory: Path | str, *, bookies: int = 3, zk_port: int = 0,
                 zk_root: str = "/bookkeeper", bookie_args: list[str] | None = None,
                 zk_server: EmbeddedZooKeeper | None = None, secure: Any = None) -> None:
        """`secure`: a dlog_tools.secure.SecureDir: bookies serve TLS and require tokens, ZooKeeper
        takes its admin as super user and bookies register under ACLs."""
        self.directory = Path(directory).resolve()
        self.secure = secure
        self.bookie_count = bookies
        self.zk_root = zk_root
        self.bookie_args = list(bookie_args or [])
        self._own_zk = zk_server is None
        self.directory.mkdir(parents=True, exist_ok=True)
        self.lock = DirectoryLock(self.directory)
        state = load_state(self.directory)
        self.zk_port = state.get("zk_port") or zk_port or free_port()
        self.ui_port: int | None = state.get("ui_port")  # the status page's, when `dlog standalone` served one
        if zk_port and state.get("zk_port") not in (None, zk_port):
            self.zk_port = zk_port
        self.zk = zk_server or EmbeddedZooKeeper(self.directory / "zookeeper", port=self.zk_port,
                                                 super_digest=secure.super_digest if secure else None)
        ports = state.get("bookie_ports", [])
        self.bookies = []
        self._new_ports: set[int] = set()  # never served: may move to another port
        for index in range(bookies):
            data_dir = self.directory / f"bookie-{index}"
            port = ports[index] if index < len(ports) else _cookie_port(data_dir)
            if port is None:
                port = free_port()
                self._new_ports.add(index)
            self.bookies.append(BookieProcess(index, port, data_dir))

    # ------------------------------------------------------------------ state file

    def _save_state(self) -> None:
        """Written to a temporary file, fsynced, renamed: a crash leaves the old or the new file."""
        state = {"zk_port": self.zk_port if self._own_zk else None,
                 "bookie_ports": [bookie.port for bookie in self.bookies], "ui_port": self.ui_port}
        path = self.directory / STATE_FILE
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "w") as handle:
            handle.write(json.dumps(state))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def remember_ui_port(self, port: int) -> None:
        """After the status page listens on `port`: the next start without --ui-port takes it again."""
        self.ui_port = port
        self._save_state()

    @property
    def zk_address(self) -> str:
        return self.zk.address

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 60.0) -> None:
        self.lock.acquire()
        try:
            if self._own_zk:
                self.zk.start(timeout_s=timeout_s)
            if self.secure is not None:
                self.lock_down_zookeeper()
            for bookie in self.bookies:
                self._check_bookie_port(bookie.index)
                self.launch_bookie(bookie.index)
            for bookie in self.bookies:
                self._wait_first_start(bookie.index, timeout_s)
            self.check_registered([bookie.index for bookie in self.bookies], timeout_s)
            self._save_state()
        except BaseException:
            self.stop()
            raise

    def lock_down_zookeeper(self) -> None:
        """Before any bookie: nobody but the cluster's identities may create in ZooKeeper."""
        from dlog_tools.secure import ZK_ADMIN_USER, lock_down

        lock_down(self.zk_address, ZK_ADMIN_USER, self.secure.zk_admin_password, [self.secure.bookie_digest],
                  self.zk_root)

    def _check_bookie_port(self, index: int) -> None:
        """A new bookie whose port was taken meanwhile moves; a known one is refused, naming the holder
        (its identity, the cookie, names its port)."""
        bookie = self.bookies[index]
        if port_bindable("127.0.0.1", bookie.port):
            return
        if index in self._new_ports:
            bookie.port = free_port()
            return
        raise port_in_use("127.0.0.1", bookie.port, f"bookie {index}",
                          "its identity (cookie) names that port: stop that process first")

    def _wait_first_start(self, index: int, timeout_s: float) -> None:
        """Wait for a bookie; one that lost its new port to another process moves to another port.

        A port is only ever moved before the bookie first served, so no identity is changed: its data
        directory (holding the cookie for the lost port) is still empty of entries and is recreated.
        """
        for attempt in range(PORT_RETRIES + 1):
            try:
                self.wait_bookie_ready(index, timeout_s)
                self._new_ports.discard(index)
                return
            except DlogError as error:
                bookie = self.bookies[index]
                lost_port = "address already in use" in str(error) and not bookie.running
                if not lost_port or index not in self._new_ports or attempt == PORT_RETRIES:
                    raise
                shutil.rmtree(bookie.data_dir, ignore_errors=True)
                bookie.port = free_port()
                self.launch_bookie(index)

    def check_registered(self, indexes: list[int], timeout_s: float = 30.0) -> None:
        """Each bookie is registered in THIS cluster's ZooKeeper, by the process we started."""
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError

        from bookkeeper.meta import layout

        client = KazooClient(hosts=self.zk_address, timeout=timeout_s)
        try:
            client.start(timeout=timeout_s)
            for index in indexes:
                bookie = self.bookies[index]
                found = client.exists(layout.bookie_path(self.zk_root, bookie.bookie_id or bookie.address))
                if found is None:
                    raise DlogError(f"bookie {index} ({bookie.address}, pid {bookie.pid}) said it was ready "
                                    f"but is not registered in ZooKeeper {self.zk_address} under "
                                    f"{self.zk_root}; see {bookie.data_dir / 'bookie.log'}")
        except KazooTimeoutError as exc:
            raise DlogError(f"cannot reach this cluster's ZooKeeper at {self.zk_address}") from exc
        finally:
            client.stop()
            client.close()

    def launch_bookie(self, index: int, extra_args: list[str] | None = None) -> BookieProcess:
        bookie = self.bookies[index]
        if bookie.running:
            raise DlogError(f"bookie {index} is already running (pid {bookie.pid})")
        bookie.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if extra_args is not None:
            bookie.extra_args = list(extra_args)
        _release_output(bookie.process)
        # private like the rest of the bookie's directory (the bookie's umask is 077)
        log_file: IO[str] = os.fdopen(os.open(bookie.data_dir / "bookie.log",
                                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a")
        bookie.process = subprocess.Popen(self.bookie_command(bookie), stdout=subprocess.PIPE,
                                          stderr=log_file, text=True,
                                          preexec_fn=die_with_parent, cwd=project_root(),
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log_file.close()
        bookie.http = None
        bookie.exit_reported = False
        return bookie

    def bookie_command(self, bookie: BookieProcess) -> list[str]:
        return [sys.executable, "-m", "dlog_tools.cli", "bookie", "start", "--dir", str(bookie.data_dir),
                "--port", str(bookie.port), "--http-port", "0", "--zk", self.zk_address,
                "--zk-root", self.zk_root, *(self.secure.bookie_args() if self.secure else []),
                *self.bookie_args, *bookie.extra_args]

    def wait_bookie_ready(self, index: int, timeout_s: float = 60.0) -> BookieProcess:
        """Read the bookie's stdout until its ready line; fail with its log if it exits first."""
        bookie = self.bookies[index]
        assert bookie.process is not None and bookie.process.stdout is not None
        line = LineReader(bookie.process).line_starting(READY_PREFIX, timeout_s)
        if line is None:
            # the first line is the whole story for a one-line error; the log's tail follows it
            log_path, tail = bookie.data_dir / "bookie.log", self.bookie_log_tail(index)
            reason = next((text.strip() for text in reversed(tail.splitlines()) if text.strip()), "no log")
            if bookie.process.poll() is not None:
                raise DlogError(f"bookie {index} ({bookie.address}) exited with status "
                                f"{bookie.process.returncode} before it was ready: {reason} "
                                f"(log: {log_path})\n{tail}")
            self.kill_bookie(index)
            raise DlogError(f"bookie {index} ({bookie.address}) was not ready within {timeout_s} s: "
                            f"{reason} (log: {log_path})\n{tail}")
        fields = dict(item.split("=", 1) for item in line[len(READY_PREFIX):].split())
        bookie.http = None if fields.get("http") == "-" else fields.get("http")
        bookie.bookie_id = fields.get("id")
        return bookie

    def bookie_log_tail(self, index: int, lines: int = 20) -> str:
        try:
            text = (self.bookies[index].data_dir / "bookie.log").read_text()
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start_bookie(self, index: int, timeout_s: float = 60.0,
                     extra_args: list[str] | None = None) -> BookieProcess:
        self.launch_bookie(index, extra_args)
        return self.wait_bookie_ready(index, timeout_s)

    def replace_bookie(self, index: int, timeout_s: float = 60.0) -> BookieProcess:
        """Start a new, empty bookie in the place of bookie `index`, which must be down for good (its
        disk lost): its own port and data directory, so a new identity; the old one is never started
        again (its cookie would refuse the empty directory anyway)."""
        old = self.bookies[index]
        if old.running:
            raise DlogError(f"bookie {index} is still running (pid {old.pid}): stop it first")
        generation = 1 + sum(1 for _ in old.data_dir.parent.glob(f"bookie-{index}-r*"))
        self.bookies[index] = dataclasses.replace(
            old, port=free_port(), data_dir=old.data_dir.parent / f"bookie-{index}-r{generation}",
            process=None, http=None, bookie_id=None, exit_reported=False)
        return self.start_bookie(index, timeout_s)

    def kill_bookie(self, index: int, signum: int = signal.SIGKILL) -> None:
        """Send a signal to the bookie process we started (by its pid only)."""
        bookie = self.bookies[index]
        if bookie.running:
            os.kill(bookie.process.pid, signum)  # type: ignore[union-attr]
            if signum in (signal.SIGKILL, signal.SIGTERM):
                bookie.process.wait(timeout=30)  # type: ignore[union-attr]
                _release_output(bookie.process)

    def stop_bookie(self, index: int, timeout_s: float = 30.0) -> int | None:
        bookie = self.bookies[index]
        if not bookie.running:
            _release_output(bookie.process)
            return None if bookie.process is None else bookie.process.returncode
        bookie.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        try:
            return bookie.process.wait(timeout=timeout_s)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            bookie.process.kill()  # type: ignore[union-attr]
            return bookie.process.wait()  # type: ignore[union-attr]
        finally:
            _release_output(bookie.process)

    def stop(self) -> None:
        for bookie in self.bookies:
            if bookie.running:
                bookie.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for bookie in self.bookies:
            self.stop_bookie(bookie.index)
        if self._own_zk:
            self.zk.stop()
        self.lock.release()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def signal_and_wait(process: subprocess.Popen[str], signum: int, timeout_s: float) -> int:
    """Send `signum` to a child we started (if it still runs) and wait for it; SIGKILL after
    `timeout_s`. Its exit status."""
    if process.poll() is None:
        process.send_signal(signum)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def _release_output(process: subprocess.Popen[str] | None) -> None:
    """Close our end of an exited child's stdout pipe (else the file stays open until collected)."""
    if process is not None and process.poll() is not None and process.stdout is not None:
        process.stdout.close()


SERVE_READY_S = 60.0
SERVE_STOP_S = 40.0


class ServeProcess:
    """One `dlog serve` process against a LocalCluster (`dlog standalone`'s, the Kafka benchmark's);
    its stderr (the log) goes to `log_path`. Its ready line gives its id, Kafka address and, with
    `--admin-port`, its admin endpoint's URL."""

    def __init__(self, process: subprocess.Popen[str], ready: str, log_path: Path) -> None:
        self.process = process
        fields = dict(word.split("=", 1) for word in ready.split()[3:] if "=" in word)
        self.server_id = int(fields["id"])
        self.kafka = fields["kafka"]
        self.admin: str | None = fields.get("admin")
        self.log_path = log_path
        self.exit_reported = False

    @classmethod
    def start(cls, cluster: LocalCluster, namespace: str, log_path: Path, *args: str, kafka_port: int = 0,
              replication: int | None = None, secure: Any = None, client_toml: Path | None = None) -> ServeProcess:
        """Start a server (`args`: more `dlog serve` options), topics auto-created and replicated
        as `replication` bookies (default: as the bookie count allows, at most 3, quorums of 2).
        On a secure cluster (`secure`: its material, `client_toml`: the admin's client settings)
        it runs with the bookies' certificate and token key: Kafka clients connect with SASL_SSL
        and a dlog token (docs/serving.md, "Security")."""
        bookies = replication or min(cluster.bookie_count, 3)
        quorum = str(min(bookies, 2))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if secure is not None:
            args = (*args, "--tls-cert", str(secure.server_cert), "--tls-key", str(secure.server_key),
                    "--token-key", str(secure.token_key))
            env = {key: value for key, value in env.items() if key != "DLOG_TOKEN"}
            env["DLOG_CONFIG"] = str(client_toml)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "dlog_tools.cli", "serve", "--zk", cluster.zk_address,
                 "--zk-root", cluster.zk_root, "--namespace", namespace, "--kafka-port", str(kafka_port),
                 "--auto-create-topics", "--ensemble", str(bookies), "--write-quorum", quorum, "--ack-quorum", quorum,
                 *args],
                stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=die_with_parent, env=env)
        line = LineReader(process).line_starting("dlog serve ready", SERVE_READY_S)
        if line is None:
            process.kill()
            process.wait()
            _release_output(process)
            tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise DlogError(f"dlog serve did not start (see {log_path}): {tail[0]}")
        return cls(process, line, Path(log_path))

    def stop(self) -> None:
        """SIGTERM: the server hands its streams back cleanly; killed if it takes too long."""
        signal_and_wait(self.process, signal.SIGTERM, SERVE_STOP_S)
        _release_output(self.process)

    def kill(self) -> None:
        """SIGKILL: nothing handed over; its streams move once its ZooKeeper session expires."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        _release_output(self.process)


class LineReader:
    """Lines of a child's stdout with deadlines (select on the raw fd); keeps what it has not
    returned yet, so no line is lost between calls."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.process = process
        self._descriptor = process.stdout.fileno()
        self._buffered = b""
        self._lines: list[str] = []

    def next_line(self, timeout_s: float) -> str | None:
        """The next line; None if the child closed its stdout or the deadline passed."""
        deadline = monotonic_s() + timeout_s
        while not self._lines:
            remaining_s = deadline - monotonic_s()
            if remaining_s <= 0:
                return None
            ready, _, _ = select.select([self._descriptor], [], [], min(remaining_s, 0.05))
            if not ready:
                if self.process.poll() is not None:
                    return None
                continue
            chunk = os.read(self._descriptor, 65536)
            if not chunk:
                return None
            *lines, self._buffered = (self._buffered + chunk).split(b"\n")
            self._lines.extend(line.decode(errors="replace") for line in lines)
        return self._lines.pop(0)

    def line_starting(self, prefix: str, timeout_s: float) -> str | None:
        deadline = monotonic_s() + timeout_s
        while (line := self.next_line(max(0.0, deadline - monotonic_s()))) is not None:
            if line.startswith(prefix):
                return line
        return None


def load_state(directory: Path) -> dict[str, Any]:
    """What the last good start in `directory` recorded ({} if none)."""
    try:
        state = json.loads((Path(directory) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _cookie_port(data_dir: Path) -> int | None:
    """The port a bookie's cookie names: a bookie that registered once keeps its identity even if
    the start it was part of failed before `cluster.json` was written."""
    try:
        bookie_id = json.loads((data_dir / "cookie.json").read_text())["bookie_id"]
        return int(str(bookie_id).rsplit(":", 1)[1])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def project_root() -> str:
    return str(Path(__file__).resolve().parent.parent)
