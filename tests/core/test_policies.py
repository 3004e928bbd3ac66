"""The policy schedule (dlog.core.policies): when each stream's policies run, fed times by hand."""

from __future__ import annotations

import pytest

from dlog.core.policies import PolicyLimits, PolicySchedule, has_policy, interval_ms, runs_offloader
from dlog.segments.metadata import StreamConfig, TierPolicy

LIMITS = PolicyLimits(interval_min_ms=1_000, interval_max_ms=60_000, backoff_max_ms=300_000,
                      streams_per_round_max=2, streams_tracked_max=3)


def config(age_ms: int = 0, size: int = 0) -> StreamConfig:
    return StreamConfig(name="s", retention_age_ms=age_ms, retention_bytes=size)


def test_a_short_age_is_looked_at_often_a_long_one_once_a_minute_a_size_limit_every_interval():
    assert interval_ms(config(age_ms=1_000), LIMITS) == 1_000  # floor: never more often than a second
    assert interval_ms(config(age_ms=20_000), LIMITS) == 5_000  # a quarter of the age
    assert interval_ms(config(age_ms=7 * 86_400_000), LIMITS) == 60_000
    assert interval_ms(config(size=1), LIMITS) == 60_000
    assert interval_ms(None, LIMITS) == 60_000
    assert has_policy(config(age_ms=1)) and has_policy(config(size=1)) and not has_policy(config())


def test_new_streams_are_due_at_once_most_overdue_first_bounded_per_round():
    schedule = PolicySchedule(LIMITS)
    schedule.known(["b", "a"], now_ms=0)
    assert schedule.due(0) == ["a", "b"]
    schedule.ran("a", config(age_ms=8_000), 0)  # next at 2 s
    schedule.ran("b", config(), 0)  # next at 60 s
    assert schedule.due(1_999) == []
    assert schedule.due(2_000) == ["a"]
    schedule.known(["a", "b", "c"], now_ms=2_000)
    assert schedule.due(70_000) == ["a", "c"]  # two per round: a and c (both due at 2 s) before b (60 s)
    assert schedule.next_due_ms() == 2_000


def test_gone_streams_are_forgotten_and_tracking_is_bounded():
    schedule = PolicySchedule(LIMITS)
    schedule.known(["a", "b", "c", "d", "e"], now_ms=0)
    assert schedule.tracked == 3 and schedule.untracked == 2
    schedule.known(["a"], now_ms=0)
    assert schedule.tracked == 1 and schedule.untracked == 0
    schedule.ran("z", config(age_ms=1_000), 0)  # unknown: nothing tracked
    assert schedule.tracked == 1


def test_failures_back_off_doubling_up_to_the_bound_and_a_success_resets():
    schedule = PolicySchedule(LIMITS)
    schedule.known(["a"], now_ms=0)
    waits = [schedule.failed("a", 0) for _ in range(10)]
    assert waits[:4] == [2_000, 4_000, 8_000, 16_000] and waits[-1] == 300_000
    assert schedule.due(299_999) == [] and schedule.due(300_000) == ["a"]
    schedule.ran("a", config(age_ms=4_000), 300_000)
    assert schedule.failed("a", 300_000) == 2_000  # the streak started again


def test_limits_refuse_nonsense():
    with pytest.raises(ValueError):
        PolicyLimits(interval_min_ms=0)
    with pytest.raises(ValueError):
        PolicyLimits(interval_min_ms=10_000, interval_max_ms=1_000)
    with pytest.raises(ValueError):
        PolicyLimits(streams_per_round_max=0)


def test_a_stream_with_a_tier_has_a_policy_when_the_offloader_has_something_to_do_by_itself():
    plain = StreamConfig("s")
    on_demand = TierPolicy(uri="file:///t", offload_after_ms=-1, delete_lag_ms=-1)
    assert not has_policy(plain) and not has_policy(plain, TierPolicy(offload_after_ms=0))  # no URI: no tier
    assert not runs_offloader(plain, on_demand) and not has_policy(plain, on_demand)  # only `dlog offload`
    assert runs_offloader(plain, TierPolicy(uri="file:///t", offload_after_ms=0, delete_lag_ms=-1))
    assert runs_offloader(plain, TierPolicy(uri="file:///t", offload_after_ms=-1, delete_lag_ms=0))
    # bookie retention on a tiered stream drops offloaded copies: the offloader does that
    assert runs_offloader(StreamConfig("s", retention_bytes=10), on_demand)
    # the tier's retention is a policy (retention applies it), not the offloader's
    with_tier_retention = TierPolicy(uri="file:///t", offload_after_ms=-1, delete_lag_ms=-1, retention_age_ms=5)
    assert has_policy(plain, with_tier_retention) and not runs_offloader(plain, with_tier_retention)


def test_a_tiered_stream_is_looked_at_every_quarter_of_its_shortest_tier_age():
    limits = PolicyLimits(interval_min_ms=1_000, interval_max_ms=60_000)
    tier = TierPolicy(uri="file:///t", offload_after_ms=20_000, delete_lag_ms=3_600_000)
    assert interval_ms(StreamConfig("s"), limits, tier) == 5_000
    assert interval_ms(StreamConfig("s"), limits, TierPolicy(uri="file:///t", offload_after_ms=0)) == 1_000
    # without a URI the ages are nobody's business
    assert interval_ms(StreamConfig("s"), limits, TierPolicy(offload_after_ms=0)) == 60_000
    assert interval_ms(StreamConfig("s", retention_age_ms=8_000), limits, tier) == 2_000
    assert PolicyLimits.at_most_every(500) == PolicyLimits(interval_min_ms=500, interval_max_ms=500,
                                                           backoff_max_ms=300_000)


def test_tier_counts_label_a_bounded_number_of_streams():
    from dlog.offload import OffloadedSegment, OffloadReport
    from dlog.policies import OTHER_STREAMS, TIER_STREAMS_LABELLED_MAX, TierStats

    stats = TierStats()
    for number in range(TIER_STREAMS_LABELLED_MAX + 5):
        report = OffloadReport(f"s{number}", "file:///t")
        report.offloaded.append(OffloadedSegment(1, 7, "file:///t/f", 10, 100, 400, 0.1))
        report.error = "boom" if number % 2 else ""
        stats.add(report)
    assert len(stats.streams) == TIER_STREAMS_LABELLED_MAX + 1
    assert stats.streams[OTHER_STREAMS].offloaded_segments == 5
    assert stats.total.offloaded_segments == TIER_STREAMS_LABELLED_MAX + 5
    assert stats.total.offloaded_bytes == 100 * (TIER_STREAMS_LABELLED_MAX + 5)
    assert stats.total.offload_failures == (TIER_STREAMS_LABELLED_MAX + 5) // 2
