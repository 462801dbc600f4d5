"""``*`` means "every tenant" in kill switches, so no caller may authenticate as that tenant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolledger.producers.http.auth import TokenFileError, TokenStore


def test_a_tokens_file_with_the_tenant_star_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    entry = {"token": "x" * 32, "tenant": "*", "principal": "p", "scopes": ["operator"]}
    path.write_text(json.dumps({"tokens": [entry]}))
    with pytest.raises(TokenFileError):
        TokenStore.load(path)
    path.write_text(json.dumps({"tokens": [{**entry, "tenant": "*acme"}]}))
    assert TokenStore.load(path) is not None  # only the exact "*" is reserved
