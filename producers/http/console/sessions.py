"""The console's sessions: server-side, in the memory of the serving process.

A session is a random id (the cookie's value) for the trusted context the sign-in token gave,
with a CSRF token of its own, an idle timeout and an absolute lifetime. The bearer token is
kept in memory only (never in a page, a cookie or a log) so that every request checks it again
with the API's authenticator: a token revoked in the tokens file, or a JWT past its expiry,
ends the session at once, and the scopes are always the token's current ones."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from toolledger.producers.client import TrustedContext

COOKIE = "toolledger_console"
IDLE_ENV = "TOOLLEDGER_CONSOLE_IDLE_S"
LIFETIME_ENV = "TOOLLEDGER_CONSOLE_LIFETIME_S"
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class SessionSettings:
    idle_s: float = 30 * 60.0  # ended after this long without a request
    lifetime_s: float = 8 * 3600.0  # ended this long after sign-in, whatever happens

    @classmethod
    def from_env(cls) -> SessionSettings:
        """The defaults, or ``TOOLLEDGER_CONSOLE_IDLE_S`` / ``TOOLLEDGER_CONSOLE_LIFETIME_S``."""
        defaults = cls()
        return cls(
            idle_s=float(os.environ.get(IDLE_ENV, defaults.idle_s)),
            lifetime_s=float(os.environ.get(LIFETIME_ENV, defaults.lifetime_s)),
        )


@dataclass(slots=True)
class Session:
    id: str = field(repr=False)
    csrf: str = field(repr=False)
    token: str = field(repr=False)
    context: TrustedContext
    created: float
    last_seen: float
    expires: float  # absolute

    def alive(self, now: float, idle_s: float) -> bool:
        return now < self.expires and now - self.last_seen < idle_s


class SessionStore:
    """Sessions by id; expired ones are dropped when met, and the oldest beyond
    :data:`MAX_SESSIONS`."""

    def __init__(
        self, settings: SessionSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def create(self, token: str, context: TrustedContext) -> Session:
        now = self._clock()
        for stale in [s.id for s in self._sessions.values() if not self._alive(s, now)]:
            del self._sessions[stale]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]  # dicts keep insertion order
        session = Session(
            id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            token=token,
            context=context,
            created=now,
            last_seen=now,
            expires=now + self.settings.lifetime_s,
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id`` (seen now), or None: unknown or expired."""
        session = self._sessions.get(session_id or "")
        if session is None:
            return None
        now = self._clock()
        if not self._alive(session, now):
            del self._sessions[session.id]
            return None
        session.last_seen = now
        return session

    def drop(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)

    def _alive(self, session: Session, now: float) -> bool:
        return session.alive(now, self.settings.idle_s)
