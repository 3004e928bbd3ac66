"""A local cluster of real processes: one embedded ZooKeeper and N bookie processes.

Used by `dlog standalone`, `make demo`, the benchmarks and the integration and fault tests. Each
bookie is its own OS process (`python -m tools.cli bookie start ...`) that dies with its parent.
Ports are chosen once and kept in `<dir>/cluster.json`, so a restart with the same directory gives
every bookie back its identity (its cookie names `127.0.0.1:port`) and its data.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bookkeeper.errors import DlogError
from bookkeeper.meta.zkserver import EmbeddedZooKeeper, pick_free_port

READY_PREFIX = "bookie ready "
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

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class LocalCluster:
    def __init__(self, directory: Path | str, *, bookies: int = 3, zk_port: int = 0,
                 zk_root: str = "/bookkeeper", bookie_args: list[str] | None = None,
                 zk_server: EmbeddedZooKeeper | None = None) -> None:
        self.directory = Path(directory).resolve()
        self.bookie_count = bookies
        self.zk_root = zk_root
        self.bookie_args = list(bookie_args or [])
        self._own_zk = zk_server is None
        self.directory.mkdir(parents=True, exist_ok=True)
        state = self._load_state()
        self.zk_port = state.get("zk_port") or zk_port or free_port()
        if zk_port and state.get("zk_port") not in (None, zk_port):
            self.zk_port = zk_port
        self.zk = zk_server or EmbeddedZooKeeper(self.directory / "zookeeper", port=self.zk_port)
        ports = state.get("bookie_ports", [])
        self.bookies = [BookieProcess(index, ports[index] if index < len(ports) else free_port(),
                                      self.directory / f"bookie-{index}") for index in range(bookies)]
        self._new_ports = {index for index in range(len(ports), bookies)}  # never served: may move
        self._save_state()

    # ------------------------------------------------------------------ state file

    def _state_path(self) -> Path:
        return self.directory / "cluster.json"

    def _load_state(self) -> dict:
        try:
            return json.loads(self._state_path().read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        state = {"zk_port": self.zk_port if self._own_zk else None,
                 "bookie_ports": [bookie.port for bookie in self.bookies]}
        self._state_path().write_text(json.dumps(state))

    @property
    def zk_address(self) -> str:
        return self.zk.address

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 60.0) -> None:
        if self._own_zk:
            self.zk.start(timeout_s=timeout_s)
        for bookie in self.bookies:
            self.launch_bookie(bookie.index)
        for bookie in self.bookies:
            self._wait_first_start(bookie.index, timeout_s)

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
                self._save_state()
                self.launch_bookie(index)

    def launch_bookie(self, index: int, extra_args: list[str] | None = None) -> BookieProcess:
        bookie = self.bookies[index]
        if bookie.running:
            raise DlogError(f"bookie {index} is already running (pid {bookie.pid})")
        bookie.data_dir.mkdir(parents=True, exist_ok=True)
        if extra_args is not None:
            bookie.extra_args = list(extra_args)
        log_file: IO[str] = open(bookie.data_dir / "bookie.log", "a")
        bookie.process = subprocess.Popen(self.bookie_command(bookie), stdout=subprocess.PIPE,
                                          stderr=log_file, text=True,
                                          preexec_fn=die_with_parent, cwd=project_root(),
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log_file.close()
        bookie.http = None
        bookie.exit_reported = False
        return bookie

    def bookie_command(self, bookie: BookieProcess) -> list[str]:
        return [sys.executable, "-m", "tools.cli", "bookie", "start", "--dir", str(bookie.data_dir),
                "--port", str(bookie.port), "--http-port", "0", "--zk", self.zk_address,
                "--zk-root", self.zk_root, *self.bookie_args, *bookie.extra_args]

    def wait_bookie_ready(self, index: int, timeout_s: float = 60.0) -> BookieProcess:
        """Read the bookie's stdout until its ready line; fail with its log if it exits first."""
        bookie = self.bookies[index]
        assert bookie.process is not None and bookie.process.stdout is not None
        line = LineReader(bookie.process).line_starting(READY_PREFIX, timeout_s)
        if line is None:
            if bookie.process.poll() is not None:
                raise DlogError(f"bookie {index} exited with status {bookie.process.returncode} "
                                f"before it was ready:\n{self.bookie_log_tail(index)}")
            self.kill_bookie(index)
            raise DlogError(f"bookie {index} was not ready within {timeout_s} s:\n"
                            f"{self.bookie_log_tail(index)}")
        fields = dict(item.split("=", 1) for item in line[len(READY_PREFIX):].split())
        bookie.http = None if fields.get("http") == "-" else fields.get("http")
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

    def kill_bookie(self, index: int, signum: int = signal.SIGKILL) -> None:
        """Send a signal to the bookie process we started (by its pid only)."""
        bookie = self.bookies[index]
        if bookie.running:
            os.kill(bookie.process.pid, signum)  # type: ignore[union-attr]
            if signum in (signal.SIGKILL, signal.SIGTERM):
                bookie.process.wait(timeout=30)  # type: ignore[union-attr]

    def stop_bookie(self, index: int, timeout_s: float = 30.0) -> int | None:
        bookie = self.bookies[index]
        if not bookie.running:
            return None if bookie.process is None else bookie.process.returncode
        bookie.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        try:
            return bookie.process.wait(timeout=timeout_s)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            bookie.process.kill()  # type: ignore[union-attr]
            return bookie.process.wait()  # type: ignore[union-attr]

    def stop(self) -> None:
        for bookie in self.bookies:
            if bookie.running:
                bookie.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for bookie in self.bookies:
            self.stop_bookie(bookie.index)
        if self._own_zk:
            self.zk.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


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
        deadline = time.monotonic() + timeout_s
        while not self._lines:
            remaining_s = deadline - time.monotonic()
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
        deadline = time.monotonic() + timeout_s
        while (line := self.next_line(max(0.0, deadline - time.monotonic()))) is not None:
            if line.startswith(prefix):
                return line
        return None


def project_root() -> str:
    return str(Path(__file__).resolve().parent.parent)
