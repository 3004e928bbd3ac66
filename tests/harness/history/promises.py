"""The stream checks of L5 and L7 beyond data integrity: routine operations never hurt live clients,
removed data stays removed, every client keeps moving.

    writer_death        a writer session died and nothing explains it: no other writer opened the
                        stream meanwhile (a takeover) and no fault was on (truncation, retention,
                        subscription and sink commits, session expiry and brief metadata errors are
                        routine: they explain nothing, L7)
    reader_behind       when a tailing reader was stopped, it had not returned the last record that
                        was acknowledged at least the bound before (however slow its consumer, L7)
    truncation_ignored  a record below a committed truncation point in the final read, or returned
                        by a reader well after the truncation was committed (L5)
    retention           a retention run removed the last completed segment
    entry_size          an entry of a stream writer's ledger larger than the stream's roll size
                        (the simulator reports entry sizes)
    refused             a well-formed write refused (ConfigError), e.g. a batch without its
                        nullable columns
    slow_write          a sequential write of an idle writer (a probe) not acknowledged within its
                        bound: records must not wait for a timer when nothing is in flight
    bug                 a client's call ended with an exception that is not one of dlog's errors
                        (an AttributeError out of the writer machine): a crash, whatever the faults

Each takes the parsed history (`stream._Checker`) and adds what it finds.
"""

from __future__ import annotations

from typing import Any

WRITER_DEATH = "writer_death"
READER_BEHIND = "reader_behind"
TRUNCATION_IGNORED = "truncation_ignored"
RETENTION = "retention"
ENTRY_SIZE = "entry_size"
REFUSED = "refused"
SLOW_WRITE = "slow_write"
BUG = "bug"
PROMISE_KINDS = (WRITER_DEATH, READER_BEHIND, TRUNCATION_IGNORED, RETENTION, ENTRY_SIZE, REFUSED, SLOW_WRITE, BUG)

# faults that must never end a writer (RELIABILITY.md L7): they explain no death
ROUTINE_FAULTS = frozenset({"truncate", "retention", "subscription", "sink_commit", "session_expiry",
                            "metadata_blip", "metadata_delay"})
TRUNCATION_GRACE_S = 2.0  # a reader may hand out what it had already taken before it learned of a cut
EXPLAIN_WINDOW_S = 10.0  # a fault explains deaths this long after it, even once healed


def check_writer_deaths(c: Any) -> None:
    opened = {op.process: op.invoke_t for op in c.ops.values() if op.f == "open_writer" and op.type == "ok"}
    # another writer's open that overlapped our session may have fenced us, even one that failed
    # (a sink commit takes the writer lock and seals what it finds, as an open does)
    opens = [(op.invoke_t, op.complete_t if op.complete_t is not None else float("inf"), op.process)
             for op in c.ops.values() if op.f in ("open_writer", "sink_commit")]
    faults = [(event["t"], event.get("kind", "?")) for event in c.events
              if event.get("f") == "fault" and event.get("kind") not in ROUTINE_FAULTS]
    heals = c.heals
    for event in c.events:
        if event.get("f") != "writer_died":
            continue
        process, died = event["process"], event["t"]
        since = opened.get(process, float("-inf"))
        if any(process != other and began <= died and ended >= since for began, ended, other in opens):
            continue  # another writer opened the stream meanwhile: a takeover
        if any(t <= died and (died - t <= EXPLAIN_WINDOW_S or not any(t < h < died for h in heals))
               for t, _ in faults):
            continue
        c.add(WRITER_DEATH, f"writer {process} died ({event.get('error', '?')}) with no fault or takeover to "
                            "explain it")


def check_readers_kept_up(c: Any, bound_s: float) -> None:
    if c.final is None:
        return
    final_values = {value for _, value in c.final}
    acked = sorted((op.complete_t, op.value) for op in c.ops.values()
                   if op.f == "write" and op.type == "ok" and op.complete_t is not None and op.value in final_values)
    for event in c.events:
        if event.get("f") != "reader_stop":
            continue
        family, stopped = event["family"], event["t"]
        due = [value for t, value in acked if t <= stopped - bound_s]
        if not due:
            continue
        read = {value for process, records in c.reads.items() if process.split("#", 1)[0] == family
                for _, value, _ in records}
        if due[-1] not in read:
            c.add(READER_BEHIND, f"tailing reader {family} had not returned {due[-1]!r} when it stopped, "
                                 f"{bound_s} s after that record was acknowledged")


