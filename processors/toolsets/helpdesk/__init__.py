"""The example helpdesk toolset and its downstream store."""

from toolledger.processors.toolsets.helpdesk.store import HelpdeskStore, holds_effects
from toolledger.processors.toolsets.helpdesk.tools import helpdesk_registry

__all__ = ["HelpdeskStore", "helpdesk_registry", "holds_effects"]
