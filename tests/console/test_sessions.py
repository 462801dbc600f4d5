"""The session store with a clock of the test's: idle timeout, absolute lifetime, new ids."""

from __future__ import annotations

from toolledger.producers.client import TrustedContext
from toolledger.producers.http.console.sessions import SessionSettings, SessionStore

ALICE = TrustedContext("acme", "alice")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_when_idle_and_at_its_lifetime() -> None:
    clock = Clock()
    store = SessionStore(SessionSettings(idle_s=60, lifetime_s=300), clock)
    session = store.create("secret-token-123456", ALICE)
    assert "secret-token" not in repr(session)  # the token is never in a log line
    for _ in range(4):  # seen every 59 s: alive until the absolute lifetime
        clock.now += 59
        assert store.get(session.id) is session
    clock.now += 65  # 301 s after sign-in
    assert store.get(session.id) is None
    idle = store.create("secret-token-123456", ALICE)
    clock.now += 60
    assert store.get(idle.id) is None


def test_ids_and_csrf_tokens_are_fresh_and_unknown_ids_are_none() -> None:
    store = SessionStore(SessionSettings())
    one, two = (store.create("secret-token-123456", ALICE) for _ in range(2))
    assert one.id != two.id and one.csrf != two.csrf and len(one.id) >= 40
    assert store.get(None) is None and store.get("nope") is None
    store.drop(one.id)
    assert store.get(one.id) is None and store.get(two.id) is two
