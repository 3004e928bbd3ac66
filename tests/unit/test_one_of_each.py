"""The one retry helper, the clock port, the sync bridge and the request-id source behave as their
docstrings say, and the limits they carry are enforced; waits are bounded one way (asyncio.timeout)."""

from __future__ import annotations

import ast
import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bookkeeper.clock import ManualClock
from bookkeeper.errors import ConfigError, InvariantError, MetadataError, MetadataNotFoundError, TooManyRequestsError
from bookkeeper.retry import Backoff, retry
from dlog.bridge import LoopThread

ROOT = Path(__file__).resolve().parents[2]


class Flaky:
    """Fails with `error` the first `failures` calls, then returns the call count."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls


async def test_retry_retries_retryable_errors_with_growing_capped_delays():
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    policy = Backoff(attempts_max=6, delay_s_first=0.1, delay_s_max=0.3, jitter_fraction=0.0)
    operation = Flaky(4, MetadataError("zookeeper connection loss"))
    assert await retry(operation, policy, what="test", sleep=sleep) == 5
    assert slept == pytest.approx([0.1, 0.2, 0.3, 0.3])


async def test_retry_gives_up_after_the_last_attempt_with_the_last_error():
    async def sleep(seconds: float) -> None:
        pass

    operation = Flaky(10, MetadataError("still down"))
    with pytest.raises(MetadataError, match="still down"):
        await retry(operation, Backoff(attempts_max=3), what="test", sleep=sleep)
    assert operation.calls == 3


async def test_retry_never_retries_what_the_error_says_is_final():
    operation = Flaky(1, MetadataNotFoundError("gone"))  # retryable = False
    with pytest.raises(MetadataNotFoundError):
        await retry(operation, Backoff(attempts_max=5), what="test")
    assert operation.calls == 1
    bug = Flaky(1, ValueError("a bug is never retried"))
    with pytest.raises(ValueError):
        await retry(bug, Backoff(attempts_max=5), what="test")
    assert bug.calls == 1


async def test_retry_stops_at_the_deadline_on_the_injected_clock():
    clock = ManualClock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    operation = Flaky(100, MetadataError("down"))
    policy = Backoff(attempts_max=100, delay_s_first=1.0, delay_s_max=1.0, jitter_fraction=0.0,
                     deadline_s=3.5)
    with pytest.raises(MetadataError):
        await retry(operation, policy, what="test", sleep=sleep, clock=clock)
    assert operation.calls == 5  # at 0, 1, 2, 3 and 3.5 s
    assert clock.monotonic_s() == pytest.approx(3.5)


def test_backoff_jitter_stays_within_its_fraction_and_bad_policies_are_refused():
    policy = Backoff(attempts_max=50, delay_s_first=1.0, delay_s_max=1.0, jitter_fraction=0.2)
    delays = list(policy.delays_s())
    assert len(delays) == 49 and all(0.8 <= delay <= 1.2 for delay in delays)
    assert len(set(delays)) > 1
    for bad in ({"attempts_max": 0}, {"attempts_max": 2, "delay_s_first": 2.0, "delay_s_max": 1.0},
                {"attempts_max": 2, "jitter_fraction": 1.5}):
        with pytest.raises(ConfigError):
            Backoff(**bad)


def test_manual_clock_moves_only_forward_and_only_when_told():
    clock = ManualClock(wall_ms=1000, monotonic_s=5.0)
    assert (clock.wall_ms(), clock.monotonic_s()) == (1000, 5.0)
    clock.advance(1.5)
    assert (clock.wall_ms(), clock.monotonic_s()) == (2500, 6.5)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_the_bridge_runs_coroutines_on_its_thread_and_refuses_a_call_from_it():
    bridge = LoopThread("test-bridge")
    try:
        async def where() -> str:
            return threading.current_thread().name

        assert bridge.call(where()) == "test-bridge"

        async def call_from_inside() -> None:
            bridge.call(asyncio.sleep(0))

        with pytest.raises(InvariantError):
            bridge.call(call_from_inside())
        with pytest.raises(TimeoutError):
            bridge.call(asyncio.sleep(5), timeout_s=0.05)
    finally:
        bridge.stop()


def test_request_ids_never_repeat_across_pools_and_connections():
    from bookkeeper.client.connection import BookieConnection, next_request_id
    from bookkeeper.client.pool import BookiePool

    drawn = [next_request_id(), BookiePool.next_request_id(), BookieConnection.next_request_id(),
             BookiePool().next_request_id()]
    assert len(set(drawn)) == len(drawn) and drawn == sorted(drawn)


async def test_the_pool_bounds_requests_queued_while_a_bookie_connects(monkeypatch):
    from bookkeeper.client import pool as pool_module
    from bookkeeper.protocol.wire import BookieInfoRequest

    connecting = asyncio.Event()

    async def never_connects(*args, **kwargs):
        connecting.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(pool_module.BookieConnection, "open", never_connects)
    pool = pool_module.BookiePool(queued_requests_max=3)
    try:
        queued = [pool.send("b1", BookieInfoRequest(pool.next_request_id())) for _ in range(3)]
        refused = pool.send("b1", BookieInfoRequest(pool.next_request_id()))
        await connecting.wait()
        assert refused.done() and isinstance(refused.exception(), TooManyRequestsError)
        assert "queued_requests_max 3" in str(refused.exception())
        assert not any(future.done() for future in queued)
    finally:
        await pool.close()
    assert all(future.done() for future in queued)  # closing fails what waited


async def test_the_journal_itself_says_when_it_is_full(tmp_path):
    from bookkeeper.bookie.journal import Journal

    journal = Journal(tmp_path, buffered_bytes_max=1000, sync=False)
    await journal.open_for_append()
    try:
        assert not journal.full
        durable = asyncio.get_running_loop().create_future()
        for _ in range(20):
            journal.append(b"x" * 100, lambda _: None if durable.done() else durable.set_result(True), None)
        assert journal.buffered_bytes >= 1000 and journal.full
        await asyncio.wait_for(durable, 10)
        await journal.wait_durable(journal.mark())
        assert not journal.full
    finally:
        await journal.close()


async def _parked_then_answered_and_cancelled(waiting: Callable[[asyncio.Future[str]], Awaitable[str]]) -> str:
    """Park a task on a future, then answer the future and cancel the task in one loop turn (a
    ZooKeeper reply and a Ctrl-C arriving together). What the task ends with."""
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(waiting(answer))
    await asyncio.sleep(0)
    answer.set_result("answer")
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


async def test_a_timeout_never_swallows_a_cancel_that_arrives_with_the_answer():
    """Why shipped code bounds waits with `asyncio.timeout`, never `asyncio.wait_for`: on Python
    3.11, wait_for returns the answer and drops the cancel when both arrive in one loop turn: a
    Ctrl-C on `dlog read --follow` that came with a ZooKeeper reply was lost, and the read went on
    following (CPython gh-86296)."""
    async def with_timeout(answer: asyncio.Future[str]) -> str:
        async with asyncio.timeout(5):
            return await answer

    async def with_wait_for(answer: asyncio.Future[str]) -> str:
        return await asyncio.wait_for(answer, 5)

    assert await _parked_then_answered_and_cancelled(with_timeout) == "cancelled"
    if sys.version_info < (3, 12):
        assert await _parked_then_answered_and_cancelled(with_wait_for) == "answer"  # the race
    offenders = []
    for top in ("bookkeeper", "dlog", "dlog_spark", "dlog_tools"):
        for file in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if isinstance(node, ast.Attribute) and node.attr == "wait_for" and \
                        isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                    offenders.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"asyncio.wait_for in shipped code (use asyncio.timeout): {offenders}"


# time.* functions that read a clock (sleeping is not reading); datetime's constructors of "now"
TIME_READS = frozenset({"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
                        "process_time", "process_time_ns", "thread_time", "thread_time_ns",
                        "clock_gettime", "clock_gettime_ns"})
DATETIME_NOW = frozenset({"now", "utcnow", "today"})


def reads_of_the_time(source: str) -> list[tuple[int, str]]:
    """(line, what) for every read of the time in `source` that does not go through the clock port:
    a time.* clock function (called, or passed on as a default), one imported from `time`,
    datetime's now/utcnow/today, and an event loop's `time()`; also under other names."""
    tree = ast.parse(source)
    time_modules, datetime_classes = {"time"}, {"datetime", "date"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            time_modules |= {alias.asname for alias in node.names if alias.name == "time" and alias.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "datetime":
            datetime_classes |= {alias.asname or alias.name for alias in node.names
                                 if alias.name in ("datetime", "date")}
    called_bare = {id(call.func) for call in ast.walk(tree)
                   if isinstance(call, ast.Call) and not call.args and not call.keywords}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [(node.lineno, f"from time import {alias.name}") for alias in node.names
                      if alias.name in TIME_READS]
        elif isinstance(node, ast.Attribute) and node.attr in TIME_READS | DATETIME_NOW:
            owner = node.value.id if isinstance(node.value, ast.Name) else \
                node.value.attr if isinstance(node.value, ast.Attribute) else None
            if (owner in time_modules and node.attr in TIME_READS and isinstance(node.value, ast.Name)) or \
                    (owner in datetime_classes and node.attr in DATETIME_NOW):
                found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
            elif node.attr == "time" and owner not in time_modules and id(node) in called_bare:
                found.append((node.lineno, f"{ast.unparse(node)}()"))  # an event loop's clock
    return sorted(found)


def test_the_time_scan_finds_every_way_of_reading_the_clock():
    source = ("import time, datetime\nfrom time import monotonic\nfrom datetime import datetime as dt\n"
              "a = time.time()\nb = time.perf_counter_ns()\ndef f(clock=time.monotonic): pass\n"
              "c = datetime.datetime.now(datetime.timezone.utc)\nd = dt.utcnow()\n"
              "e = asyncio.get_running_loop().time()\ng = self._loop.time()\n"
              "time.sleep(1)\nawait asyncio.sleep(1)\nh = clock.monotonic_s()\ni = wall_ms()\n")
    assert [what for _, what in reads_of_the_time(source)] == [
        "from time import monotonic", "time.time", "time.perf_counter_ns", "time.monotonic",
        "datetime.datetime.now", "dt.utcnow", "asyncio.get_running_loop().time()", "self._loop.time()"]


def test_only_the_clock_port_reads_the_time():
    """Every read of the time in shipped code goes through bookkeeper/clock.py (the `Clock` a
    component is given, or the port's module-level readings), so a simulator can drive whatever
    decides by the time, and there is one place that says what each reading means."""
    files = [ROOT / "pyspark_dlog.py"] + [file for top in ("bookkeeper", "dlog", "dlog_spark", "dlog_tools")
                                          for file in sorted((ROOT / top).rglob("*.py"))]
    offenders = [f"{file.relative_to(ROOT)}:{line}: {what}" for file in files
                 if file != ROOT / "bookkeeper/clock.py"
                 for line, what in reads_of_the_time(file.read_text())]
    assert not offenders, "reads of the time outside bookkeeper/clock.py:\n" + "\n".join(offenders)
