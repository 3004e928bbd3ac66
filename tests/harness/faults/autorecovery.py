"""`dlog autorecovery` as a process of its own, for runs whose bookies do not run auto-recovery
themselves (bookies in network namespaces cannot reach each other: the lab links each namespace to
the root one only) and for tests that kill a worker. Ended by its pid only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dlog_tools.cluster import LineReader, die_with_parent, project_root

READY_PREFIX = "autorecovery ready"


class RecoveryProcess:
    def __init__(self, cluster: Any, name: str, log_dir: Path, *args: str, timeout_s: float = 60.0) -> None:
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        self.command = [sys.executable, "-m", "dlog_tools.cli", "autorecovery", "--zk", cluster.zk_address,
                        "--zk-root", cluster.zk_root, "--id", name, *args]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log, text=True,
                                            preexec_fn=die_with_parent, cwd=project_root(),
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready = LineReader(self.process).line_starting(READY_PREFIX, timeout_s)
        if ready is None:
            self.kill()
            raise RuntimeError(f"{' '.join(self.command)} did not start: {self.log_text()[-2000:]}")
        fields = dict(item.split("=", 1) for item in ready[len(READY_PREFIX):].split())
        self.http = None if fields.get("http") == "-" else fields.get("http")  # its admin endpoint

    def log_text(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def copied(self, ledger_id: int) -> bool:
        """Whether this process's worker began copying entries of the ledger."""
        return f"ledger {ledger_id}: copying" in self.log_text()

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.running:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self._release_output()

    def _release_output(self) -> None:
        """Close our end of the exited process's stdout pipe (else it stays open until collected)."""
        if not self.running and self.process.stdout is not None:
            self.process.stdout.close()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.running:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._release_output()
