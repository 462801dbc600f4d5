"""The console's layout in Chromium, at 1280 and 390 pixels wide, on every backend: measured
in the page (element boxes, computed styles, line boxes of words), never by comparing
pixels.

- A succeeded call's Attempts table is one row, with its outcome.
- At 390 px a data table is a stack of cards: every cell, with its column's name, inside the
  screen, nothing to scroll; at 1280 px it is a table, no word in it broken across lines
  (identifiers such as ``charge_card``) and nothing to scroll.
- The charts have a value axis in their unit, a time axis, and a text alternative.
- The calls page lists the recent calls before any search.
- A console path no page has is an HTML page (404)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.browser.pages import WIDTHS, sign_in, tab
from tests.http.servers import ACME, OPERATOR, Server

CHARGE = {"customer_id": "cus_layout_1", "amount_cents": 4200, "currency": "USD"}

# every whitespace-separated word of a table's body whose line boxes are on more than one line
BROKEN_WORDS = """table => {
  const broken = [];
  const range = document.createRange();
  const walker = document.createTreeWalker(table.tBodies[0], NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.data.matchAll(/\\S+/g)) {
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0)
        .map(r => Math.round(r.top)));
      if (tops.size > 1) broken.push(m[0]);
    }
  }
  return broken;
}"""

# how many lines an element's text is on
LINES = """element => {
  const range = document.createRange();
  range.selectNodeContents(element);
  return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
}"""

# the header of each body cell's column next to the cell's data-label
LABELS = """table => {
  const heads = [...table.tHead.rows[0].cells].map(c => c.textContent.trim());
  return [...table.tBodies[0].rows].flatMap(row =>
    [...row.cells].map((cell, i) => [heads[i], cell.dataset.label ?? null]));
}"""

# the first rows' cells: their box, display and the label drawn before them
CELLS = """(table, rows) => [...table.tBodies[0].rows].slice(0, rows).flatMap(row =>
  [...row.cells].map(cell => {
    const box = cell.getBoundingClientRect();
    return {left: box.left, right: box.right, width: box.width, height: box.height,
            display: getComputedStyle(cell).display,
            before: getComputedStyle(cell, '::before').content};
  }))"""


def _call(server: Server, tool: str, arguments: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/tools/{tool}/calls",
        json={"arguments": arguments},
        headers={**ACME.headers, "Idempotency-Key": f"layout-{uuid.uuid4().hex[:10]}"},
        timeout=60,
    )


def _viewport_width(page: Page) -> float:
    width: float = page.evaluate("window.innerWidth")
    return width


def _no_page_scroll(page: Page) -> None:
    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, f"{page.url} scrolls sideways by {wide} px"


def _fits(region: Locator) -> None:
    """The table's own region does not scroll sideways."""
    over = region.evaluate("wrap => wrap.scrollWidth - wrap.clientWidth")
    assert over <= 1, f"{region.get_attribute('aria-label')} scrolls sideways by {over} px"


def _check_cards_or_table(page: Page, width: int) -> int:
    """Every ``table.cards`` of the page, as the width wants it; how many were checked."""
    tables = page.locator("table.cards")
    for i in range(tables.count()):
        table = tables.nth(i)
        expect(table).to_be_visible()
        labels = table.evaluate(LABELS)
        assert labels and all(head == label for head, label in labels), labels
        region = table.locator("xpath=..")
        _fits(region)
        cells = table.evaluate(CELLS, 3)
        if width == 390:
            head = table.locator("thead").bounding_box()
            assert head is not None and head["width"] <= 1 and head["height"] <= 1
            for cell in cells:  # stacked, each inside the screen, with its label before it
                assert cell["display"] == "flow-root", cell
                assert cell["left"] >= 0 and cell["right"] <= _viewport_width(page), cell
                assert cell["width"] > 0.8 * (_viewport_width(page) - 60), cell
                assert cell["before"] not in ("none", "normal", '""'), cell
        else:
            assert table.evaluate("t => getComputedStyle(t).display") == "table"
            assert all(cell["display"] == "table-cell" for cell in cells), cells
            assert table.evaluate(BROKEN_WORDS) == []
    return tables.count()


@pytest.fixture(scope="module")
def made(server: Server) -> dict[str, str]:
    """A succeeded call and a pending approval of acme."""
    call = _call(server, "create_ticket", {"title": "Layout check"})
    assert call.status_code == 200, call.text
    asked = _call(server, "charge_card", CHARGE)
    assert asked.status_code == 428, asked.text
    return {
        "call_id": call.json()["call_id"],
        "approval_id": asked.json()["approval_request"]["id"],
    }


