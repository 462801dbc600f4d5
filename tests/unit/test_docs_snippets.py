"""Every Python block of the README and of ``docs/**/*.md`` runs, as a reader would run it; the
README is a front page; the documentation site builds (``mkdocs build --strict``) offline.

How a page's blocks run (the rules a page's author writes to, also in docs/development.md):

- Each page gets a new, empty directory. Its fenced blocks are taken in order; each Python
  block runs there as a script of its own (``python <block>.py``, that directory the working
  directory). A block with a top-level ``await`` runs in an event loop.
- A block with ``title="<file name>"`` (any language, e.g. ``python title="mytools.py"`` or
  ``json title="tokens.json"``) is written to that file in the page's directory; a Python one
  also runs. The README's quick start files are written to every page's directory first, so
  that a page can say "the quick start's ``mytools.py``".
- The first ``sh`` block line of a page that starts ``toolledger serve`` or ``python -m
  toolledger serve`` starts that server, as written, in the page's directory on a free port
  (``--port 0`` is added); the page's later Python blocks find its address in
  ``TOOLLEDGER_URL``. It is stopped when the page is done.
- A block marked ``{.no-run data-reason="..."}`` in its fence is not run: it must say why,
  compile, and import only names that exist; the README has none, and there are at most
  ``MOST_NOT_RUN`` of them.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MOST_NOT_RUN = 3
BLOCK_TIMEOUT_S = 120
SERVER_START_S = 60
# Material for MkDocs announces its successor on every build; nothing to act on here
MKDOCS_ENV = {"NO_MKDOCS_2_WARNING": "1"}

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")
_OPTION = re.compile(
    r"""(?P<key>[\w-]+)=(?P<quote>["'])(?P<value>.*?)(?P=quote)|\.(?P<cls>[\w-]+)"""
)
_SERVE = re.compile(r"^(?:python3? -m )?toolledger serve\b")
# runs a block as `python block.py` would, in an event loop when it awaits at the top level
_RUNNER = """
import ast, asyncio, sys
path = sys.argv[1]
sys.argv = [path]
with open(path, encoding="utf-8") as source:
    code = compile(source.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
awaiting = eval(code, {"__name__": "__main__", "__file__": path})
if awaiting is not None:
    asyncio.run(awaiting)
"""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    options: dict[str, str] = field(default_factory=dict)
    classes: frozenset[str] = frozenset()

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def title(self) -> str | None:
        return self.options.get("title")

    @property
    def runs(self) -> bool:
        return self.language == "python" and "no-run" not in self.classes


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, indented ones (in lists, admonitions) included."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line.lstrip()
            for line in lines[index + 1 : end]
        ]
        language = re.split(r"[\s{]", info, maxsplit=1)[0]
        options = {m["key"]: m["value"] for m in _OPTION.finditer(info) if m["key"]}
        classes = frozenset(m["cls"] for m in _OPTION.finditer(info) if m["cls"])
        found.append(Block(page, index + 1, language, "\n".join(body) + "\n", options, classes))
        index = end + 1
    return found


BLOCKS = {page: blocks_of(page) for page in PAGES}
QUICK_START_FILES = [b for b in BLOCKS[README] if b.title]


def _serve_command(block: Block) -> list[str] | None:
    """The server a ``sh`` block starts (its first ``toolledger serve`` line), as argv."""
    if block.language != "sh":
        return None
    for line in block.code.replace("\\\n", " ").splitlines():
        if _SERVE.match(line.strip()):
            words = shlex.split(line.split(" #")[0])
            head = [sys.executable, "-m", "toolledger"]
            if words[0] == "toolledger":  # the console script beside this interpreter
                head = [str(Path(sys.executable).with_name("toolledger"))]
            rest = words[3:] if words[0].startswith("python") else words[1:]
            return [*head, *rest, "--port", "0"]
    return None


