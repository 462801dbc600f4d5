"""Settings shared by the CLI commands, with defaults that match docker-compose.yml."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from toolledger.processors.runtime.ledger_file import write_failure
from toolledger.processors.tools.registry import ToolRegistry
from toolledger.processors.toolsets.helpdesk import HelpdeskStore, helpdesk_registry

# the commands' --kafka and --postgres (else TOOLLEDGER_KAFKA and TOOLLEDGER_POSTGRES)
DEFAULT_KAFKA = "127.0.0.1:19092"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:15432/toolledger"
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


NO_TOOLS = (
    "name the tools: --tools module:attribute (e.g. mytools:registry, imported from the working "
    "directory) or --tools path/to/file.py:attribute, or --demo for the demo's helpdesk tools"
)


@dataclass(frozen=True)
class ToolSource:
    """Where a command's tools come from: ``spec`` (``module:attribute`` or
    ``path/to/file.py:attribute``, naming a registry or a function without arguments that
    returns one), or the demo's helpdesk toolset (``demo``), whose side effects go to the
    SQLite file ``helpdesk_db`` with its handlers' timeouts."""

    spec: str | None = None
    demo: bool = False
    helpdesk_db: Path = Path("helpdesk.db")
    timeout_s: float = 10.0
    flaky_timeout_s: float = 5.0

    def check(self) -> None:
        """:class:`ConfigError` unless exactly one of ``spec`` and ``demo`` is given."""
        if self.spec is None and not self.demo:
            raise ConfigError(NO_TOOLS)
        if self.spec is not None and self.demo:
            raise ConfigError(f"give --tools {self.spec} or --demo, not both")

    def load(self) -> ToolRegistry:
        """The registry (:class:`ConfigError` in one line if it cannot be had). Nothing is
        written: the demo's store is made at its first call, or by :meth:`make_store`."""
        self.check()
        if self.spec is None:
            return helpdesk_registry(
                HelpdeskStore(self.helpdesk_db),
                timeout_s=self.timeout_s,
                flaky_timeout_s=self.flaky_timeout_s,
            )
        return imported_registry(self.spec)

    def make_store(self) -> None:
        """With ``demo``: make its store's file now, so that a directory it cannot be written
        in is one line at the start (:class:`ConfigError`), not an error at the first call."""
        if not self.demo:
            return
        try:
            HelpdeskStore(self.helpdesk_db).open().close()
        except (sqlite3.Error, OSError) as exc:  # e.g. a read-only data directory
            raise ConfigError(str(write_failure(self.helpdesk_db, exc))) from None


def imported_registry(spec: str) -> ToolRegistry:
    """The registry ``spec`` names: ``module:attribute``, the module imported from the working
    directory (then the import path), or ``path/to/file.py:attribute``, the file imported as a
    module of its own name (its directory on the import path, so it can import its
    neighbours). The attribute is a registry, or a function without arguments that returns
    one. Whatever fails is one line (:class:`ConfigError`) naming the module and where it was
    looked for."""
    where, _, attribute = spec.rpartition(":")
    if not where or not attribute:
        raise ConfigError(
            f"--tools {spec!r}: give module:attribute (e.g. mytools:registry) or "
            "path/to/file.py:attribute"
        )
    if where.endswith(".py") or "/" in where or os.sep in where:
        module = _module_from_file(spec, Path(where))
    else:
        module = _module_by_name(spec, where)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ConfigError(
            f"--tools {spec}: module {module.__name__} ({module.__file__}) has no attribute "
            f"{attribute!r}"
        ) from None
    registry = target() if callable(target) and not isinstance(target, ToolRegistry) else target
    if not isinstance(registry, ToolRegistry):
        raise ConfigError(
            f"--tools {spec}: {attribute} is a {type(registry).__name__}, not a Registry (or a "
            "function without arguments that returns one)"
        )
    return registry


def _module_by_name(spec: str, name: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` does: the working directory's modules first
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name or name.startswith(f"{exc.name}."):  # the module itself
            head = ", ".join(p or "." for p in sys.path[:3])
            raise ConfigError(
                f"--tools {spec}: no module named {name!r} (looked in {head}, ...: run from the "
                "directory that holds it, or give path/to/file.py:attribute)"
            ) from None
        raise ConfigError(f"--tools {spec}: importing {name} failed: {exc}") from None
    except Exception as exc:  # the module's own code failed: one line, its error
        raise ConfigError(
            f"--tools {spec}: importing {name} failed: {type(exc).__name__}: {exc}"
        ) from None


def _module_from_file(spec: str, path: Path) -> ModuleType:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"--tools {spec}: there is no file {path}")
    name = path.stem
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"--tools {spec}: {path} cannot be imported as a Python module")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # pickling and dataclasses look their module up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(
            f"--tools {spec}: importing {path} failed: {type(exc).__name__}: {exc}"
        ) from None
    return module
