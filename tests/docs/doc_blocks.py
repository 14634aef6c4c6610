"""Collect the fenced code blocks of the docs pages and the README.

A page's ```python blocks run in order in one namespace; each line of a ```bash or
```console block that runs ``rlloop`` runs too. Illustrative blocks say so by their label
(```text, or ```{code-block} python, which renders the same but is not collected).
A block preceded by ``<!-- file: NAME -->`` is a file the page's commands read: the test
writes it to NAME before running them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_FILE_NOTE = re.compile(r"^\s*<!-- file: (?P<name>[\w./-]+) -->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its label (``python``, ``bash``, ...), text and first line."""

    page: Path
    lang: str
    text: str
    line: int
    file_name: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One ``rlloop`` command of a shell block, with the output a ```console block shows
    after it (empty for ```bash)."""

    argv: list[str]
    expected: list[str]
    where: str


def pages() -> list[Path]:
    """Every docs page (the build folder aside) and the README."""
    found = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
    return [*found, ROOT / "README.md"]


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks in order (nested fences inside list items included)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, ticks = match["indent"], match["ticks"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:end]]
        note = _FILE_NOTE.match(lines[i - 1]) if i > 0 else None
        found.append(Block(page, match["info"].strip(), "\n".join(body) + "\n", i + 1,
                           note["name"] if note else None))
        i = end + 1
    return found


def python_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang == "python"]


def shell_commands(page: Path) -> list[Command]:
    """The ``rlloop`` commands of the page's ```bash and ```console blocks, in order;
    other commands (pip, python, torchrun) are the reader's to run."""
    commands: list[Command] = []
    for block in blocks(page):
        if block.lang not in ("bash", "console"):
            continue
        console = block.lang == "console"
        for text, expected, line in _logical_lines(block.text, console):
            argv = shlex.split(text, comments=True)
            if argv and argv[0] == "rlloop":
                commands.append(Command(argv[1:], expected,
                                        f"{block.where} (+{line})"))
    return commands


def _logical_lines(text: str, console: bool) -> list[tuple[str, list[str], int]]:
    """Commands with their backslash continuations joined; in a console block only the
    ``$ `` lines are commands and the lines after each are its output."""
    out: list[tuple[str, list[str], int]] = []
    pending = ""
    for n, raw in enumerate(text.splitlines()):
        if console and not pending:
            if raw.startswith("$ "):
                raw = raw[2:]
            else:
                if out and raw.strip():
                    out[-1][1].append(raw)
                continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((pending + raw, [], n))
        pending = ""
    return out


def file_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.file_name]
