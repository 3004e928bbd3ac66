"""Options of the "dlog" Spark data source: which exist, what they mean, and their checks.

Spark hands a data source its options in a case-insensitive dict (keys lower-cased), so every
name is looked up by its lower-case form and reported back in its documented spelling. An
option that is not known for the operation at hand (a streaming read, a batch read, a write) is
an error that names it and lists the known ones: a misspelt `startingOffset` must not silently
read from the default position.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from bookkeeper.errors import ConfigError
from dlog.core.sequences import NATIVE_NAME_CHARS_MAX, native_producer
from dlog.names import check_stream_name, check_subscription_name
from dlog_spark.offsets import parse_offsets

CONNECTION_OPTIONS = ("zk", "namespace", "zkRoot", "namespaceRoot", "config", "token")
SOURCE_OPTIONS = CONNECTION_OPTIONS + (
    "stream", "streams", "streamPattern", "path", "startingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "maxRecordsPerTrigger",
    "maxBytesPerTrigger", "minRecordsPerTrigger", "maxTriggerDelay", "failOnDataLoss", "minPartitions",
    "subscription", "includeHeaders", "prefer", "readCompacted",
)
BATCH_SOURCE_OPTIONS = SOURCE_OPTIONS + ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
TIMESTAMP_STRATEGIES = ("error", "latest")
PREFER = ("bookies", "tier")  # where to read a segment that is on the tier and still on bookies
SINK_OPTIONS = CONNECTION_OPTIONS + ("stream", "path", "sinkId", "checkpointLocation", "createStream",
                                     "ensemble", "writeQuorum", "ackQuorum", "producerId", "sequenceColumn")
CREATION_OPTIONS = ("ensemble", "writeQuorum", "ackQuorum")
ROUTE_COLUMN = "stream"  # without option `stream`, the sink routes each row by this column (Kafka's `topic`)

ZK_DEFAULT = "127.0.0.1:2181"
NAMESPACE_DEFAULT = "default"
ZK_ROOT_DEFAULT = "/bookkeeper"
NAMESPACE_ROOT_DEFAULT = "/dlog"
MAX_TRIGGER_DELAY_MS_DEFAULT = 15 * 60_000  # Kafka's default
MIN_PARTITIONS_MAX = 100_000
SINK_PRODUCER_CHARS_MAX = NATIVE_NAME_CHARS_MAX - 16  # room for ".p<partition>"

_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|min|h|d)?\s*", re.ASCII)
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    zk: str = ZK_DEFAULT
    namespace: str = NAMESPACE_DEFAULT
    zk_root: str = ZK_ROOT_DEFAULT
    namespace_root: str = NAMESPACE_ROOT_DEFAULT
    config: str | None = None  # client.toml: TLS, token, ZooKeeper credentials (docs/security.md)
    token: str | None = None  # replaces the file's token

    @property
    def key(self) -> tuple[str, ...]:
        return (self.zk, self.zk_root, self.namespace_root, self.namespace, self.config or "",
                self.token or "")

    def __repr__(self) -> str:  # Spark may log options: never a token
        token = "<set>" if self.token else None
        return (f"ConnectionOptions(zk={self.zk!r}, namespace={self.namespace!r}, zk_root={self.zk_root!r}, "
                f"namespace_root={self.namespace_root!r}, config={self.config!r}, token={token})")


@dataclass(frozen=True, slots=True)
class SourceOptions:
    connection: ConnectionOptions
    streams: tuple[str, ...] = ()  # fixed streams; empty when `pattern` is set
    pattern: str | None = None
    starting: str = "latest"  # "earliest", "latest" or Spark offset JSON
    ending: str = "latest"  # batch reads only
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_MS_DEFAULT
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    subscription: str | None = None
    # Kafka's timestamp options (ms since the epoch). Per stream, a start comes from
    # startingTimestamp, else startingOffsetsByTimestamp, else startingOffsets; an end likewise.
    starting_timestamp_ms: int | None = None
    starting_by_timestamp: tuple[tuple[str, int], ...] = ()
    timestamp_strategy: str = "error"  # no record at or after a starting timestamp: fail, or "latest"
    ending_timestamp_ms: int | None = None
    ending_by_timestamp: tuple[tuple[str, int], ...] = ()
    include_headers: bool = False
    prefer: str = "bookies"  # an offloaded segment still on bookies: read it from them, or from the tier
    read_compacted: bool = False  # a compacted segment: its compacted copy at once (key compaction)

    def matches(self, stream: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, stream) is not None
        return stream in self.streams

    def starting_timestamp_of(self, stream: str) -> int | None:
        """The timestamp a stream starts at, when a timestamp option names it."""
        if self.starting_timestamp_ms is not None:
            return self.starting_timestamp_ms
        return dict(self.starting_by_timestamp).get(stream)

    def ending_timestamp_of(self, stream: str) -> int | None:
        if self.ending_timestamp_ms is not None:
            return self.ending_timestamp_ms
        return dict(self.ending_by_timestamp).get(stream)


@dataclass(frozen=True, slots=True)
class SinkProducer:
    """Each write task is the idempotent producer `<prefix>.p<partition>` of every stream it writes;
    each row's sequence is its `column` (increasing within a task's rows, gaps allowed)."""

    prefix: str
    column: str

    def of_partition(self, partition: int) -> str:
        return f"{self.prefix}.p{partition}"


@dataclass(frozen=True, slots=True)
class StreamCreation:
    """Whether the sink creates a missing target stream (`createStream`), and its quorum."""

    enabled: bool = False
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2


@dataclass(frozen=True, slots=True)
class SinkOptions:
    connection: ConnectionOptions
    stream: str | None  # None: each row's `stream` column names its target (routing)
    sink_id: str | None  # None: a batch write, no replay detection
    creation: StreamCreation = StreamCreation()
    producer: SinkProducer | None = None  # producerId + sequenceColumn: each task an idempotent producer

    @property
    def routed(self) -> bool:
        return self.stream is None


def parse_source_options(options: Mapping[str, str], *, batch: bool) -> SourceOptions:
    values = _known(options, BATCH_SOURCE_OPTIONS if batch else SOURCE_OPTIONS,
                    "a batch read" if batch else "a streaming read")
    streams, pattern = _stream_selection(values)
    starting = _offsets_option(values, "startingOffsets", "earliest" if batch else "latest")
    ending = _offsets_option(values, "endingOffsets", "latest") if batch else "latest"
    if ending == "earliest":
        raise ConfigError("endingOffsets 'earliest' is not allowed: use 'latest' or offset JSON")
    max_records = _positive_int(values, "maxRecordsPerTrigger")
    max_bytes = _positive_int(values, "maxBytesPerTrigger")
    min_records = _positive_int(values, "minRecordsPerTrigger")
    if max_records is not None and min_records is not None and min_records > max_records:
        raise ConfigError(f"minRecordsPerTrigger {min_records} is above maxRecordsPerTrigger {max_records}")
    delay_ms = MAX_TRIGGER_DELAY_MS_DEFAULT
    if "maxTriggerDelay" in values:
        delay_ms = parse_duration_ms(values["maxTriggerDelay"], "maxTriggerDelay")
    min_partitions = _positive_int(values, "minPartitions")
    if min_partitions is not None and min_partitions > MIN_PARTITIONS_MAX:
        raise ConfigError(f"minPartitions {min_partitions} is over {MIN_PARTITIONS_MAX}")
    subscription = values.get("subscription")
    if subscription is not None:
        check_subscription_name(subscription)
    strategy = values.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
    if strategy not in TIMESTAMP_STRATEGIES:
        raise ConfigError(f"bad startingOffsetsByTimestampStrategy {values['startingOffsetsByTimestampStrategy']!r}: "
                          "use error (fail when a stream has no record at or after the timestamp) or latest")
    prefer = values.get("prefer", "bookies").strip().lower()
    if prefer not in PREFER:
        raise ConfigError(f"bad prefer {values['prefer']!r}: use tier or bookies (where to read segments that "
                          "are both on the tier and still on bookies; bookies is the default)")
    starting_by = _timestamps_by_stream(values, "startingOffsetsByTimestamp")
    ending_by = _timestamps_by_stream(values, "endingOffsetsByTimestamp")
    for name, _ in starting_by + ending_by:
        if pattern is None and name not in streams:
            raise ConfigError(f"a timestamp option names stream {name!r}, which this query does not read")
    return SourceOptions(_connection(values), streams, pattern, starting, ending, max_records, max_bytes,
                         min_records, delay_ms, _boolean(values, "failOnDataLoss", True), min_partitions,
                         subscription, _timestamp(values, "startingTimestamp"), starting_by, strategy,
                         _timestamp(values, "endingTimestamp"), ending_by,
                         _boolean(values, "includeHeaders", False), prefer,
                         _boolean(values, "readCompacted", False))


def parse_sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    values = _known(options, SINK_OPTIONS, "a streaming write" if streaming else "a batch write")
    stream = values.get("stream") or values.get("path") or None
    if "stream" in values and "path" in values and values["stream"] != values["path"]:
        raise ConfigError(f"option 'stream' {values['stream']!r} and the path {values['path']!r} differ: give one")
    if stream is not None:
        check_stream_name(stream)
    sink_id = None
    if streaming:
        sink_id = values.get("sinkId") or _sink_id_from_checkpoint(values.get("checkpointLocation"))
        if sink_id is None:
            raise ConfigError("the dlog streaming sink needs option 'sinkId' or option 'checkpointLocation' "
                              "(its last committed batch id is kept per sink id, which makes replays "
                              "of a batch after a restart write nothing)")
        check_subscription_name(sink_id)
    return SinkOptions(_connection(values), stream, sink_id, _stream_creation(values), _sink_producer(values))


def _sink_producer(values: Mapping[str, str]) -> SinkProducer | None:
    prefix, column = values.get("producerId"), values.get("sequenceColumn")
    if prefix is None and column is None:
        return None
    if prefix is None or not column:
        raise ConfigError("options 'producerId' and 'sequenceColumn' go together: each write task becomes the "
                          "idempotent producer <producerId>.p<partition>, and the column gives each row's sequence "
                          "(a rerun then writes only the rows not yet in the stream)")
    if len(prefix) > SINK_PRODUCER_CHARS_MAX:
        raise ConfigError(f"bad producerId {prefix!r}: at most {SINK_PRODUCER_CHARS_MAX} characters (the task's "
                          "partition is added to it)")
    native_producer(prefix)  # its characters
    return SinkProducer(prefix, column)


def _stream_creation(values: Mapping[str, str]) -> StreamCreation:
    enabled = _boolean(values, "createStream", False)
    given = [name for name in CREATION_OPTIONS if name in values]
    if given and not enabled:
        raise ConfigError(f"option {given[0]!r} only applies with createStream=true (the quorum of streams "
                          "the sink creates)")
    default = StreamCreation()
    ensemble = _positive_int(values, "ensemble") or default.ensemble
    write_quorum = _positive_int(values, "writeQuorum") or min(default.write_quorum, ensemble)
    ack_quorum = _positive_int(values, "ackQuorum") or min(default.ack_quorum, write_quorum)
    if not ack_quorum <= write_quorum <= ensemble:
        raise ConfigError(f"createStream quorum ensemble={ensemble} writeQuorum={write_quorum} ackQuorum={ack_quorum}: "
                          "need ackQuorum <= writeQuorum <= ensemble")
    return StreamCreation(enabled, ensemble, write_quorum, ack_quorum)


def parse_duration_ms(text: str, name: str) -> int:
    """Milliseconds from `500ms`, `30s`, `15m`, `2h`, `1d`; a bare number means milliseconds."""
    matched = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if matched is None:
        raise ConfigError(f"bad {name} {text!r}: write a duration like 500ms, 30s, 15m, 2h or 1d")
    return int(float(matched.group(1)) * _DURATION_UNITS_MS[matched.group(2) or "ms"])


# ------------------------------------------------------------------------------ helpers


def _known(options: Mapping[str, str], known: tuple[str, ...], operation: str) -> dict[str, str]:
    """The options under their documented names; an unknown one is a ConfigError naming it."""
    spelling = {name.lower(): name for name in known}
    values: dict[str, str] = {}
    for key, value in options.items():
        name = spelling.get(key.lower())
        if name is None:
            raise ConfigError(f"unknown option {key!r} for {operation} of the dlog data source; "
                              f"known options: {', '.join(known)}")
        values[name] = value
    return values


def _connection(values: Mapping[str, str]) -> ConnectionOptions:
    zk = values.get("zk", _zk_from_config(values.get("config"))).strip()
    if not zk:
        raise ConfigError("option 'zk' is empty: give the ZooKeeper address, e.g. 127.0.0.1:2181")
    namespace = values.get("namespace", NAMESPACE_DEFAULT)
    check_subscription_name(namespace)  # a namespace name follows the same rules
    roots = []
    for name, default in (("zkRoot", ZK_ROOT_DEFAULT), ("namespaceRoot", NAMESPACE_ROOT_DEFAULT)):
        root = values.get(name, default)
        if not root.startswith("/") or root.endswith("/") or "//" in root:
            raise ConfigError(f"bad {name} {root!r}: use an absolute ZooKeeper path like {default}")
        roots.append(root)
    config = values.get("config") or None
    if config is not None and not os.path.isfile(config):
        raise ConfigError(f"option 'config' {config!r} is not a file: give the path of a client.toml")
    token = values.get("token") or None
    return ConnectionOptions(zk, namespace, roots[0], roots[1], config, token)


def _zk_from_config(config: str | None) -> str:
    if not config or not os.path.isfile(config):
        return ZK_DEFAULT
    from bookkeeper.security.settings import load_cluster_table

    return str(load_cluster_table(config).get("zk") or ZK_DEFAULT)


def _stream_selection(values: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    given = [name for name in ("stream", "streams", "streamPattern", "path") if values.get(name)]
    if len(given) != 1:
        shown = ", ".join(given) if given else "none"
        raise ConfigError(f"give exactly one of the options stream, streams or streamPattern (given: {shown})")
    name = given[0]
    if name == "streamPattern":
        try:
            re.compile(values[name])
        except re.error as error:
            raise ConfigError(f"bad streamPattern {values[name]!r}: {error}") from error
        return (), values[name]
    streams = tuple(part.strip() for part in values[name].split(",")) if name == "streams" else (values[name],)
    for stream in streams:
        check_stream_name(stream)
    if len(set(streams)) != len(streams):
        raise ConfigError(f"option {name} names a stream twice: {values[name]!r}")
    return tuple(sorted(streams)), None


def _offsets_option(values: Mapping[str, str], name: str, default: str) -> str:
    text = values.get(name, default).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    parse_offsets(text)  # a ConfigError says what is wrong
    return text


def _timestamp(values: Mapping[str, str], name: str) -> int | None:
    """Milliseconds since the epoch, as Kafka's timestamp options take them."""
    if name not in values:
        return None
    text = values[name].strip()
    if not text.isascii() or not text.isdigit() or len(text) > 15:
        raise ConfigError(f"bad {name} {values[name]!r}: use milliseconds since the epoch, e.g. 1700000000000")
    return int(text)


