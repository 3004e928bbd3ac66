"""The network of the fault tests: each bookie in its own network namespace, joined to the root
namespace (where the client and ZooKeeper stay) by a veth pair on its own /30.

Shaping and partitions act on the client<->bookie traffic only (matched by the client's address
on the bookie's pair), so the bookies' ZooKeeper sessions are spared: `tc netem` delay and loss
where the kernel has netem; otherwise an HTB rate limit with a short queue (queueing delay and
tail drops, as on a congested link); partitions are blackhole policy rules inside the bookie's
namespace (a silent drop). Namespaces are named `dlf-<pid>-...` and removed in teardown (and by
the next run if one was interrupted).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from bookkeeper.meta.zkserver import EmbeddedZooKeeper
from dlog_tools.cluster import BookieProcess, LocalCluster

from .faults import CapabilityMissing, run

NETNS_PREFIX = "dlf"


def netns_available() -> str | None:
    """None when network namespaces, veth pairs and netem can be used here, else the reason."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y iproute2)"
    return None


_NETEM_PROBE: list[str | None] = []  # the answer, once known


def netem_missing() -> str | None:
    """None when `tc netem` works on this machine, else why not (probed once, on a veth pair made
    and deleted for the purpose)."""
    if _NETEM_PROBE:
        return _NETEM_PROBE[0]
    reason = netns_available()
    if reason is None:
        link = f"dnm{os.getpid() % 100000}"
        made = run(["ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p"], check=False)
        if made.returncode != 0:
            reason = f"cannot make a veth pair: {made.stderr.strip()}"
        else:
            added = run(["tc", "qdisc", "add", "dev", link, "root", "netem", "delay", "1ms"], check=False)
            if added.returncode != 0:
                reason = f"this kernel has no netem qdisc (tc: {added.stderr.strip()})"
            run(["ip", "link", "del", link], check=False)
    _NETEM_PROBE.append(reason)
    return reason


