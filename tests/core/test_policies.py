"""The policy schedule (dlog.core.policies): when each stream's policies run, fed times by hand."""

from __future__ import annotations

import pytest

from dlog.core.policies import PolicyLimits, PolicySchedule, has_policy, interval_ms
from dlog.segments.metadata import StreamConfig

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
