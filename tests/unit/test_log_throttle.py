"""A library's repeating warning is let through once per window, with the count held back;
the project's own records and lower levels always pass."""

from __future__ import annotations

import json
import logging

from toolledger.logs import JsonFormatter, RepeatThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(name: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_reconnect_storm_is_one_line_per_window_with_the_count_held_back() -> None:
    clock = Clock()
    throttle = RepeatThrottle(window_s=5.0, clock=clock)
    storm = "Unable connect to node with id %s: %s"
    passed = []
    for i in range(3000):
        clock.now = 100.0 + i * 0.002  # 3,000 attempts in 6 s
        record = _record("aiokafka", logging.ERROR, storm, 1, f"refused {i}")
        if throttle.filter(record):
            passed.append(record)
    assert len(passed) == 2
    assert not hasattr(passed[0], "repeated")
    assert passed[1].repeated == 2499  # type: ignore[attr-defined]
    line = json.loads(JsonFormatter().format(passed[1]))
    assert line["repeated"] == 2499 and line["logger"] == "aiokafka"


def test_other_templates_levels_and_the_projects_own_records_pass() -> None:
    clock = Clock()
    throttle = RepeatThrottle(window_s=5.0, clock=clock)
    assert throttle.filter(_record("aiokafka", logging.ERROR, "a %s", 1))
    assert not throttle.filter(_record("aiokafka", logging.ERROR, "a %s", 2))
    assert throttle.filter(_record("aiokafka", logging.ERROR, "b %s", 1))  # another template
    assert throttle.filter(_record("aiokafka.conn", logging.ERROR, "a %s", 1))  # another logger
    assert throttle.filter(_record("aiokafka", logging.WARNING, "a %s", 1))  # another level
    for _ in range(10):
        assert throttle.filter(_record("aiokafka", logging.INFO, "joined %s", 1))
        assert throttle.filter(_record("toolledger.kafka", logging.WARNING, "retry %s", 1))


def test_templates_are_bounded() -> None:
    throttle = RepeatThrottle(window_s=5.0, clock=Clock())
    for i in range(RepeatThrottle.MAX_TEMPLATES * 3):
        assert throttle.filter(_record("lib", logging.WARNING, f"formatted before logging {i}"))
    assert len(throttle._seen) <= RepeatThrottle.MAX_TEMPLATES