@dataclass
class NetnsBookie(BookieProcess):
    host: str = "127.0.0.1"
    netns: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class NetnsLab:
    """Network namespaces `dlf-<pid>-<tag>-b<i>`, one per bookie, each joined to the root namespace
    by a veth pair on its own /30, and one more address in the root namespace for ZooKeeper.

    The client stays in the root namespace. Traffic shaping matches only the client<->bookie
    flows (source or destination = the root end of that bookie's pair), so ZooKeeper sessions of
    the bookies are not disturbed by a client partition."""

    def __init__(self, bookies: int) -> None:
        reason = netns_available()
        if reason is not None:
            raise CapabilityMissing(reason)
        cleanup_stale_namespaces()
        self.tag = f"{os.getpid()}-{random.randrange(36**3):03x}"
        short = f"{os.getpid() % 100000}{random.randrange(100):02d}"
        self.bookies = bookies
        self.subnet = _free_subnet()
        self.namespaces = [f"{NETNS_PREFIX}-{self.tag}-b{i}" for i in range(bookies)]
        self.root_links = [f"dr{short}{i}" for i in range(bookies)]
        self.ns_links = [f"db{short}{i}" for i in range(bookies)]
        self.anchor = (f"dz{short}a", f"dz{short}b")
        self.zk_host = f"{self.subnet}.254"
        self.shaped: set[int] = set()
        self.partitioned: set[int] = set()
        self._created: list[str] = []

    def root_address(self, index: int) -> str:
        return f"{self.subnet}.{4 * index + 1}"

    def bookie_host(self, index: int) -> str:
        return f"{self.subnet}.{4 * index + 2}"

    def create(self) -> NetnsLab:
        try:
            a, b = self.anchor
            run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            self._created.append(f"link:{a}")
            run(["ip", "addr", "add", f"{self.zk_host}/32", "dev", a])
            run(["ip", "link", "set", a, "up"])
            run(["ip", "link", "set", b, "up"])
            for index in range(self.bookies):
                self._create_bookie_network(index)
        except (RuntimeError, OSError) as exc:
            self.close()
            raise CapabilityMissing(f"cannot build network namespaces: {exc}") from exc
        return self

    def _create_bookie_network(self, index: int) -> None:
        namespace, root_link, ns_link = self.namespaces[index], self.root_links[index], self.ns_links[index]
        run(["ip", "netns", "add", namespace])
        self._created.append(f"netns:{namespace}")
        run(["ip", "link", "add", root_link, "type", "veth", "peer", "name", ns_link])
        self._created.append(f"link:{root_link}")  # deleting one end deletes the pair
        run(["ip", "link", "set", ns_link, "netns", namespace])
        run(["ip", "addr", "add", f"{self.root_address(index)}/30", "dev", root_link])
        run(["ip", "link", "set", root_link, "up"])
        inside = ["ip", "netns", "exec", namespace]
        run([*inside, "ip", "addr", "add", f"{self.bookie_host(index)}/30", "dev", ns_link])
        run([*inside, "ip", "link", "set", ns_link, "up"])
        run([*inside, "ip", "link", "set", "lo", "up"])
        run([*inside, "ip", "route", "add", "default", "via", self.root_address(index)])

    def netem_available(self) -> str | None:
        """None when the kernel has sch_netem (fixed delay, random loss), else the reason."""
        return netem_missing()

    def _sides(self, index: int) -> list[tuple[list[str], str, str]]:
        """(command prefix, link, u32 direction) of both directions of client<->bookie traffic: the
        root end sends with the client's source address, the bookie end to it."""
        return [([], self.root_links[index], "src"),
                (["ip", "netns", "exec", self.namespaces[index]], self.ns_links[index], "dst")]

    def _shape(self, index: int, rate_kbit: int | None, leaf: list[str]) -> None:
        """An HTB class for client<->bookie `index` packets only (u32 on the client address), with
        `leaf` as its queue; every other packet (the bookie's ZooKeeper session) goes unshaped."""
        self.heal(index)
        rate = f"{rate_kbit}kbit" if rate_kbit else "1gbit"
        for prefix, link, direction in self._sides(index):
            tc = [*prefix, "tc"]
            run([*tc, "qdisc", "add", "dev", link, "root", "handle", "1:", "htb", "default", "10", "r2q", "1000"])
            run([*tc, "class", "add", "dev", link, "parent", "1:", "classid", "1:10", "htb", "rate", "1gbit"])
            run([*tc, "class", "add", "dev", link, "parent", "1:", "classid", "1:20", "htb", "rate", rate,
                 "ceil", rate, "burst", "4k"])
            run([*tc, "qdisc", "add", "dev", link, "parent", "1:20", "handle", "20:", *leaf])
            run([*tc, "filter", "add", "dev", link, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                 "match", "ip", direction, f"{self.root_address(index)}/32", "flowid", "1:20"])
        self.shaped.add(index)

    def netem(self, index: int, *, delay_ms: float = 0, jitter_ms: float = 0, loss_percent: float = 0) -> None:
        """Fixed delay and random loss on client<->bookie `index` traffic (needs sch_netem)."""
        reason = self.netem_available()
        if reason is not None:
            raise CapabilityMissing(reason)
        leaf = ["netem", "limit", "100000"]
        if delay_ms:
            leaf += ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        if loss_percent:
            leaf += ["loss", f"{loss_percent}%"]
        self._shape(index, None, leaf)

    def slow_link(self, index: int, *, rate_kbit: int, queue_packets: int) -> None:
        """A slow, lossy link without netem: client<->bookie `index` traffic is limited to
        `rate_kbit` in each direction; a burst waits in a queue of `queue_packets` (delay) and what
        overflows it is dropped (loss), as on a congested link."""
        self._shape(index, rate_kbit, ["pfifo", "limit", str(queue_packets)])

    def partition(self, index: int) -> None:
        """Drop every client<->bookie packet silently (connections hang, nothing is refused), by
        blackhole policy rules inside the bookie's namespace; its ZooKeeper traffic still flows."""
        self.heal(index)
        inside = ["ip", "netns", "exec", self.namespaces[index], "ip", "rule", "add"]
        run([*inside, "from", self.root_address(index), "blackhole"])
        run([*inside, "to", self.root_address(index), "blackhole"])
        self.partitioned.add(index)

    def heal(self, index: int) -> None:
        if index in self.shaped:
            for prefix, link, _ in self._sides(index):
                run([*prefix, "tc", "qdisc", "del", "dev", link, "root"], check=False)
            self.shaped.discard(index)
        if index in self.partitioned:
            inside = ["ip", "netns", "exec", self.namespaces[index], "ip", "rule", "del"]
            run([*inside, "from", self.root_address(index), "blackhole"], check=False)
            run([*inside, "to", self.root_address(index), "blackhole"], check=False)
            self.partitioned.discard(index)

    def heal_all(self) -> None:
        for index in range(self.bookies):
            self.heal(index)

    def close(self) -> None:
        """Delete what we created (a namespace takes its veth end, and so the pair, with it)."""
        for item in reversed(self._created):
            kind, name = item.split(":", 1)
            if kind == "netns":
                run(["ip", "netns", "del", name], check=False)
            else:
                run(["ip", "link", "del", name], check=False)
        self._created.clear()