@pytest.mark.parametrize("width", WIDTHS)
def test_a_succeeded_calls_attempts_are_one_row_with_its_outcome(
    browser: Browser, server: Server, made: dict[str, str], width: int
) -> None:
    with tab(browser, server, width) as page:
        sign_in(page, server, ACME, f"/console/calls/{made['call_id']}")
        attempts = page.get_by_role("region", name="Attempts").locator("table")
        rows = attempts.locator("tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first.locator('[data-label="Outcome"]')).to_have_text("ToolCallSucceeded")
        expect(rows.first.locator('[data-label="Round"]')).to_have_text("1")
        expect(page.get_by_text("no outcome yet")).to_have_count(0)
        assert _check_cards_or_table(page, width) == 1
        _no_page_scroll(page)


@pytest.mark.parametrize("width", WIDTHS)
def test_tables_are_cards_at_390_and_keep_words_whole_at_1280(
    browser: Browser, server: Server, made: dict[str, str], width: int
) -> None:
    pages = {
        "/console/calls": 1,  # the recent calls
        f"/console/calls/{made['call_id']}": 1,  # its attempts
        "/console/approvals": 1,
        "/console/switches": 1,
        "/console/stats": 1,  # per tool
    }
    with tab(browser, server, width) as page:
        sign_in(page, server, OPERATOR)
        for path, tables in pages.items():
            page.goto(server.base_url + path)
            assert _check_cards_or_table(page, width) == tables, path
            _no_page_scroll(page)
        page.goto(server.base_url + "/console/approvals")
        tool = (
            page.get_by_role("row")
            .filter(has_text=made["approval_id"])
            .get_by_text("charge_card", exact=True)
        )
        assert tool.evaluate(LINES) == 1


@pytest.mark.parametrize("width", WIDTHS)
def test_charts_have_axes_units_and_a_text_alternative(
    browser: Browser, server: Server, width: int
) -> None:
    with tab(browser, server, width) as page:
        sign_in(page, server, OPERATOR, "/console/stats")
        success = page.get_by_role(
            "img", name=re.compile(r"Success rate over time, in percent of calls .*samples? from")
        )
        expect(success).to_be_visible()
        figures = page.locator("figure.chart")
        expect(figures).to_have_count(6)
        for i in range(6):
            figure = figures.nth(i)
            svg = figure.locator("svg")
            box = svg.bounding_box()
            assert box is not None and box["x"] >= 0
            assert box["x"] + box["width"] <= _viewport_width(page)
            texts = svg.locator("text")
            labels = texts.all_text_contents()
            assert "time (UTC)" in labels, labels
            unit = svg.locator("text.unit").first.text_content()
            assert unit in ("percent of calls", "calls", "calls per run"), unit
            if unit == "percent of calls":
                assert {"0 %", "50 %", "100 %"} <= set(labels), labels
            assert any(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in labels), labels
            for j in range(texts.count()):  # readable, and inside the chart
                t = texts.nth(j).bounding_box()
                assert t is not None and t["height"] >= 9, (labels[j], t)
                assert box["x"] <= t["x"] and t["x"] + t["width"] <= box["x"] + box["width"]
            desc = svg.locator("desc").text_content() or ""
            assert re.match(r"\d+ samples? from \d\d:\d\d:\d\d to \d\d:\d\d:\d\d UTC; now ", desc)
            samples = figure.locator("details table tbody tr")
            assert samples.count() == int(desc.split()[0])
        _no_page_scroll(page)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_calls_page_lists_the_recent_calls(
    browser: Browser, server: Server, width: int
) -> None:
    newest = _call(server, "create_ticket", {"title": f"newest at {width}"}).json()["call_id"]
    with tab(browser, server, width) as page:
        sign_in(page, server, ACME)
        expect(page.get_by_role("heading", name="Recent calls")).to_be_visible()
        rows = page.get_by_role("region", name="Recent calls").locator("tbody tr")
        expect(rows.first.get_by_role("link", name=newest)).to_be_visible(timeout=30_000)
        assert rows.count() >= 2
        _check_cards_or_table(page, width)
        _no_page_scroll(page)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_console_path_no_page_has_is_an_html_404(
    browser: Browser, server: Server, width: int
) -> None:
    with tab(browser, server, width) as page:
        sign_in(page, server, ACME)
        answer = page.goto(server.base_url + "/console/nope")
        assert answer is not None and answer.status == 404
        assert answer.headers["content-type"].startswith("text/html")
        expect(page.get_by_role("heading", name="Not found")).to_be_visible()
        expect(page.get_by_role("alert")).to_contain_text(
            "The console has no page at /console/nope."
        )
        expect(page.get_by_role("navigation", name="Console")).to_be_visible()
        _no_page_scroll(page)
