"""Sphinx directives that render rlloop's own sources, so that the pages cannot drift from them.

- ``hyperparameters``: a config dataclass's fields (name, default, docstring) as a table, read
  from the docstring under each field (the config modules' convention).
- ``cli-reference``: every ``rlloop`` subcommand's ``--help``, from the argument parser itself.
- ``benchmark-figure``: a figure drawn at build time from a result file committed in the repo
  (the drawing and the fields each file must carry: :mod:`benchmark_figures`).
- ``presets``: the envs that ship a preset for an algorithm, read from the preset files.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any, ClassVar

from benchmark_figures import (
    FIELDS,
    ResultFileError,
    draw_curve,
    draw_solve,
    draw_zoo,
    measured_on,
    read_rows,
)
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]


def field_docstrings(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it), the base classes' included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, [*body[1:], None], strict=True):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "(required)"


def _literal(text: str) -> nodes.Node:
    return nodes.literal(text, text)


def _table(header: list[str], rows: list[list[nodes.Node]], widths: list[int]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    head += nodes.row("", *[nodes.entry("", nodes.paragraph(text=h)) for h in header])
    body = nodes.tbody()
    group += body
    for cells in rows:
        body += nodes.row("", *[nodes.entry("", nodes.paragraph("", "", c)) for c in cells])
    return table


class Hyperparameters(SphinxDirective):
    """``.. hyperparameters:: rlloop.config.ppo.PPOConfig`` with ``:prefix: ppo.``."""

    required_arguments = 1
    option_spec: ClassVar[dict[str, Any]] = {
        "prefix": directives.unchanged, "exclude": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        module_name, _, class_name = self.arguments[0].rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name)
        prefix = self.options.get("prefix", "")
        excluded = set(self.options.get("exclude", "").split())
        docs = field_docstrings(cls)
        rows = []
        for f in dataclasses.fields(cls):
            if f.name in excluded:
                continue
            if f.name not in docs:
                raise self.error(f"{cls.__name__}.{f.name} has no docstring; add one under it")
            rows.append([_literal(prefix + f.name), _literal(_default(f)),
                         nodes.Text(docs[f.name])])
        return [_table(["setting", "default", "meaning"], rows, [20, 15, 65])]


class CliReference(SphinxDirective):
    """Every subcommand's help text, from :func:`rlloop.cli.main._parser`."""

    def run(self) -> list[nodes.Node]:
        import argparse

        from rlloop.cli.main import _parser

        parser = _parser()
        out: list[nodes.Node] = [nodes.literal_block(text=parser.format_help())]
        for action in parser._actions:  # argparse keeps its subparsers only here
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    section = nodes.section(ids=[f"cli-{name}"])
                    section += nodes.title(text=f"rlloop {name}")
                    section += nodes.literal_block(text=sub.format_help())
                    out.append(section)
        return out