def _free_subnet() -> str:
    """A 10.x.y /24 that no interface of this machine uses (picked at random, checked)."""
    used = run(["ip", "-4", "-o", "addr"], check=False).stdout
    rng = random.Random()
    for _ in range(200):
        subnet = f"10.{rng.randrange(200, 250)}.{rng.randrange(0, 256)}"
        if f" {subnet}." not in used:
            return subnet
    raise CapabilityMissing("no free 10.x.y.0/24 subnet for the test network")


def cleanup_stale_namespaces() -> None:
    """Remove namespaces an earlier run of these tests left behind: only `dlf-<pid>-...` names
    whose pid no longer runs (an interrupted run that never reached its teardown)."""
    listing = run(["ip", "netns", "list"], check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        matched = re.fullmatch(rf"{NETNS_PREFIX}-(\d+)-[0-9a-z]+-b\d+", name)
        if matched and not Path(f"/proc/{matched.group(1)}").exists():
            run(["ip", "netns", "del", name], check=False)


class NetnsCluster(LocalCluster):
    """A LocalCluster whose ZooKeeper listens on the lab's ZooKeeper address and whose bookies each
    run in their own namespace (`ip netns exec NS python -m dlog_tools.cli bookie start --host ...`)."""

    def __init__(self, directory: Path | str, lab: NetnsLab, *, zk_root: str = "/bookkeeper",
                 bookie_args: list[str] | None = None) -> None:
        self.lab = lab
        directory = Path(directory)
        zk = EmbeddedZooKeeper(directory / "zookeeper", host=lab.zk_host)
        super().__init__(directory, bookies=lab.bookies, zk_root=zk_root, bookie_args=bookie_args,
                         zk_server=zk)
        self.bookies = [NetnsBookie(b.index, b.port, b.data_dir, host=lab.bookie_host(b.index),
                                    netns=lab.namespaces[b.index]) for b in self.bookies]

    def start(self, timeout_s: float = 60.0) -> None:
        self.zk.start(timeout_s=timeout_s)
        super().start(timeout_s)

    def stop(self) -> None:
        for bookie in self.bookies:
            if bookie.running:
                os.kill(bookie.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
        super().stop()
        self.zk.stop()

    def bookie_command(self, bookie: BookieProcess) -> list[str]:
        assert isinstance(bookie, NetnsBookie)
        return ["ip", "netns", "exec", bookie.netns, sys.executable, "-m", "dlog_tools.cli", "bookie", "start",
                "--dir", str(bookie.data_dir), "--host", bookie.host, "--port", str(bookie.port),
                "--http-port", "0", "--zk", self.zk_address, "--zk-root", self.zk_root,
                # off loopback a bookie is secure unless told by name; these test networks are private
                "--insecure-plaintext", "--allow-anonymous",
                *self.bookie_args, *bookie.extra_args]
