"""The published schema bundles (docs/consuming.md#schemas).

``schemas/avro/bundle/v<N>.avsc`` holds every named type of schema version N (the overlays
below it resolved) in one JSON array, an Avro union, in dependency order: each type is
declared once, after the types it refers to, which it names by full name. Any Avro library
parses it as one schema (Java: ``new Schema.Parser().parse(file).getTypes()``; avro-tools;
Node's ``avsc``; fastavro), with no other file to load first. The union is only the
container: an event is written with its own record schema, whose fingerprint (the
single-object header) is that record's, with the types it uses inlined.

Regenerate after changing a ``.avsc`` file: ``python -m toolledger.schemas.bundle`` (a unit
test fails while a bundle differs from what this module makes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from toolledger.schemas.codec import AVRO_ROOT, PRIMITIVES, VERSIONS, named_types

__all__ = ["BUNDLE_DIR", "bundle", "bundle_text", "main"]

BUNDLE_DIR: Final = AVRO_ROOT / "bundle"


def _references(node: Any) -> set[str]:
    """Full names of the named types ``node`` refers to (by name, not by definition)."""
    if isinstance(node, str):
        return set() if node in PRIMITIVES else {node}
    if isinstance(node, list):
        return set().union(*map(_references, node))
    if not isinstance(node, dict):
        return set()
    kind = node.get("type")
    if kind in ("record", "error"):
        return set().union(*(_references(f["type"]) for f in node["fields"]))
    if kind == "array":
        return _references(node["items"])
    if kind == "map":
        return _references(node["values"])
    if kind in ("enum", "fixed") or kind in PRIMITIVES:
        return set()
    return _references(kind)


def bundle(version: int, root: Path = AVRO_ROOT) -> list[Any]:
    """Every named type of ``version``, each after those it refers to (ties by name)."""
    types = named_types(version, root)
    ordered: list[Any] = []
    placed: set[str] = set()

    def place(name: str) -> None:
        if name in placed:
            return
        placed.add(name)
        for needed in sorted(_references(types[name])):
            place(needed)
        ordered.append(types[name])

    for name in sorted(types):
        place(name)
    return ordered


def bundle_text(version: int, root: Path = AVRO_ROOT) -> str:
    return json.dumps(bundle(version, root), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    BUNDLE_DIR.mkdir(exist_ok=True)
    for version in sorted(VERSIONS):
        (BUNDLE_DIR / f"v{version}.avsc").write_text(bundle_text(version), encoding="utf-8")


if __name__ == "__main__":
    main()
