"""Structured JSON logs. Records carry ids, codes and counts: never arguments or secrets."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = record.exc_info[0].__name__
        return json.dumps(entry, default=str, ensure_ascii=False)


class RepeatThrottle(logging.Filter):
    """A library's warning or error that repeats is let through once per ``window_s`` for
    each message template, with ``repeated``: how many it held back since the last one.

    While a broker is down, aiokafka logs every reconnect and metadata attempt (tens of
    thousands of lines a minute, each formatted and written by a process that needs its CPU
    for the recovery). The project's own records and anything below WARNING pass as they are.
    """

    MAX_TEMPLATES = 1024  # messages formatted before logging make templates of their own

    def __init__(self, window_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.name.split(".", 1)[0] == "toolledger":
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.window_s:
            self._seen[key] = (seen[0], seen[1] + 1)
            return False
        if len(self._seen) >= self.MAX_TEMPLATES:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if seen is not None and seen[1]:
            record.repeated = seen[1]
        return True


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RepeatThrottle())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
