"""How long a finished call's key is kept: a tool's ``key_retention`` (a duration, or an
explicit ``"forever"``), else the ledger's default (24 hours, as Stripe keeps keys).

After its retention, counted from the key's last terminal event in log time, a key expires
(``ToolCallKeyExpired`` on the log) and a new call with it executes as a new call. A PENDING or
UNKNOWN call's key, or one with an approval still open, never expires (the pure core decides).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Literal

FOREVER: Literal["forever"] = "forever"
DEFAULT_KEY_RETENTION = timedelta(hours=24)

KeyRetention = timedelta | Literal["forever"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SHORT = re.compile(r"^(\d+)\s*([smhd]?)$")
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


class RetentionError(ValueError):
    """A retention that is not a duration of at least a second, nor ``forever``."""


def parse_retention(text: str, what: str = "key retention") -> KeyRetention:
    """``forever``, ``90s``, ``30m``, ``24h``, ``7d``, plain seconds, or an ISO 8601 duration
    (``PT24H``, ``P7D``). ``what``: the retention's name in the error."""
    value = text.strip()
    if value.lower() == FOREVER:
        return FOREVER
    short = _SHORT.match(value.lower())
    if short:
        seconds = int(short.group(1)) * _UNITS[short.group(2) or "s"]
    else:
        iso = _ISO.match(value.upper())
        if iso is None or value.upper() in ("P", "PT"):
            raise RetentionError(
                f"{what} {text!r} is not a duration: use e.g. 90s, 30m, 24h, 7d, PT24H or 'forever'"
            )
        days, hours, minutes, secs = (int(g) if g else 0 for g in iso.groups())
        seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    return check_retention(timedelta(seconds=seconds))


def check_retention(retention: object) -> KeyRetention:
    """``retention`` as a usable retention (a duration's text parsed, as
    :func:`parse_retention` reads it), else :class:`RetentionError`."""
    if isinstance(retention, str):
        return parse_retention(retention)
    if not isinstance(retention, timedelta):
        raise RetentionError(
            "key_retention must be a duration (a timedelta, or text such as '24h' or 'PT24H') "
            f"or 'forever', not {type(retention).__name__}"
        )
    if retention < timedelta(seconds=1) or retention.microseconds:
        raise RetentionError(f"key retention {retention} must be a whole number of seconds >= 1")
    return retention


def seconds_of(retention: KeyRetention) -> int | None:
    """Whole seconds, or ``None`` for forever (what the pure core's policy takes)."""
    return None if retention == FOREVER else int(retention.total_seconds())


def describe(retention: KeyRetention) -> str:
    """ISO 8601 in hours, minutes and seconds (``PT24H``, ``PT168H``, ``PT1M30S``: an exact
    duration; ``P1D`` would be a calendar day), or ``forever``."""
    seconds = seconds_of(retention)
    if seconds is None:
        return FOREVER
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "PT" + "".join(f"{n}{u}" for n, u in ((hours, "H"), (minutes, "M"), (secs, "S")) if n)
