"""The producer checks of the serving tier: what each idempotent producer was told (`producer_ack`
facts: its batch's first sequence, the values, the base offset acknowledged) against a final read
of the served stream (`served_final`: [position, value] per record); the same for named native
producers (`named_ack`, `named_final`: issue 25's writers whose processes are killed, whose acks
may say no offset: a resend answered as a duplicate older than the batches remembered). Per producer:

    producer_duplicate  a value the stream holds more than once (a resend written twice)
    producer_lost       an acknowledged value the stream does not hold
    producer_offset     an acknowledged offset that does not hold the value acknowledged there
    producer_refused    a batch refused with a non-retriable error (out of order, fenced, a limit)
    producer_final      the stream could not be read back at the end
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from .recorder import Anomaly

PRODUCER_DUPLICATE = "producer_duplicate"
PRODUCER_LOST = "producer_lost"
PRODUCER_OFFSET = "producer_offset"
PRODUCER_REFUSED = "producer_refused"
PRODUCER_FINAL = "producer_final"
EXAMPLES_MAX = 5


def has_producer_events(events: Iterable[dict[str, Any]]) -> bool:
    return any(event.get("f") in ("producer_ack", "served_final", "named_ack", "named_final") for event in events)


def check_producers(events: Iterable[dict[str, Any]]) -> tuple[list[Anomaly], dict[str, int]]:
    """(anomalies, stats) of the producer checks (module docstring): the served stream's, then
    the named producers'."""
    events = list(events)
    anomalies, stats = check_stream_producers(events, "producer_ack", "served_final")
    named_anomalies, named_stats = check_stream_producers(events, "named_ack", "named_final")
    return anomalies + named_anomalies, {**stats, **{f"named_{key}": value for key, value in named_stats.items()}}


def check_stream_producers(events: list[dict[str, Any]], ack_fact: str,
                           final_fact: str) -> tuple[list[Anomaly], dict[str, int]]:
    anomalies: list[Anomaly] = []
    acks: dict[str, list[dict[str, Any]]] = defaultdict(list)
    final: list[list[Any]] | None = None
    for event in events:
        kind = event.get("f")
        if kind == ack_fact:
            acks[event["producer"]].append(event)
        elif kind == "producer_refused" and ack_fact == "producer_ack":  # (named producers' too: counted once)
            anomalies.append(Anomaly(PRODUCER_REFUSED, f"producer {event['producer']}: batch from sequence "
                                                       f"{event['sequence']} refused with {event['error']}"))
        elif kind == final_fact:
            if event.get("type") != "ok":
                anomalies.append(Anomaly(PRODUCER_FINAL, f"the served stream could not be read: {event.get('error')}"))
            else:
                final = event["records"]
    if final is None:
        return anomalies, {}
    counts = Counter(value for _, value in final)
    at = {position: value for position, value in final}
    by_producer: dict[str, Counter[str]] = defaultdict(Counter)
    for value, count in counts.items():
        by_producer[value.rsplit("-", 1)[0]][value] = count
    stats = {"produced_batches": sum(len(batches) for batches in acks.values()), "served_records": len(final)}
    for producer in sorted(set(acks) | set(by_producer)):
        twice = sorted(value for value, count in by_producer[producer].items() if count > 1)
        if twice:
            anomalies.append(Anomaly(PRODUCER_DUPLICATE, f"producer {producer}: {len(twice)} values written more "
                                                         f"than once, e.g. {twice[:EXAMPLES_MAX]}"))
        acked = [(None if event["offset"] is None else event["offset"] + index, value) for event in acks[producer]
                 for index, value in enumerate(event["values"])]
        lost = [value for _, value in acked if value not in counts]
        if lost:
            anomalies.append(Anomaly(PRODUCER_LOST, f"producer {producer}: {len(lost)} acknowledged values are not "
                                                    f"in the stream, e.g. {lost[:EXAMPLES_MAX]}"))
        moved = [(offset, value, at.get(offset)) for offset, value in acked
                 if offset is not None and at.get(offset) != value]
        if moved:
            anomalies.append(Anomaly(PRODUCER_OFFSET, f"producer {producer}: {len(moved)} acknowledged offsets hold "
                                                      f"another value, e.g. {moved[:EXAMPLES_MAX]}"))
    return anomalies, stats
