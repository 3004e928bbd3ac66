"""Re-replication pacing (R3): token buckets hold rates over time, and the copy window backs off
when copies make a bookie slow and grows back when they do not."""

from __future__ import annotations

import pytest

from bookkeeper.autorecovery.throttle import CopyWindow, Limits, Pacer, TokenBucket
from bookkeeper.errors import ConfigError


@pytest.mark.parametrize("rate, burst, takes, expected_waits", [
    (100, 10, [(10, 0.0), (1, 0.0)], [0.0, 0.01]),  # the burst goes at once, then 1 per 10 ms
    (100, 10, [(10, 0.0), (10, 0.0), (10, 0.0)], [0.0, 0.1, 0.2]),  # a debt grows the wait
    (100, 10, [(10, 0.0), (10, 0.1)], [0.0, 0.0]),  # refilled after 100 ms
    (100, 10, [(10, 0.0), (5, 10.0)], [0.0, 0.0]),  # refill is capped at the burst
    (100, 10, [(50, 0.0)], [0.4]),  # more than the burst: paced, not refused
    (0, None, [(10**9, 0.0)], [0.0]),  # 0: unlimited
])
def test_token_bucket_waits(rate, burst, takes, expected_waits):
    bucket = TokenBucket(rate, burst)
    waits = [bucket.take(amount, now_s) for amount, now_s in takes]
    assert waits == pytest.approx(expected_waits)


def test_a_bucket_holds_its_rate_over_a_long_run():
    bucket = TokenBucket(1000, 50)
    now_s = 0.0
    for _ in range(10_000):  # take 10 at a time, going ahead after each wait
        now_s += bucket.take(10, now_s)
    assert now_s == pytest.approx((10 * 10_000 - 50) / 1000, rel=0.01)


def test_the_pacer_waits_for_the_tighter_limit():
    pacer = Pacer(Limits(entries_per_s=1000, bytes_per_s=1_000_000))
    waits = [pacer.take(1, 100_000, 0.0) for _ in range(60)]  # 6 MB at 1 MB/s; 60 entries is nothing
    assert waits[-1] == pytest.approx((6_000_000 - 4 * 2**20) / 1_000_000, rel=0.01)
    assert Pacer(Limits()).take(10**6, 10**12, 0.0) == 0.0


def test_the_copy_window_halves_on_crowding_and_grows_back_one_by_one():
    window = CopyWindow(latency_target_ms=20, window_max=8)
    assert window.window == 1 and window.target_ms == 20  # nothing learnt yet: the setting
    for _ in range(40):
        assert window.on_answer(5) == 0.0
    assert window.window == 8  # 1 + 2 + ... answers grew it to the maximum, and no further
    assert window.target_ms == 10  # twice the latency seen while the window was at its minimum
    assert [window.on_answer(25), window.on_answer(25)] == [0.0, 0.0]  # a slow fsync or two: no
    pause_s = window.on_answer(25)  # the smoothed latency passes the target: crowding
    assert window.window == 4 and window.slowdowns == 1
    assert pause_s == pytest.approx(window.smoothed_ms / 1000) and window.smoothed_ms > 10
    for _ in range(3):  # answers to requests sent before the decrease do not count again
        window.on_answer(25)
    assert window.window == 4
    window.on_answer(25)
    assert window.window == 2 and window.slowdowns == 2
    for _ in range(40):
        window.on_answer(25)
    assert window.window == 1  # never below the minimum
    assert window.target_ms == 20  # relearnt at the minimum (25 ms now), capped by the setting
    assert window.on_answer(10_000) == pytest.approx(0.2)  # a pause is capped at 10 x the target
    for _ in range(80):  # fast again: the smoothed latency comes down, the window grows back
        window.on_answer(1)
    assert window.window > 3


@pytest.mark.parametrize("latencies, target_ms", [
    ([5.0] * 3, 10.0),
    ([0.1] * 3, 1.0),  # never below 1 ms: a very fast disk is not a reason to stop copying
    ([30.0] * 3, 20.0),  # never above the setting, however slow the disk
    ([2.0, 6.0, 6.0], 4.0),  # learnt only at the minimum window (the first answer here)
])
def test_the_latency_target_is_twice_the_uncrowded_latency_within_bounds(latencies, target_ms):
    window = CopyWindow(latency_target_ms=20, window_max=8)
    for latency in latencies:
        window.on_answer(latency)
    assert window.target_ms == pytest.approx(target_ms)


@pytest.mark.parametrize("make", [lambda: TokenBucket(-1), lambda: TokenBucket(10, 0),
                                  lambda: CopyWindow(0, 4), lambda: CopyWindow(10, 0),
                                  lambda: CopyWindow(10, 2, window_min=3)])
def test_bad_settings_are_refused(make):
    with pytest.raises(ConfigError):
        make()
