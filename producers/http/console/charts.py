"""The stats over time: samples of ``door.queries.stats`` kept in the serving process (one at
most every :data:`SAMPLE_S` per scope, the last :data:`KEEP` of them), drawn as inline SVG
line charts with their numbers in a table beside them (no script, nothing to load)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from schemas.calls import ToolStats

SAMPLE_S = 10.0
KEEP = 360  # an hour at one sample every 10 s
WIDTH, HEIGHT, PAD = 600.0, 160.0, 8.0


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    label: str
    value: Callable[[ToolStats], float | None]
    percent: bool


METRICS: tuple[Metric, ...] = (
    Metric("success_rate", "Success rate", lambda s: s.success_rate, True),
    Metric(
        "validation_failure_rate",
        "Validation failure rate",
        lambda s: s.validation_failure_rate,
        True,
    ),
    Metric("duplicate_rate", "Duplicate rate", lambda s: s.duplicate_rate, True),
    Metric("unknown", "UNKNOWN calls", lambda s: float(s.unknown), False),
    Metric("human_rejection_rate", "Human rejection rate", lambda s: s.human_rejection_rate, True),
    Metric("calls_per_run", "Calls per run", lambda s: s.calls_per_run, False),
)


@dataclass(frozen=True, slots=True)
class Chart:
    metric: Metric
    points: str  # the polyline's "x,y x,y ..."
    dots: list[tuple[float, float]]
    top: float  # the value at the top of the chart
    samples: list[tuple[datetime, float | None]]

    def shown(self, value: float | None) -> str:
        if value is None:
            return "—"
        return f"{value * 100:.1f} %" if self.metric.percent else f"{value:g}"


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


def chart(metric: Metric, samples: list[tuple[datetime, ToolStats]]) -> Chart:
    values = [(at, metric.value(totals)) for at, totals in samples]
    known = [v for _, v in values if v is not None]
    top = 1.0 if metric.percent else max([*known, 1.0])
    span = max(len(values) - 1, 1)
    dots = [
        (
            round(PAD + (WIDTH - 2 * PAD) * i / span, 1),
            round(HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / top, 1),
        )
        for i, (_, v) in enumerate(values)
        if v is not None
    ]
    return Chart(metric, " ".join(f"{x},{y}" for x, y in dots), dots, top, values)