class ModuleIndex(SphinxDirective):
    """Every module under ``src/rlloop`` with its docstring (no members), walked at build time
    so that a module added or removed shows here; ``:exclude:`` skips those documented in
    full elsewhere."""

    option_spec: ClassVar[dict[str, Any]] = {"exclude": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from docutils.statemachine import StringList

        excluded = set(self.options.get("exclude", "").split())
        src = ROOT / "src"
        names = sorted(
            ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
            for path in (src / "rlloop").rglob("*.py") if path.name != "__main__.py")
        lines = StringList()
        for name in names:
            if name not in excluded:
                lines.append(f".. automodule:: {name}", "module-index")
                lines.append("", "module-index")
        node = nodes.container()
        self.state.nested_parse(lines, self.content_offset, node)
        return node.children


class BenchmarkFigure(SphinxDirective):
    """``.. benchmark-figure:: benchmarks/zoo_results.jsonl`` with ``:algo: ppo`` (kind
    ``zoo``, the default), or ``:kind: solve`` / ``:kind: curve`` (with an optional
    ``:ylabel:``) for the other result files (see :mod:`benchmark_figures`). The caption
    names the file and the dates and machines its rows record."""

    required_arguments = 1
    option_spec: ClassVar[dict[str, Any]] = {
        "algo": directives.unchanged_required,
        "kind": lambda arg: directives.choice(arg, list(FIELDS)),
        "ylabel": directives.unchanged_required,
    }

    def run(self) -> list[nodes.Node]:
        source = ROOT / self.arguments[0]
        if not source.is_file():
            raise self.error(f"{self.arguments[0]} is not a file in the repository")
        self.env.note_dependency(str(source))
        kind = self.options.get("kind", "zoo")
        try:
            rows = read_rows(source, kind)
        except ResultFileError as e:
            raise self.error(str(e)) from None
        name = f"{source.stem}-{self.options.get('algo', kind)}.png"
        # drawn into the source tree (ignored by git), where Sphinx copies images from
        out = Path(self.env.srcdir) / "_generated" / name
        if kind == "zoo":
            if "algo" not in self.options:
                raise self.error("a zoo figure needs :algo: (the algorithm whose rows to draw)")
            from rlloop.config.presets import all_files

            algo = self.options["algo"]
            zoo = {f.env: f.benchmark.get(algo, {}) for f in all_files()}
            if not draw_zoo(rows, algo, zoo, out):
                raise self.error(f"{self.arguments[0]} has no rows for {algo!r}")
            what = f"{algo}: final evaluation return per env"
            rows = [r for r in rows if r["algo"] == algo]
        elif kind == "solve":
            draw_solve(rows, out)
            what = "Steps, training time and throughput to solve, per contender and seed"
        else:
            draw_curve(rows, out, self.options.get("ylabel", "evaluation return"))
            what = "Evaluation return along training, per seed"
        when = measured_on(rows)
        caption = (f"{what}, drawn from {self.arguments[0]} at build time"
                   + (f"; {when}" if when else ""))
        figure = nodes.figure()
        figure += nodes.image(uri=f"/_generated/{name}")
        figure += nodes.caption(text=caption)
        return [figure]


def _score(score: float | None, std: float | None) -> str:
    if score is None:
        return "-"
    return f"{score:g}" if std is None else f"{score:g} ± {std:g}"


class PresetList(SphinxDirective):
    """``.. presets:: ppo``: every env with a ``ppo`` preset, its budget and rl-zoo's score,
    read from the shipped preset files (``:sets: recurrent`` keeps only the presets whose
    layer sets ``ppo.recurrent``), so that a preset added or removed shows here."""

    required_arguments = 1
    option_spec: ClassVar[dict[str, Any]] = {"sets": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from rlloop.config.presets import listing, preset
        from rlloop.errors import ConfigError

        algo = self.arguments[0]
        setting = self.options.get("sets")
        for path in (ROOT / "src" / "rlloop" / "config" / "presets").glob("*.yaml"):
            self.env.note_dependency(str(path))
        try:
            rows = listing(algo)
        except ConfigError:  # no preset for this algorithm at all
            rows = []
        if setting:
            rows = [r for r in rows if setting in (preset(algo, r.env).get(algo) or {})]
        if not rows:
            what = f"sets {algo}.{setting}" if setting else f"is for {algo}"
            return [nodes.paragraph(text=f"No shipped preset {what} yet.")]
        cells = [[_literal(r.env), nodes.Text(f"{r.budget:,}" if r.budget else "-"),
                  nodes.Text(_score(r.zoo_score, r.zoo_std))] for r in rows]
        return [_table(["env", "budget (env steps)", "rl-zoo score at that budget"], cells,
                       [40, 25, 35])]


def _resolves(target: str, module: str | None, klass: str | None) -> bool:
    """Whether ``target`` names something that exists in rlloop, as Python would find it from
    the docstring's module (and class): ``Task.compute_loss``, ``as_stats``, a full path."""
    bases = [""]
    if module:
        bases += [module + ".", *([f"{module}.{klass}."] if klass else [])]
    for base in bases:
        parts = (base + target.lstrip("~.")).split(".")
        for split in range(len(parts), 0, -1):
            try:
                obj: Any = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return True
    return False


def _existing_api_without_a_page(app: Sphinx, env: Any, node: Any,
                                 contnode: nodes.Node) -> nodes.Node | None:
    """A reference to an rlloop object that exists but has no page of its own renders as
    plain code; one to an object that does not exist (renamed, removed) stays a warning,
    which ``-W`` turns into a failed build."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    if _resolves(target, node.get("py:module"), node.get("py:class")):
        return contnode
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", _existing_api_without_a_page)
    app.add_directive("hyperparameters", Hyperparameters)
    app.add_directive("cli-reference", CliReference)
    app.add_directive("benchmark-figure", BenchmarkFigure)
    app.add_directive("module-index", ModuleIndex)
    app.add_directive("presets", PresetList)
    return {"parallel_read_safe": True}
