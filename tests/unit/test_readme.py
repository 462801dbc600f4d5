"""Every Python snippet of the README runs, as a new user would paste it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_snippets() -> None:
    assert SNIPPETS


@pytest.mark.parametrize("number", range(len(SNIPPETS)))
def test_a_readme_snippet_runs(number: int, tmp_path: Path) -> None:
    script = tmp_path / f"snippet_{number}.py"
    script.write_text(SNIPPETS[number], encoding="utf-8")
    ran = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(README.parent), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
