"""`dlog serve` processes for tests: start one against a LocalCluster (its ready line gives the id
and Kafka address), stop it with SIGTERM or kill it with SIGKILL; every one started is gone after
the test, and the log of one that died (of every one, with $DLOG_TEST_SERVE_LOGS set) is printed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dlog_tools.cluster import LineReader, LocalCluster

READY = re.compile(r"^dlog serve ready id=(\d+) kafka=(\S+):(\d+)(?: admin=(\S+))?$")


@dataclass
class ServeProcess:
    process: subprocess.Popen
    server_id: int
    host: str
    port: int
    lines: LineReader = field(repr=False)
    admin: str | None = None  # the admin endpoint's URL (started with --admin-port)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout_s: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)


@contextmanager
def serve_processes(cluster_factory: Callable[..., LocalCluster]) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(cluster: LocalCluster, namespace: str, *args: str, replication: int = 1,
              env: dict[str, str] | None = None) -> ServeProcess:
        quorum = str(min(replication, 2))
        command = [sys.executable, "-m", "dlog_tools.cli", "serve", "--zk", cluster.zk_address, "--zk-root",
                   cluster.zk_root, "--namespace", namespace, "--kafka-port", "0", "--ensemble", str(replication),
                   "--write-quorum", quorum, "--ack-quorum", quorum, *args]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        lines = LineReader(process)
        line = lines.line_starting("dlog serve ready", 60)
        if line is None:
            process.kill()
            with process.stdout, process.stderr:
                raise AssertionError(f"dlog serve not ready (status {process.wait()}): {process.stderr.read()}")
        match = READY.match(line)
        assert match, line
        server = ServeProcess(process, int(match.group(1)), match.group(2), int(match.group(3)), lines,
                              match.group(4))
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait(30)
            with server.process.stdout, server.process.stderr:  # our ends of its pipes, closed
                if server.process.returncode not in (0, -signal.SIGKILL) or os.environ.get("DLOG_TEST_SERVE_LOGS"):
                    print(f"dlog serve {server.server_id} exited with {server.process.returncode}:",
                          server.process.stderr.read()[-5000:])
