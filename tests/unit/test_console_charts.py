"""The stats page's charts (``producers.http.console.charts``): where the ticks of the value
axis (in the metric's unit) and of the time axis go, where the points go, and the text
alternative that says the data in words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from toolledger.producers.http.console.charts import (
    BOTTOM,
    HEIGHT,
    LEFT,
    METRICS,
    RIGHT,
    SAMPLE_S,
    TOP,
    WIDTH,
    History,
    chart,
    nice_top,
)
from toolledger.schemas.calls import ToolStats

T0 = datetime(2026, 5, 1, 9, 0, 0, tzinfo=UTC)
BY_NAME = {m.name: m for m in METRICS}


@pytest.mark.parametrize(
    ("highest", "top"),
    [(0, 1), (0.4, 1), (1, 1), (1.5, 2), (3, 5), (7, 10), (12, 20), (30, 50), (100, 100)],
)
def test_the_value_axis_ends_at_a_round_number(highest: float, top: float) -> None:
    assert nice_top(highest) == top


def test_a_rate_in_percent_over_three_samples() -> None:
    samples = [
        (T0, ToolStats("*", calls=2, succeeded=2)),
        (T0 + timedelta(seconds=10), ToolStats("*", calls=4, succeeded=3)),
        (T0 + timedelta(seconds=20), ToolStats("*", calls=4, succeeded=2)),
    ]
    c = chart(BY_NAME["success_rate"], samples)
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    assert [(t.at, t.label) for t in c.value_ticks] == [
        (bottom, "0 %"),
        (TOP + (bottom - TOP) / 2, "50 %"),
        (TOP, "100 %"),
    ]
    assert [(t.at, t.label) for t in c.time_ticks] == [
        (LEFT, "09:00:00"),
        (LEFT + (right - LEFT) / 2, "09:00:10"),
        (right, "09:00:20"),
    ]
    # 100 %, 75 %, 50 % of the plot's 128 units of height, from its bottom
    assert c.dots == [(LEFT, TOP), (LEFT + (right - LEFT) / 2, 54.0), (right, 86.0)]
    assert c.axis_unit == "percent of calls" and c.shown(0.75) == "75.0 %"
    assert c.summary == (
        "3 samples from 09:00:00 to 09:00:20 UTC; now 50.0 %, lowest 50.0 %, highest 100.0 %."
    )


def test_a_count_in_its_unit_and_values_not_known_yet() -> None:
    unknown = chart(
        BY_NAME["unknown"], [(T0, ToolStats("*", unknown=3)), (T0, ToolStats("*", unknown=7))]
    )
    assert [t.label for t in unknown.value_ticks] == ["0", "5", "10"]
    assert unknown.top == 10 and unknown.shown(7) == "7 calls" and unknown.axis_unit == "calls"
    assert unknown.summary.endswith("now 7 calls, lowest 3 calls, highest 7 calls.")
    per_run = chart(BY_NAME["calls_per_run"], [(T0, ToolStats("*"))])  # no run yet: no value
    assert per_run.dots == [] and per_run.points == ""
    assert [t.label for t in per_run.time_ticks] == ["09:00:00"]
    assert per_run.summary == "1 sample from 09:00:00 to 09:00:00 UTC; now —."
    empty = chart(BY_NAME["duplicate_rate"], [])
    assert empty.time_ticks == [] and empty.summary == "No samples yet."


def test_the_history_keeps_one_sample_per_interval() -> None:
    history = History()
    history.add("acme", T0, ToolStats("*", unknown=1))
    history.add("acme", T0 + timedelta(seconds=SAMPLE_S / 2), ToolStats("*", unknown=2))
    history.add("acme", T0 + timedelta(seconds=SAMPLE_S), ToolStats("*", unknown=5))
    charts = {c.metric.name: c for c in history.charts("acme")}
    assert charts["unknown"].samples == [(T0, 2.0), (T0 + timedelta(seconds=SAMPLE_S), 5.0)]
    assert all(c.samples == [] for c in history.charts(None))
