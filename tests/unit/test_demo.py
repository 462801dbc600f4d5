"""``toolledger demo`` (``make demo``) runs every scene and every invariant check passes."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from toolledger.demo import SCENES, run_demo


async def test_the_demo_passes_all_its_invariant_checks(tmp_path: Path) -> None:
    console = Console(file=(tmp_path / "out.txt").open("w"), width=120)
    checks = await run_demo(tmp_path, console)
    assert checks.failures == []
    assert checks.passed >= 3 * len(SCENES)
    text = (tmp_path / "out.txt").read_text()
    for event in ("ApprovalRequested", "ApprovalGranted", "ApprovalDenied", "ToolDisabled"):
        assert event in text  # the approval and kill-switch scenes are in the audit table
