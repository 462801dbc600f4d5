"""A backend is one factory: a module per backend (:mod:`toolledger.backends.embedded`,
:mod:`toolledger.backends.kafka`) whose ``Factory`` builds, from the
:class:`~toolledger.settings.LedgerSettings`, everything the front doors need (the ledger
client and its transport, the read side, the group orchestrator and log, where the raw
arguments are), and :func:`backend_factory`, the one place that chooses it. ``serve``, ``mcp``
and ``Ledger.embedded`` / ``Ledger.kafka`` open a backend only through it.

Binding another backend is one module with a ``Factory`` (named by its import name in
``LedgerSettings.backend``) and a binding of the contract suite (tests/contract), as
eventsourcing's ``InfrastructureFactory`` and its recorder test cases do.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime

from toolledger.config import ConfigError
from toolledger.processors.runtime.group_runner import GroupRunner
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.producers.client import LedgerClient
from toolledger.producers.http.door import IntentArguments
from toolledger.schemas.calls import CallQueries
from toolledger.settings import EMBEDDED, KAFKA, LedgerSettings

MODULES = {EMBEDDED: "toolledger.backends.embedded", KAFKA: "toolledger.backends.kafka"}


@dataclass(frozen=True)
class BackendParts:
    """An open backend, as a front door uses it."""

    client: LedgerClient  # appends intents, awaits their outcomes
    queries: CallQueries | None  # the read side (None: Ledger.kafka without PostgreSQL)
    groups: GroupRunner | None  # the call groups' orchestrator (None: no group log here)
    intents: IntentArguments  # where the raw arguments of approval requests are read back
    ready: Callable[[], Awaitable[dict[str, bool]]]  # what /readyz reports
    prune: Callable[[datetime], Awaitable[int]] | None  # the audit trail's retention


class BackendFactory(ABC):
    """Builds one backend from its settings."""

    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings

    @abstractmethod
    def open(self, registry: ToolRegistry | None) -> AbstractAsyncContextManager[BackendParts]:
        """The backend, open while the block runs, for the tools of ``registry`` (the
        settings' key retention applied to it); ``None``: a client that only appends calls
        (``Ledger.kafka`` without tools). :class:`~toolledger.config.ConfigError` in one line
        if the settings cannot be used."""


def backend_factory(settings: LedgerSettings) -> BackendFactory:
    """The factory of ``settings.backend``: a shipped one by name, or a module of another's."""
    name = MODULES.get(settings.backend, settings.backend)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise ConfigError(
                f"no backend {settings.backend!r}: give {', '.join(MODULES)} or the import "
                "name of a module with a Factory"
            ) from None
        raise ConfigError(
            f"the {settings.backend} backend needs {exc.name} (not installed): "
            f"pip install 'toolledger[{'kafka,postgres' if settings.backend == KAFKA else 'all'}]'"
        ) from None
    factory = getattr(module, "Factory", None)
    if not (isinstance(factory, type) and issubclass(factory, BackendFactory)):
        raise ConfigError(f"{name} has no Factory (a toolledger.backends.BackendFactory)")
    built: BackendFactory = factory(settings)
    return built
