"""The README is the front door: short, with the two commands, and the rest in the docs."""

from __future__ import annotations

from doc_blocks import ROOT

README = ROOT / "README.md"
SET_UP = "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "


def test_the_readme_is_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_the_readme_keeps_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    main = 'pip install uv && uv pip install -e ".[video]" && rlloop train ppo --env CartPole-v1'
    assert SET_UP + main in text
    tests = 'pip install -e ".[dev]" && python -m pytest -n 2 -m "not heavy" --durations=15'
    assert SET_UP + tests in text
    assert tests in (ROOT / ".ci" / "run").read_text(encoding="utf-8"), "CI runs what it says"
