"""Who listens on a TCP port: so a server we start can prove the port is its own, and an error can
name the process that holds it.

Linux: `/proc/net/tcp` and `/proc/net/tcp6` map a listening port to socket inodes and
`/proc/<pid>/fd` maps an inode to its process. Another user's processes cannot be inspected without
privileges; then `ss -ltnp` is asked, and when neither tells, the holder is unknown and messages name
the port alone.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bookkeeper.errors import PortInUseError

TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
TCP_LISTEN_STATE = "0A"
COMMAND_CHARS_MAX = 200
SS_TIMEOUT_S = 2.0
_SS_USER = re.compile(r'\("([^"]*)",pid=(\d+),')


@dataclass(frozen=True, slots=True)
class PortHolder:
    pid: int
    command: str  # its command line, shortened

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"


def port_bindable(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now. SO_REUSEADDR as servers set it (Java's
    ServerSocket and asyncio do), so a port whose old connections linger in TIME_WAIT is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def listening_inodes(port: int) -> set[int]:
    """Inodes of the sockets listening on `port` (any local address); empty when none or unknown."""
    inodes: set[int] = set()
    for table in TCP_TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN_STATE:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                inodes.add(int(fields[9]))
    return inodes


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds a socket listening on `port`; None when that cannot be told
    (no /proc, or the socket tables name no listener)."""
    inodes = listening_inodes(port)
    if not inodes:
        return None
    owned = _socket_inodes(pid)
    if owned is None:
        return None
    return bool(inodes & owned)


def port_holder(port: int) -> PortHolder | None:
    """The process listening on `port`, if it can be found out."""
    inodes = listening_inodes(port)
    if inodes:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (_socket_inodes(int(entry.name)) or set()) & inodes:
                return PortHolder(int(entry.name), command_of(int(entry.name)))
    return _holder_from_ss(port)


def command_of(pid: int) -> str:
    """A process's command line for a message: program base name and arguments, shortened."""
    try:
        parts = [part.decode(errors="replace") for part in
                 Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part]
    except OSError:
        return ""
    if not parts:
        return ""
    parts[0] = os.path.basename(parts[0])
    if parts[0] == "java":  # the JVM flags and classpath say nothing; the main class does
        parts = ["java", "...", *parts[_java_main_index(parts):]]
    text = " ".join(" ".join(parts).split())  # one line, whatever the arguments hold
    return text if len(text) <= COMMAND_CHARS_MAX else text[: COMMAND_CHARS_MAX - 3] + "..."


def _java_main_index(parts: list[str]) -> int:
    """Index of the main class (or `-jar`) in a java command line: the first argument that is no
    flag, skipping the values of -cp and friends."""
    index = 1
    while index < len(parts):
        part = parts[index]
        if part in ("-cp", "-classpath", "--class-path", "-p", "--module-path"):
            index += 2
        elif part.startswith("-") and part != "-jar":
            index += 1
        else:
            return index
    return len(parts)


def check_port_free(host: str, port: int, what: str, hint: str) -> None:
    """PortInUseError naming the holder when a server could not listen on host:port."""
    if not port_bindable(host, port):
        raise port_in_use(host, port, what, hint)


def port_in_use(host: str, port: int, what: str, hint: str) -> PortInUseError:
    holder = port_holder(port)
    held_by = f"held by {holder}" if holder is not None else "held by another process"
    return PortInUseError(f"{what} port {host}:{port} is {held_by}; {hint}")


def _socket_inodes(pid: int) -> set[int] | None:
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or another user's process
        return None
    inodes = set()
    for descriptor in descriptors:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def _holder_from_ss(port: int) -> PortHolder | None:
    ss = shutil.which("ss")
    if ss is None:
        return None
    try:
        output = subprocess.run([ss, "-ltnpH", f"sport = :{port}"], capture_output=True, text=True,
                                timeout=SS_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = _SS_USER.search(output)
    if found is None:
        return None
    pid = int(found.group(2))
    return PortHolder(pid, command_of(pid) or found.group(1))
