"""The stream writer's settings, and the entry-size arithmetic both of its parts use: the batching
of records into entries (`batching`) and the segment commits around them (`writer`)."""

from __future__ import annotations

from dataclasses import dataclass

ENTRY_HEADER_BYTES = 40  # dlog.segments.codec's record-set header
ENTRY_SLACK_BYTES = 2048  # Arrow IPC metadata and buffer padding of one entry, and the zstd frame
RECORD_OVERHEAD_BYTES = 17  # what a record costs in an entry beyond its key and value (offsets, bitmaps)


def entry_budget_bytes(entry_bytes_limit: int) -> int:
    """Record bytes (a record counts its value, key and headers plus RECORD_OVERHEAD_BYTES) that
    surely encode within the limit, compressed or not (zstd may grow incompressible data by 1/256)."""
    return (entry_bytes_limit - ENTRY_HEADER_BYTES) * 256 // 257 - ENTRY_SLACK_BYTES


@dataclass(frozen=True, slots=True)
class WriterSettings:
    stream: str
    roll_bytes: int = 0  # 0: no limit
    roll_age_ms: int = 0
    roll_records: int = 0
    flush_bytes: int = 1 << 20
    flush_records: int = 20_000
    linger_ms: float = 0.0
    partial_entries_in_flight_max: int = 1
    buffer_bytes_max: int = 64 << 20
    entry_bytes_max: int = 3 << 20
    lock_timeout_s: float = 30.0
    takeover: bool = False
    retention_on_roll: bool = False
    commit_conflicts_max: int = 50
    schema_version: int = 0  # the stream's schema version its records are written with (recorded per segment)
    # partial entries wait for the process's flush round (RequestRound -> on_round, once per event-loop
    # turn for every writer) instead of going out at the write or acknowledgement that allows them
    flush_rounds: bool = False

    @property
    def entry_bytes_limit(self) -> int:
        """No entry is larger than this: the entry maximum, and the roll size when it is smaller."""
        if self.roll_bytes and self.roll_bytes < self.entry_bytes_max:
            return self.roll_bytes
        return self.entry_bytes_max
