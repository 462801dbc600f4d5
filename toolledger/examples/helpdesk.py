"""The demo's helpdesk toolset under its public name:
``toolledger serve --tools toolledger.examples.helpdesk:registry`` (``--demo`` is the same,
with its store in ``--data``). Its side effects go to a SQLite file, made at the first call:
``TOOLLEDGER_HELPDESK_DB``, else ``helpdesk.db`` in the working directory."""

from __future__ import annotations

import os
from pathlib import Path

from toolledger.processors.tools.registry import ToolRegistry
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry

STORE_ENV = "TOOLLEDGER_HELPDESK_DB"

__all__ = ["STORE_ENV", "HelpdeskStore", "helpdesk_registry", "registry"]


def registry() -> ToolRegistry:
    """The helpdesk tools (create_ticket, list_tickets, close_ticket, send_email, charge_card,
    flaky_write), their store at ``TOOLLEDGER_HELPDESK_DB`` or ``./helpdesk.db``."""
    return helpdesk_registry(HelpdeskStore(Path(os.environ.get(STORE_ENV, "helpdesk.db"))))
