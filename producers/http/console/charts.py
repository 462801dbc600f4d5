"""The stats over time: samples of ``door.queries.stats`` kept in the serving process (one at
most every :data:`SAMPLE_S` per scope, the last :data:`KEEP` of them), drawn as inline SVG
line charts with a value axis in the metric's unit, a time axis (UTC) and a description of
the data, and their numbers in a table beside them (no script, nothing to load)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from toolledger.schemas.calls import ToolStats

SAMPLE_S = 10.0
KEEP = 360  # an hour at one sample every 10 s
# the SVG's coordinates: it scales as a whole (text too), so these are also its proportions
WIDTH, HEIGHT = 360.0, 190.0
LEFT, RIGHT, TOP, BOTTOM = 46.0, 14.0, 22.0, 40.0  # the plot area's margins (axis labels)


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    label: str
    value: Callable[[ToolStats], float | None]
    unit: str  # "%": a rate of 0..1 shown in percent; otherwise what is counted


METRICS: tuple[Metric, ...] = (
    Metric("success_rate", "Success rate", lambda s: s.success_rate, "%"),
    Metric(
        "validation_failure_rate",
        "Validation failure rate",
        lambda s: s.validation_failure_rate,
        "%",
    ),
    Metric("duplicate_rate", "Duplicate rate", lambda s: s.duplicate_rate, "%"),
    Metric("unknown", "UNKNOWN calls", lambda s: float(s.unknown), "calls"),
    Metric("human_rejection_rate", "Human rejection rate", lambda s: s.human_rejection_rate, "%"),
    Metric("calls_per_run", "Calls per run", lambda s: s.calls_per_run, "calls per run"),
)


@dataclass(frozen=True, slots=True)
class Tick:
    at: float  # the position along its axis, in the SVG's coordinates
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    metric: Metric
    points: str  # the polyline's "x,y x,y ..."
    dots: list[tuple[float, float]]
    top: float  # the value at the top of the value axis
    samples: list[tuple[datetime, float | None]]
    value_ticks: list[Tick]  # y positions
    time_ticks: list[Tick]  # x positions

    @property
    def percent(self) -> bool:
        return self.metric.unit == "%"

    def shown(self, value: float | None) -> str:
        """A value with its unit."""
        if value is None:
            return "—"
        return f"{value * 100:.1f} %" if self.percent else f"{value:g} {self.metric.unit}"

    @property
    def axis_unit(self) -> str:
        """The value axis' title."""
        return "percent of calls" if self.percent else self.metric.unit

    @property
    def summary(self) -> str:
        """The data in words: the chart's text alternative."""
        if not self.samples:
            return "No samples yet."
        known = [v for _, v in self.samples if v is not None]
        first, last = self.samples[0][0], self.samples[-1][0]
        count = len(self.samples)
        text = (
            f"{count} sample{'s' if count != 1 else ''} from {first:%H:%M:%S} "
            f"to {last:%H:%M:%S} UTC; now {self.shown(self.samples[-1][1])}"
        )
        if known:
            text += f", lowest {self.shown(min(known))}, highest {self.shown(max(known))}"
        return text + "."


class History:
    """Samples of the totals, per scope (a tenant, or ``None``: every tenant)."""

    def __init__(self) -> None:
        self._samples: dict[str | None, deque[tuple[datetime, ToolStats]]] = {}

    def add(self, scope: str | None, at: datetime, totals: ToolStats) -> None:
        samples = self._samples.setdefault(scope, deque(maxlen=KEEP))
        if samples and (at - samples[-1][0]).total_seconds() < SAMPLE_S:
            samples[-1] = (samples[-1][0], totals)  # the latest numbers, the sample's time
        else:
            samples.append((at, totals))

    def charts(self, scope: str | None) -> list[Chart]:
        samples = list(self._samples.get(scope, ()))
        return [chart(metric, samples) for metric in METRICS]


def nice_top(highest: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at least ``highest`` (at least 1)."""
    if highest <= 1:
        return 1.0
    power = math.pow(10, math.floor(math.log10(highest)))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= highest)


def chart(metric: Metric, samples: list[tuple[datetime, ToolStats]]) -> Chart:
    values = [(at.astimezone(UTC), metric.value(totals)) for at, totals in samples]
    known = [v for _, v in values if v is not None]
    percent = metric.unit == "%"
    top = 1.0 if percent else nice_top(max(known, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = max(len(values) - 1, 1)

    def x(i: int) -> float:
        return round(LEFT + plot_w * i / span, 1)

    def y(v: float) -> float:
        return round(TOP + plot_h - plot_h * v / top, 1)

    dots = [(x(i), y(v)) for i, (_, v) in enumerate(values) if v is not None]
    value_ticks = [
        Tick(y(v), f"{v * 100:g} %" if percent else f"{v:g}") for v in (0.0, top / 2, top)
    ]
    shown_at = sorted({0, (len(values) - 1) // 2, len(values) - 1}) if values else []
    time_ticks = [Tick(x(i), f"{values[i][0]:%H:%M:%S}") for i in shown_at]
    return Chart(
        metric,
        " ".join(f"{px},{py}" for px, py in dots),
        dots,
        top,
        values,
        value_ticks,
        time_ticks,
    )
