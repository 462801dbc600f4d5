"""One import name (issue 32; docs/architecture.md#one-import-name): the wheel installs
exactly one top-level package, ``toolledger``, and works beside an application that has its
own ``schemas.py``, ``processors/`` and ``producers.py``, names that used to be toolledger's
own top-level packages (and broke ``import toolledger`` in such an application).

The wheel is built from this checkout and installed, without its dependencies, into a fresh
virtual environment that sees the test environment's packages *after* its own (a path line,
so this checkout's editable install is not on it); the application runs from its own folder,
which Python puts first on ``sys.path``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "processors", "projections", "producers")
_CACHES = shutil.ignore_patterns("__pycache__", "*.pyc")

APP = """
import asyncio
import sys
from pathlib import Path

import schemas  # the application's own modules, first on sys.path
import processors
import producers
import toolledger
from pydantic import BaseModel
from toolledger import Ledger, Registry, ToolContext, TrustedContext

here = Path(__file__).resolve().parent
assert Path(schemas.__file__).parent == here, schemas.__file__
assert Path(processors.__file__).parent.parent == here, processors.__file__
assert Path(producers.__file__).parent == here, producers.__file__
installed = Path(toolledger.__file__).resolve()
assert "site-packages" in installed.parts, installed
assert schemas.OWN and processors.OWN and producers.OWN

registry = Registry()
runs = []

class Note(BaseModel):
    text: str

@registry.mutation()
async def write_note(args: Note, ctx: ToolContext) -> Note:
    '''Write a note.

    Use when: the user asks to note something.
    '''
    runs.append(args.text)
    return args

async def main() -> None:
    alice = TrustedContext(tenant_id="acme", principal="alice")
    async with Ledger.embedded(here / "ledger.db", registry, context=alice) as ledger:
        first = await ledger.call("write_note", {"text": "hi"}, idempotency_key="k-1")
        again = await ledger.call("write_note", {"text": "hi"}, idempotency_key="k-1")
    assert first.ok and not first.replayed, first
    assert again.ok and again.replayed, again
    assert runs == ["hi"], runs
    print("ok", installed.parent)

asyncio.run(main())
"""


def _build_wheel(out: Path) -> Path:
    """Built from a copy of the packaged files (a build in the checkout leaves build/ there)."""
    source = out / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", *PACKAGES, "toolledger"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=_CACHES)
        elif (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        check=True,
        cwd=out,
    )
    (wheel,) = out.glob("toolledger-*.whl")
    return wheel


def test_the_wheel_has_one_top_level_name_and_runs_beside_an_app_with_those_names(
    tmp_path: Path,
) -> None:
    wheel = _build_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = (n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert archive.read(top_level).decode().split() == ["toolledger"]
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"toolledger"}, tops
    for part in PACKAGES:
        assert f"toolledger/{part}/__init__.py" in names
    assert any(n.startswith("toolledger/schemas/avro/v1/") and n.endswith(".avsc") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # the test environment's third-party packages, after the venv's own (not processed as a
    # site directory: this checkout's editable install stays out)
    (site / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--quiet",
            str(wheel),
        ],
        check=True,
    )

    app = tmp_path / "app"
    (app / "processors").mkdir(parents=True)
    (app / "schemas.py").write_text("OWN = 'the application schemas'\n")
    (app / "producers.py").write_text("OWN = 'the application producers'\n")
    (app / "processors" / "__init__.py").write_text("OWN = 'the application processors'\n")
    (app / "app.py").write_text(textwrap.dedent(APP))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    ran = subprocess.run(
        [str(python), "app.py"], cwd=app, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("ok ") and str(site) in ran.stdout, ran.stdout

    version = subprocess.run(
        [str(venv / "bin" / "toolledger"), "--version"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.returncode == 0 and "0.1.0" in version.stdout, version
