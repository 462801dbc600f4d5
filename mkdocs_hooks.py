"""The documentation site's MkDocs hooks (named in mkdocs.yml).

- The home page is the README: ``docs/index.md`` stands in for it, and its links into
  ``docs/`` are made relative to the site.
- docs/benchmarks.md's tables are made from bench/results/*.json (:mod:`bench.report`).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.pages import Page

from bench.report import fill

README = Path(__file__).resolve().parent / "README.md"
_INTO_DOCS = re.compile(r"\]\(docs/")


def on_page_read_source(page: Page, **_context: object) -> str | None:
    """The README's text for the home page (None: read the page's own file)."""
    if page.file.src_uri != "index.md":
        return None
    return _INTO_DOCS.sub("](", README.read_text(encoding="utf-8"))


def on_page_markdown(markdown: str, **_context: object) -> str:
    """Every page's markdown, its benchmark markers filled."""
    return fill(markdown)
