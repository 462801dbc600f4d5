"""What a validation error tells the caller to fix: the query parameter, path parameter, header
or body member that is wrong, by name. Invalid tool arguments keep the ledger's own advice
(fix the arguments and call again with the same key)."""

from __future__ import annotations

from collections.abc import Sequence

from toolledger.schemas.errors import FieldError

# where FastAPI found the error (the first part of its location) -> what the caller calls it
_PLACES = {
    "query": ("query parameter", "query parameters"),
    "path": ("path parameter", "path parameters"),
    "header": ("header", "headers"),
    "cookie": ("cookie", "cookies"),
    "body": ("body member", "body members"),
}
WHOLE_BODY = "$"  # the location of an error about the body itself (e.g. not an object)


def _named(places: dict[str, list[str]]) -> str:
    parts = []
    for place, names in places.items():
        one, many = _PLACES.get(place, ("request part", "request parts"))
        listed = ", ".join(f"`{name}`" for name in names)
        parts.append(f"the {one if len(names) == 1 else many} {listed}")
    return " and ".join(parts)


def request_fix(errors: Sequence[FieldError]) -> str:
    """For errors in the request's parameters, located ``query.limit``, ``header.Prefer``..."""
    places: dict[str, list[str]] = {}
    for error in errors:
        place, _, name = error.loc.partition(".")
        names = places.setdefault(place, [])
        member = name.split(".")[0] or place
        if member not in names:
            names.append(member)
    return f"Fix {_named(places)} (see the field errors), then send the request again."


def body_fix(errors: Sequence[FieldError], *, again: str) -> str | None:
    """For errors in a JSON body, located by member (``run_id``, ``reason``...); ``None`` when
    only the tool arguments are wrong (the default advice is about them). ``again``: how to
    send the request again (e.g. "call again with the same key")."""
    members: list[str] = []
    for error in errors:
        member = error.loc.split(".")[0]
        if member not in members:
            members.append(member)
    if members == ["arguments"]:
        return None
    if WHOLE_BODY in members:
        return f"Send a JSON object as the body (its schema is in /openapi.json), then {again}."
    return f"Fix {_named({'body': members})} (see the field errors), then {again}."
