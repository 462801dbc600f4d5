"""Settings shared by the CLI commands, with defaults that match docker-compose.yml."""

from __future__ import annotations

import importlib
import os
import sqlite3
from pathlib import Path

from processors.runtime.ledger_file import write_failure
from processors.tools.registry import ToolRegistry
from processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry

DEFAULT_KAFKA = os.environ.get("TOOLLEDGER_KAFKA", "127.0.0.1:19092")
DEFAULT_POSTGRES = os.environ.get(
    "TOOLLEDGER_POSTGRES", "postgresql://postgres@127.0.0.1:15432/toolledger"
)
SECRET_ENV = "TOOLLEDGER_REDACTION_SECRET"


class ConfigError(ValueError):
    pass


def redaction_secret(path: Path | None) -> bytes:
    """The key of the redaction hashes: from a file, or hex in ``TOOLLEDGER_REDACTION_SECRET``.

    Every executor of a deployment must use the same one, so there is no silent default.
    """
    if path is not None:
        secret = path.read_bytes().strip()
    elif os.environ.get(SECRET_ENV):
        try:
            secret = bytes.fromhex(os.environ[SECRET_ENV])
        except ValueError:
            raise ConfigError(f"{SECRET_ENV} must be hex") from None
    else:
        raise ConfigError(
            f"set {SECRET_ENV} (hex, >= 16 bytes) or pass --redaction-secret-file: "
            "every executor of a deployment must share the same key"
        )
    if len(secret) < 16:
        raise ConfigError("the redaction secret must have at least 16 bytes")
    return secret


def load_tools(
    spec: str, helpdesk_db: Path, *, timeout_s: float = 10.0, flaky_timeout_s: float = 5.0
) -> ToolRegistry:
    """``helpdesk`` (the shipped example) or ``module:attribute`` naming a registry or a
    zero-argument function that returns one."""
    if spec == "helpdesk":
        try:
            store = HelpdeskStore(helpdesk_db)
        except sqlite3.Error as exc:  # e.g. a read-only data directory: one line, no trace
            raise ConfigError(str(write_failure(helpdesk_db, exc))) from None
        return helpdesk_registry(store, timeout_s=timeout_s, flaky_timeout_s=flaky_timeout_s)
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ConfigError(f"--tools must be 'helpdesk' or 'module:attribute', got {spec!r}")
    target = getattr(importlib.import_module(module_name), attribute)
    registry = target() if callable(target) and not isinstance(target, ToolRegistry) else target
    if not isinstance(registry, ToolRegistry):
        raise ConfigError(f"{spec} is not a ToolRegistry")
    return registry
