"""The package's layout holds: packages by role on floors, imports only run down, no circles.

Every import of an rlloop module is counted, those under ``if TYPE_CHECKING:`` and inside
functions too. The layout block of docs/architecture.md is rendered from the floors below and
the first line of each package's docstring; after changing either, rewrite it with
``python tests/test_layout.py``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rlloop"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: Top floor first. A package imports itself and the floors below its own, never its own
#: floor's other rooms or a floor above.
FLOORS: list[tuple[str, ...]] = [
    ("__main__", "__init__"),
    ("cli", "api"),
    ("tasks", "tuning"),
    ("runs",),
    ("trainers",),
    ("algorithms",),
    ("runners",),
    ("learners",),
    ("data",),
    ("modules",),
    ("envs",),
    ("checkpoint", "logging", "losses"),
    ("config",),
    ("system",),
    ("errors",),
]

#: The imports that run up a floor, each with why it may (at most 4).
UPWARD = {
    ("rlloop.runners.ray_runners", "rlloop.algorithms.offpolicy_loop"):
        "Ray env runners wrap the off-policy loop of the algorithm they scale out",
    ("rlloop.envs.imports", "rlloop.modules.custom"):
        "checking a network that a config names, before the module that holds it is trusted",
}

MAX_TOP_LEVEL_MODULES = 6


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    base = PACKAGE.parent / module.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> Iterator[str]:
    """Every rlloop module ``path`` imports (a ``from pkg import sub`` names ``pkg.sub``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "rlloop" or node.module.startswith("rlloop.")):
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names
                        if _exists(f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("rlloop"))


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        graph[name] |= {m for m in _imports(path) if m != name and _exists(m)}
    return graph


def _room(module: str) -> str:
    """The package (or top-level module) a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


FLOOR = {room: i for i, floor in enumerate(FLOORS) for room in floor}


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets
            if _room(a) != _room(b) and FLOOR[_room(b)] <= FLOOR[_room(a)]}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def _rooms_on_disk() -> set[str]:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return packages | modules


def _summary(room: str) -> str:
    path = PACKAGE / room / "__init__.py"
    if not path.is_file():
        path = PACKAGE / f"{room}.py"
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".")
    return first.replace("``", "`")


def render_layout() -> str:
    """The layout block of docs/architecture.md: floors from the top, each room with its
    docstring's first sentence."""
    floors = []
    for floor in FLOORS:
        rooms = [f"{room}/" if (PACKAGE / room).is_dir() else f"{room}.py"
                 for room in floor if room not in ("__init__", "__main__")]
        if rooms:
            floors.append("".join(f"{name:<13} {_summary(name.rstrip('/').removesuffix('.py'))}\n"
                                  for name in rooms))
    return "\n".join(floors)


_BLOCK = re.compile(r"(<!-- layout: generated by tests/test_layout.py -->\n```text\n)(.*?)(```)",
                    re.S)


def test_every_package_is_on_a_floor() -> None:
    assert _rooms_on_disk() == set(FLOOR), "add new packages to FLOORS (and their docstring)"


def test_the_top_level_is_the_public_face_only() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_imports_run_down_the_floors() -> None:
    up = upward_imports(import_graph())
    assert up <= set(UPWARD), f"imports that run up a floor: {sorted(up - set(UPWARD))}"
    assert len(UPWARD) <= 4


def test_allowed_upward_imports_are_still_needed() -> None:
    assert set(UPWARD) <= upward_imports(import_graph()), "drop the ones that are gone"


def test_each_package_says_what_it_may_import() -> None:
    for room in FLOOR:
        init = PACKAGE / room / "__init__.py"
        if init.is_file():
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
            assert "May import" in doc, f"{room}/__init__.py: say what it may import"


def test_the_architecture_page_layout_is_the_rendered_one() -> None:
    match = _BLOCK.search(ARCHITECTURE.read_text(encoding="utf-8"))
    assert match, "docs/architecture.md lost its generated layout block"
    assert match.group(2) == render_layout(), "run: python tests/test_layout.py"


if __name__ == "__main__":
    text = ARCHITECTURE.read_text(encoding="utf-8")
    new = _BLOCK.sub(lambda m: m.group(1) + render_layout() + m.group(3), text)
    ARCHITECTURE.write_text(new, encoding="utf-8")
    page = ARCHITECTURE.relative_to(ROOT)
    print(f"{page} layout block rewritten" if new != text else f"{page} already current")