def _timestamps_by_stream(values: Mapping[str, str], name: str) -> tuple[tuple[str, int], ...]:
    """JSON {"stream": ms, ...} (Kafka's per-partition form, per stream here)."""
    if name not in values:
        return ()
    expected = 'use JSON like {"orders": 1700000000000} (stream -> milliseconds since the epoch)'
    try:
        document = json.loads(values[name])
    except ValueError as error:
        raise ConfigError(f"bad {name} {values[name][:80]!r}: {error}; {expected}") from error
    if not isinstance(document, dict) or not document:
        raise ConfigError(f"bad {name} {values[name][:80]!r}: {expected}")
    result = []
    for stream, value in sorted(document.items()):
        check_stream_name(stream)
        if type(value) is not int or not 0 <= value < 10**15:
            raise ConfigError(f"bad {name} timestamp {value!r} for stream {stream!r}: {expected}")
        result.append((stream, value))
    return tuple(result)


def _positive_int(values: Mapping[str, str], name: str) -> int | None:
    if name not in values:
        return None
    text = values[name].strip()
    if not text.isascii() or not text.isdigit() or int(text) <= 0 or len(text) > 18:
        raise ConfigError(f"bad {name} {values[name]!r}: use a positive whole number")
    return int(text)


def _boolean(values: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in values:
        return default
    text = values[name].strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"bad {name} {values[name]!r}: use true or false")
    return text == "true"


def _sink_id_from_checkpoint(location: str | None) -> str | None:
    """A stable sink id for a query: a digest of its checkpoint location (normalized)."""
    if not location:
        return None
    normalized = location if "://" in location else os.path.abspath(location)
    return "spark-" + hashlib.sha256(normalized.rstrip("/").encode()).hexdigest()[:24]
