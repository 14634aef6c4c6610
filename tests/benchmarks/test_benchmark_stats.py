"""The off-policy benchmark's return comparison (benchmarks/offpolicy.py): the interval
it reports is Welch's normal 95% interval of the difference of means."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "offpolicy.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("offpolicy_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_interval_by_hand(bench: ModuleType) -> None:
    # means 3 and 1; sample variances 1 and 8/3 over 3 and 4 seeds: the standard error
    # of the difference is sqrt(1/3 + 2/3) = 1
    c = bench.compare_returns([2.0, 3.0, 4.0], [-1.0, 1.0, 3.0, 1.0])
    assert c.difference == pytest.approx(2.0)
    assert (c.low, c.high) == (pytest.approx(0.04), pytest.approx(3.96))
    assert c.seeds == (3, 4)
    assert c.verdict == "better"
    # a fourth, lower seed of ours widens the interval past zero
    wider = bench.compare_returns([2.0, 3.0, 4.0, -2.0], [-1.0, 1.0, 3.0, 1.0])
    se = math.sqrt((83 / 12) / 4 + (8 / 3) / 4)  # sample variances 83/12 and 8/3
    assert wider.low == pytest.approx(0.75 - 1.96 * se)
    assert wider.verdict == "equal"


@pytest.mark.parametrize(("ours", "verdict"), [([10.0, 11.0, 12.0], "better"),
                                                ([-12.0, -11.0, -10.0], "worse"),
                                                ([-1.0, 0.0, 1.0], "equal")])
def test_verdict(bench: ModuleType, ours: list[float], verdict: str) -> None:
    c = bench.compare_returns(ours, [-1.0, 0.0, 1.0])
    assert c.verdict == verdict
    assert verdict in str(c) and "95% CI" in str(c)


def test_needs_two_seeds_each(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="two seeds"):
        bench.compare_returns([1.0], [1.0, 2.0])
