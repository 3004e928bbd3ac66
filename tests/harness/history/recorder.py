"""The one history recorder: Jepsen-style operations (invoke, then ok / fail / unknown) and facts,
as events in memory and, when given a path, as JSON lines in a file.

Events are dicts ``{"t", "process", "f", "type", ...}``. `t` comes from the injected clock:
`time.monotonic()` for real processes (one clock for every process of the machine), the simulated
clock for simulators. With a file, each event is appended with one ``write(2)`` to a file opened
``O_APPEND``, so several processes (a writer that gets ``kill -9``) can share it and a torn last
line is skipped on load; events recorded to a file must be JSON (simulators keep objects, in
memory only).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXAMPLES_PER_KIND_MAX = 5  # anomalies of one kind reported one by one; the rest are counted


class History:
    """Records events (in memory, and to a JSON-lines file when `path` is given)."""

    def __init__(self, path: Path | str | None = None, *, process_tag: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path) if path is not None else None
        self.clock = clock
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._op_numbers = iter(range(1, 2**62))
        self._tag = process_tag or f"{os.getpid()}"
        self._fd: int | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def record(self, process: str, f: str, type: str = "info", **fields: Any) -> dict[str, Any]:
        event = {"t": self.clock(), "process": process, "f": f, "type": type, **fields}
        with self._lock:
            self.events.append(event)
            if self._fd is not None:
                line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
                os.write(self._fd, line)  # one write: whole lines even if the process is killed
        return event

    def invoke(self, process: str, f: str, **fields: Any) -> str:
        """Record the start of an operation; returns its id for `complete`."""
        op = f"{self._tag}-{next(self._op_numbers)}"
        self.record(process, f, "invoke", op=op, **fields)
        return op

    def complete(self, op: str, process: str, f: str, type: str, **fields: Any) -> dict[str, Any]:
        if type not in ("ok", "fail", "unknown"):
            raise ValueError(f"completion type must be ok, fail or unknown, got {type!r}")
        return self.record(process, f, type, op=op, **fields)

    def read(self, process: str, offset: Any, value: str, **fields: Any) -> None:
        """A record a reader handed out (`position=`: its stream position, when the client knows it)."""
        self.record(process, "read", "ok", offset=offset_list(offset), value=value, **fields)


def offset_list(offset: Any) -> list[int]:
    """`dlog.Offset`, a tuple or a list as ``[ledger_id, entry_id, slot]``."""
    if hasattr(offset, "ledger_id"):
        return [offset.ledger_id, offset.entry_id, offset.slot]
    ledger_id, entry_id, slot = offset
    return [int(ledger_id), int(entry_id), int(slot)]


def load(path: Path | str) -> list[dict[str, Any]]:
    """The events of a history file in time order; a torn (partly written) line is skipped."""
    events = []
    with open(path, "rb") as file:
        for line in file:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    events.sort(key=lambda event: event["t"])
    return events


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(slots=True)
class Report:
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def kinds(self) -> set[str]:
        return {anomaly.kind for anomaly in self.anomalies}

    def messages(self) -> list[str]:
        return [str(anomaly) for anomaly in self.anomalies]

    def summary(self) -> str:
        lines = [", ".join(f"{key} {value}" for key, value in self.stats.items())]
        counts = Counter(anomaly.kind for anomaly in self.anomalies)
        shown: Counter[str] = Counter()
        for anomaly in self.anomalies:
            shown[anomaly.kind] += 1
            if shown[anomaly.kind] <= EXAMPLES_PER_KIND_MAX:
                lines.append(f"  {anomaly}")
        for kind, count in counts.items():
            if count > EXAMPLES_PER_KIND_MAX:
                lines.append(f"  ... and {count - EXAMPLES_PER_KIND_MAX} more {kind}")
        if not self.anomalies:
            lines.append("  no anomalies")
        return "\n".join(lines)
