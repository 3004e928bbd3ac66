"""A three-server ZooKeeper ensemble on loopback, from the same jars as the single server, for fault
tests and the soak: find the leader (the `srvr` four-letter word), kill -9 it, start it again.

    ensemble = ZooKeeperEnsemble(directory)
    ensemble.start()                     # every member, then wait until each serves (a quorum)
    clients connect to ensemble.address  # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
    index = ensemble.leader()            # which member leads now
    ensemble.kill(index)                 # kill -9 of that member (the others elect a new leader)
    ensemble.start_member(index)         # it rejoins as a follower

Every process is one this object started, signalled by its pid only. It offers what a
`dlog_tools.cluster.LocalCluster` and the fault helpers ask of an `EmbeddedZooKeeper` (`address`,
`running`, `paused`, `start`, `stop`), so a cluster of bookie processes can run on it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import MetadataError
from bookkeeper.meta.zkserver import READY_POLL_INTERVAL_S, EmbeddedZooKeeper, pick_free_port

ENSEMBLE_SIZE_DEFAULT = 3
TICK_MS = 200  # a leader election takes a few ticks: short ticks keep a failover short


class ZooKeeperEnsemble:
    def __init__(self, directory: Path | str, size: int = ENSEMBLE_SIZE_DEFAULT, host: str = "127.0.0.1",
                 tick_ms: int = TICK_MS) -> None:
        if size < 3 or size % 2 == 0:
            raise MetadataError(f"an ensemble needs an odd number of members, at least 3 (got {size})")
        self.directory = Path(directory).absolute()
        self.host = host
        peers = [(pick_free_port(host), pick_free_port(host)) for _ in range(size)]
        self.members = [EmbeddedZooKeeper(self.directory / f"zk-{number}", port=pick_free_port(host), host=host,
                                          tick_ms=tick_ms, server_id=number, peers=peers)
                        for number in range(1, size + 1)]
        self.paused = False  # members are killed one by one here, never all paused

    @property
    def address(self) -> str:
        return ",".join(member.address for member in self.members)

    @property
    def running(self) -> bool:
        return any(member.running for member in self.members)

    def start(self, timeout_s: float = 60.0) -> None:
        try:
            for member in self.members:
                member.start(timeout_s, wait=False)
            for member in self.members:
                member.wait_until_serving(timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        for member in self.members:
            member.stop(timeout_s)

    def leader(self, timeout_s: float = 30.0) -> int:
        """The index of the member that leads now (waits while an election runs)."""
        deadline = monotonic_s() + timeout_s
        while True:
            for index, member in enumerate(self.members):
                if member.running and member.mode == "leader":
                    return index
            if monotonic_s() >= deadline:
                raise MetadataError(f"no member of the ensemble at {self.address} leads after {timeout_s} s")
            time.sleep(READY_POLL_INTERVAL_S)

    def kill(self, index: int, signum: int = signal.SIGKILL) -> None:
        self.members[index].kill(signum)

    def start_member(self, index: int, timeout_s: float = 60.0) -> None:
        """Start a member that was killed; it rejoins (and catches up) as a follower."""
        self.members[index].start(timeout_s)

    def __enter__(self) -> ZooKeeperEnsemble:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
