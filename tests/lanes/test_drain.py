"""A lane's drain measure and the Retry-After it gives, on a clock the test moves."""

from __future__ import annotations

from router.lanes.drain import UNMEASURED_S, Drain, retry_after_s


def drained(*gaps: float, start: float = 100.0) -> tuple[Drain, float]:
    """A measure that saw backlogged completions `gaps` seconds apart; and the last one's time."""
    drain, now = Drain(), start
    drain.completed(now)
    for gap in gaps:
        now += gap
        drain.completed(now)
    return drain, now


def test_before_any_measure_a_refusal_is_told_the_default_within_the_timeout() -> None:
    assert retry_after_s(Drain(), 10, 30.0, 0.0) == UNMEASURED_S
    assert retry_after_s(Drain(), 10, 4.0, 0.0) == 4.0


def test_a_fast_queue_answers_one_second() -> None:
    drain, now = drained(0.01, 0.02, 0.01)
    assert retry_after_s(drain, 20, 30.0, now) == 1.0


def test_a_slow_queue_answers_in_proportion_to_the_requests_ahead() -> None:
    drain, now = drained(0.5, 0.5, 0.5)
    assert retry_after_s(drain, 4, 30.0, now) == 2.0
    assert retry_after_s(drain, 20, 30.0, now) == 10.0
    assert retry_after_s(drain, 200, 30.0, now) == 30.0  # never beyond the queue timeout


def test_the_mean_follows_a_change_of_pace() -> None:
    drain, now = drained(0.1, 0.1, *[1.0] * 30)
    assert retry_after_s(drain, 10, 60.0, now) == 10.0


def test_an_idle_spell_is_not_counted_as_a_slow_drain() -> None:
    drain, now = drained(0.1, 0.1)
    drain.idle()  # the queue emptied
    drain.completed(now + 600.0)  # traffic came back ten minutes later
    drain.completed(now + 600.1)
    assert retry_after_s(drain, 10, 60.0, now + 600.1) == 1.0


def test_a_queue_that_stopped_moving_is_answered_by_how_long_it_has_not() -> None:
    drain, now = drained(0.1, 0.1)
    assert retry_after_s(drain, 3, 60.0, now + 5.0) == 15.0
