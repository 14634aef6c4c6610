"""The result files the docs draw benchmark figures from: every file a page's
``benchmark-figure`` names is committed, parses, carries the fields its figure reads and
draws; the directive refuses a file with no rows rather than drawing an empty figure."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from doc_blocks import DOCS, ROOT, blocks, pages

sys.path.insert(0, str(DOCS / "_ext"))
import benchmark_figures  # the docs extension's own module, found above
import rlloop_docs

_DIRECTIVE = re.compile(r"^\{benchmark-figure\}\s+(?P<file>\S+)$")
_KIND = re.compile(r"^:kind:\s*(?P<kind>\S+)\s*$", re.MULTILINE)


def figures() -> list[tuple[str, str]]:
    """(result file, kind) of every ``benchmark-figure`` on the docs pages."""
    found = set()
    for page in pages():
        for block in blocks(page):
            if match := _DIRECTIVE.match(block.lang):
                kind = _KIND.search(block.text)
                found.add((match["file"], kind["kind"] if kind else "zoo"))
    return sorted(found)


def test_the_recurrent_and_multi_agent_pages_draw_their_files() -> None:
    assert {
        ("benchmarks/recurrent_results.jsonl", "solve"),
        ("benchmarks/multi_agent_results.jsonl", "curve"),
        ("benchmarks/zoo_results.jsonl", "zoo"),
    } <= set(figures())


@pytest.mark.parametrize(("name", "kind"), figures())
def test_each_result_file_has_the_fields_its_figure_reads(
    name: str, kind: str, tmp_path: Path
) -> None:
    rows = benchmark_figures.read_rows(ROOT / name, kind)
    for row in rows:
        assert benchmark_figures.FIELDS[kind] <= row.keys()
    if kind == "solve":
        benchmark_figures.draw_solve(rows, tmp_path / "figure.png")
    elif kind == "curve":
        assert any(r["contender"] == benchmark_figures.REFERENCE for r in rows)
        benchmark_figures.draw_curve(rows, tmp_path / "figure.png")
    else:
        return  # zoo figures are drawn per algorithm by the docs build
    assert (tmp_path / "figure.png").stat().st_size > 1000
    assert benchmark_figures.measured_on(rows).startswith("measured 20")


def test_a_row_without_a_field_names_the_line_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(
        '{"contender": "a", "seed": 0, "env_steps": 0, "return_mean": 0.1, '
        '"date": "2026-12-03", "machine": "m"}\n{"contender": "a", "seed": 0}\n'
    )
    with pytest.raises(
        benchmark_figures.ResultFileError,
        match=r"results.jsonl line 2 lacks \['date', 'env_steps', ",
    ):
        benchmark_figures.read_rows(path, "curve")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One Sphinx build, with the docs extension, of a page drawing a file with no rows and
    a page drawing a small curve file (result files read from the build's folder): its
    output folder and warnings."""
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace

    root = tmp_path_factory.mktemp("site")
    (root / "empty.jsonl").write_text("\n")
    stamp = '"date": "2026-12-03", "machine": "a test CPU"'
    (root / "curve.jsonl").write_text(
        "".join(
            f'{{"contender": "{who}", "seed": 0, "env_steps": {steps}, "return_mean": {ret}, '
            f"{stamp}}}\n"
            for who, steps, ret in (("random", 0, 0.0), ("ma_ppo", 0, 0.1), ("ma_ppo", 100, 0.5))
        )
    )
    src = root / "src"
    src.mkdir()
    (src / "conf.py").write_text('extensions = ["myst_parser", "rlloop_docs"]\n')
    (src / "index.md").write_text("# Index\n\n```{toctree}\nempty\ncurve\n```\n")
    for name in ("empty", "curve"):
        (src / f"{name}.md").write_text(
            f"# {name}\n\n```{{benchmark-figure}} {name}.jsonl\n:kind: curve\n```\n"
        )
    warnings = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, docutils_namespace():
        patch.setattr(rlloop_docs, "ROOT", root)
        Sphinx(
            str(src),
            str(src),
            str(root / "out"),
            str(root / "doctrees"),
            "html",
            status=None,
            warning=warnings,
            freshenv=True,
        ).build()
    return root / "out", warnings.getvalue()


def test_the_directive_fails_on_a_file_with_no_rows(site: tuple[Path, str]) -> None:
    _, warnings = site
    assert "empty.jsonl has no rows; run its benchmark script with --results" in warnings
    assert "curve.jsonl" not in warnings


def test_the_directive_draws_a_curve_and_names_the_date_and_machine(site: tuple[Path, str]) -> None:
    out, _ = site
    html = (out / "curve.html").read_text()
    assert "drawn from curve.jsonl at build time; measured 2026-12-03 on a test CPU" in html
    assert (out / "_images" / "curve-curve.png").stat().st_size > 1000