class Server:
    """A ``toolledger serve`` a page starts; its stderr is kept for the failure message."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.argv = argv
        self.lines: list[str] = []
        self.url: str | None = None
        self._listening = threading.Event()
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if self.url is None and "listening on " in line:
                self.url = line.split("listening on ", 1)[1].split()[0]
                self._listening.set()
        self._listening.set()  # it exited

    def wait_listening(self) -> str:
        self._listening.wait(SERVER_START_S)
        assert self.url is not None, (
            f"{shlex.join(self.argv)} did not start:\n{''.join(self.lines)}"
        )
        return self.url

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)


def run_block(block: Block, directory: Path, env: dict[str, str]) -> None:
    script = directory / (block.title or f"_block_{block.line}.py")
    if not block.title:
        script.write_text(block.code, encoding="utf-8")
    ran = subprocess.run(
        [sys.executable, "-c", _RUNNER, script.name],
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert ran.returncode == 0, f"{block.where} failed:\n{ran.stdout}{ran.stderr}"


def _write_quick_start(directory: Path) -> None:
    for file in QUICK_START_FILES:
        (directory / str(file.title)).write_text(file.code, encoding="utf-8")


def _reader_env() -> dict[str, str]:
    """This environment less what would point a block at someone else's server."""
    env = {k: v for k, v in os.environ.items() if k not in ("TOOLLEDGER_URL", "TOOLLEDGER_TOKEN")}
    env.pop("PYTHONPATH", None)  # the blocks see the installed package, as a reader does
    return env


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail to docs/"
    opening = "\n".join(lines[:40])
    assert "make demo" in opening and "make test" in opening
    assert not any(b.language == "python" and not b.runs for b in BLOCKS[README])
    assert any(b.runs for b in BLOCKS[README])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_of_a_page_runs(page: Path, tmp_path: Path) -> None:
    env = _reader_env()
    _write_quick_start(tmp_path)
    blocks = BLOCKS[page]
    server: Server | None = None
    try:
        for index, block in enumerate(blocks):
            if block.title:
                (tmp_path / block.title).write_text(block.code, encoding="utf-8")
            serve = _serve_command(block)
            used = any(later.runs for later in blocks[index + 1 :])  # a server for no block: no
            if serve is not None and server is None and used:
                server = Server(serve, tmp_path, env)
                env = {**env, "TOOLLEDGER_URL": server.wait_listening()}
            if block.runs:
                run_block(block, tmp_path, env)
    finally:
        if server is not None:
            server.stop()


def test_blocks_not_run_are_few_say_why_and_import_what_exists(tmp_path: Path) -> None:
    not_run = [b for blocks in BLOCKS.values() for b in blocks if "no-run" in b.classes]
    assert len(not_run) <= MOST_NOT_RUN, [b.where for b in not_run]
    _write_quick_start(tmp_path)
    for block in not_run:
        assert block.language == "python", f"{block.where}: only Python blocks are run at all"
        assert block.options.get("data-reason"), f"{block.where}: say why it is not run"
        tree = ast.parse(block.code, block.where)
        imports: list[ast.stmt] = [
            n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
        ]
        statements = Block(block.page, block.line, "python", ast.unparse(ast.Module(imports, [])))
        run_block(statements, tmp_path, _reader_env())  # its imports, and nothing else
    print(
        f"{len(not_run)} blocks not run:",
        *(f"{b.where}: {b.options['data-reason']}" for b in not_run),
    )


def test_the_site_builds_strictly_and_fetches_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, **MKDOCS_ENV},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    external = re.compile(r"""<(?:link|script|img)\b[^>]*\b(?:href|src)=["']?(?:https?:)?//""")
    for html in site.rglob("*.html"):
        found = external.search(html.read_text(encoding="utf-8"))
        assert found is None, f"{html.relative_to(site)} loads {found.group(0)}"


def test_a_block_parser_sees_titles_markers_and_indented_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n"
        '```python title="mytools.py"\nx = 1\n```\n'
        '- item\n\n    ```python {.no-run data-reason="needs Kafka"}\n    y = 2\n    ```\n'
        "```sh\npython -m toolledger serve --tools mytools:registry \\\n  --data d\n```\n",
        encoding="utf-8",
    )
    titled, marked, shell = blocks_of(page)
    assert (titled.title, titled.runs, titled.code) == ("mytools.py", True, "x = 1\n")
    assert (marked.runs, marked.options["data-reason"], marked.code) == (
        False,
        "needs Kafka",
        "y = 2\n",
    )
    assert marked.line == 7
    serve = _serve_command(shell)
    assert serve is not None and serve[1:] == [
        "-m",
        "toolledger",
        "serve",
        "--tools",
        "mytools:registry",
        "--data",
        "d",
        "--port",
        "0",
    ]
