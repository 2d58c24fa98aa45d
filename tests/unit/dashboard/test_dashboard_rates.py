"""The dashboard's rate history: rates from high-watermark and cursor deltas, bounded (pure)."""

from __future__ import annotations

import pytest

from headrace.dashboard.rates import RateHistory, cohort_series, point_between
from headrace.protocol.coordination import Heartbeat, PartitionReport
from headrace.protocol.endpoints import BrokerEndpoint

T = "default/orders"


def heartbeat(broker: int, *reports: tuple[int, str, int, int, dict[str, int]]) -> Heartbeat:
    """reports: (partition, role, epoch, high watermark, cursors)."""
    return Heartbeat(
        BrokerEndpoint(broker, f"h{broker}", 9092, 9644),
        partitions=tuple(
            PartitionReport(T, p, role, epoch, hw, hw, cursors=cursors)  # type: ignore[arg-type]
            for p, role, epoch, hw, cursors in reports
        ),
    )


def test_rates_are_deltas_per_second_and_lag_is_hw_minus_cursor() -> None:
    history = RateHistory(window_ms=10_000, interval_ms=1_000)
    assert history.observe(0, [heartbeat(0, (0, "leader", 1, 100, {"r": 90}))]) is None
    point = history.observe(
        2_000,
        [
            heartbeat(0, (0, "leader", 1, 300, {"r": 150})),
            heartbeat(1, (0, "follower", 1, 250, {"r": 100})),
        ],
    )
    assert point is not None
    assert point.produce == {T: 100.0}, "200 records in 2 s, counted once (the leader's)"
    assert point.consume == {cohort_series(T, "r"): 30.0}
    assert point.lag == {cohort_series(T, "r"): 150}


def test_samples_closer_than_the_interval_are_skipped() -> None:
    history = RateHistory(window_ms=10_000, interval_ms=1_000)
    history.observe(0, [heartbeat(0, (0, "leader", 1, 0, {}))])
    assert history.observe(500, [heartbeat(0, (0, "leader", 1, 50, {}))]) is None
    assert history.observe(1_000, [heartbeat(0, (0, "leader", 1, 80, {}))]) is not None
    assert list(history.points)[-1].produce == {T: 80.0}


def test_a_fall_or_a_missing_partition_is_no_progress_and_the_higher_epoch_wins() -> None:
    before = RateHistory(interval_ms=1_000)
    before.observe(0, [heartbeat(0, (0, "leader", 1, 500, {"r": 400}), (1, "leader", 1, 10, {}))])
    # partition 0 moved (new incarnation from 0), partition 1 is offline (no leader report);
    # a stale leader report at epoch 1 loses to the new leader's at epoch 2
    point = before.observe(
        1_000,
        [
            heartbeat(0, (0, "leader", 1, 900, {"r": 900})),
            heartbeat(1, (0, "leader", 2, 20, {"r": 5})),
        ],
    )
    assert point is not None
    assert point.produce == {T: 0.0}
    assert point.consume == {cohort_series(T, "r"): 0.0}
    assert point.lag == {cohort_series(T, "r"): 15}


def test_the_ring_buffer_is_bounded_and_charts_keep_only_the_window() -> None:
    history = RateHistory(window_ms=5_000, interval_ms=1_000)
    for second in range(20):
        history.observe(second * 1_000, [heartbeat(0, (0, "leader", 1, second * 10, {"r": 0}))])
    assert len(history.points) == 5
    charts = history.charts(19_000)
    (produce,) = charts["produce"]["series"]
    assert produce["name"] == T
    assert [age for age, _ in produce["points"]] == [4_000, 3_000, 2_000, 1_000, 0]
    assert all(value == 10.0 for _, value in produce["points"])
    (lag,) = charts["lag"]["series"]
    assert lag["points"][-1] == [0, 190]
    assert history.charts(100_000)["produce"]["series"] == [], "old points age out"


def test_point_between_never_divides_by_zero() -> None:
    history = RateHistory(interval_ms=1_000)
    history.observe(0, [heartbeat(0, (0, "leader", 1, 0, {}))])
    offsets = history._last
    assert offsets is not None
    assert point_between(offsets, offsets).produce == {T: 0.0}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_ms"):
        RateHistory(window_ms=500, interval_ms=1_000)


def test_unchanged_reports_give_the_same_points_as_a_full_sample() -> None:
    """The shortcut for reports that did not change (the same objects, as the fleet hands
    them back, or equal ones) gives exactly the points a full walk gives."""
    moving = [
        heartbeat(0, (0, "leader", 1, 100, {"r": 40}), (1, "leader", 1, 7, {})),
        heartbeat(1, (0, "follower", 1, 100, {"r": 40}), (1, "follower", 1, 7, {})),
    ]
    same_objects = [Heartbeat(hb.broker, partitions=hb.partitions) for hb in moving]
    equal_copies = [
        heartbeat(0, (0, "leader", 1, 100, {"r": 40}), (1, "leader", 1, 7, {})),
        heartbeat(1, (0, "follower", 1, 100, {"r": 40}), (1, "follower", 1, 7, {})),
    ]
    moved = [heartbeat(0, (0, "leader", 1, 160, {"r": 100}), (1, "leader", 1, 9, {}))]
    steps = [moving, same_objects, equal_copies, moved, moved, moving]
    history = RateHistory(window_ms=60_000, interval_ms=1_000)
    got = [history.observe(i * 1_000, hbs) for i, hbs in enumerate(steps)]
    # the same steps with the shortcut unable to fire: every sample a full walk
    full = []
    for i in range(len(steps)):
        fresh = RateHistory(window_ms=60_000, interval_ms=1_000)
        if i:
            fresh.observe((i - 1) * 1_000, steps[i - 1])
        full.append(fresh.observe(i * 1_000, steps[i]))
    assert got == full
    assert (
        got[1] is not None
        and got[1].produce == {T: 0.0}
        and got[1].lag == {cohort_series(T, "r"): 60}
    )
    assert got[3] is not None and got[3].produce == {T: 62.0}