def check_truncation_kept(c: Any) -> None:
    points = [(event["t"], tuple(event["before"])) for event in c.events if event.get("f") == "truncation_done"]
    if not points:
        return
    keyed = [(t, c.key(point), point) for t, point in points]
    keyed = [(t, key, point) for t, key, point in keyed if key is not None]
    for offset, value in c.final or []:
        key = c.key(offset)
        below = next((point for _, cut, point in keyed if key is not None and key < cut), None)
        if below is not None:
            c.add(TRUNCATION_IGNORED, f"the final read returned {value!r} at {_show(offset)}, below the "
                                      f"truncation point {_show(below)}")
            break
    for process, records in c.reads.items():
        taken: dict[tuple[int, int], float] = {}  # an entry is handed out whole: when its first record was
        for offset, value, read_at in records:
            key = c.key(offset)
            taken_at = taken.setdefault((offset[0], offset[1]), read_at)
            below = next((point for t, cut, point in keyed
                          if key is not None and key < cut and taken_at > t + TRUNCATION_GRACE_S), None)
            if below is not None:
                c.add(TRUNCATION_IGNORED, f"reader {process} returned {value!r} at {_show(offset)}, below the "
                                          f"truncation point {_show(below)} committed before")
                break


def check_retention(c: Any) -> None:
    for event in c.events:
        if event.get("f") != "retention" or not event.get("removed"):
            continue
        sealed = [(sequence, ledger_id) for sequence, ledger_id, state in event["after"] if state != "in_progress"]
        if sealed and max(sealed)[1] in event["removed"]:
            c.add(RETENTION, f"retention removed ledger {max(sealed)[1]}, the last completed segment "
                             f"(segment {max(sealed)[0]})")


def check_entry_sizes(c: Any) -> None:
    roll_bytes = next((event["roll_bytes"] for event in c.events if event.get("f") == "stream_config"), 0)
    if not roll_bytes:
        return
    sink_ledgers = {ledger for event in c.events if event.get("f") == "sink_ledgers" for ledger in event["ledgers"]}
    for event in c.events:
        if event.get("f") != "entry_sizes":
            continue
        for ledger_id, size in event["sizes"].items():
            if int(ledger_id) not in sink_ledgers and size > roll_bytes:
                c.add(ENTRY_SIZE, f"ledger {ledger_id} holds an entry of {size} bytes; the roll size is {roll_bytes}")
                return


def check_refused_and_slow(c: Any) -> None:
    for op in c.ops.values():
        if op.f != "write":
            continue
        if op.type == "fail" and str(op.error or "").startswith("ConfigError"):
            c.add(REFUSED, f"{op.process} write {op.value!r} was refused: {op.error}")
        bound = op.fields.get("bound_s")
        if op.fields.get("probe") and op.type == "ok" and bound is not None and op.complete_t is not None \
                and op.complete_t - op.invoke_t > bound:
            c.add(SLOW_WRITE, f"{op.process} sequential write {op.value!r} of an idle writer took "
                              f"{(op.complete_t - op.invoke_t) * 1000:.1f} ms (bound {bound * 1000:.0f} ms)")


def check_crashes(c: Any) -> None:
    for event in c.events:
        if event.get("f") == "bug":
            c.add(BUG, f"{event['process']} got {event.get('error', '?')}: not one of dlog's errors, a crash")


def check_all(c: Any, resume_bound_s: float | None) -> None:
    check_crashes(c)
    check_writer_deaths(c)
    check_readers_kept_up(c, resume_bound_s if resume_bound_s is not None else 25.0)
    check_truncation_kept(c)
    check_retention(c)
    check_entry_sizes(c)
    check_refused_and_slow(c)


def _show(offset: Any) -> str:
    return "?" if offset is None else ":".join(str(part) for part in offset)
