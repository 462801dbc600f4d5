"""The registry's tools as the call groups' core sees them (``processors.groups.StepTool``)."""

from __future__ import annotations

from toolledger.processors.groups import ToolFacts
from toolledger.processors.tools.manifest import RiskTier
from toolledger.processors.tools.registry import ToolRegistry


def step_tools(registry: ToolRegistry) -> dict[str, ToolFacts]:
    return {
        tool.name: ToolFacts.of_model(
            tool.arguments,
            keyed=tool.keyed,
            irreversible=tool.risk is RiskTier.IRREVERSIBLE,
            compensation=tool.compensate,
            scopes=tool.scopes,
            key_scope=registry.key_scope(tool),
        )
        for tool in registry
    }
