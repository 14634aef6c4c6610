"""benchmarks/whole_process.py races rlloop against SBX; SBX stays optional: without it the
race stops at once with a line naming the install, and with it a tiny run of each library's
child reports the figures the race reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS), *sys.path])


def test_missing_sbx_is_one_line_naming_the_install(
        benchmarks_on_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import jax_peer

    monkeypatch.setitem(sys.modules, "sbx", None)  # an import of sbx now fails
    with pytest.raises(jax_peer.SbxMissing, match=r"pip install sbx-rl") as error:
        jax_peer.require_sbx()
    assert len(str(error.value).splitlines()) == 1
    monkeypatch.setattr(sys, "argv", ["whole_process.py", "--rows", "dqn"])
    import whole_process

    with pytest.raises(jax_peer.SbxMissing):
        whole_process.main()


# SBX's child imports jax and jit-compiles DQN's update: a minute on a loaded 2-core host.
@pytest.mark.parametrize("library", ["rlloop", pytest.param("sbx", marks=pytest.mark.heavy)])
def test_child_reports_what_the_race_reads(benchmarks_on_path: None, library: str) -> None:
    if library == "sbx":
        pytest.importorskip("sbx")
    import torch
    import whole_process

    threads = torch.get_num_threads()
    try:
        out = whole_process.child(library, "dqn", 1400, 0, 1)
    finally:
        torch.set_num_threads(threads)
    assert out.keys() >= {"train_s", "steady_sps", "steady_cpu_sps", "eval_s", "eval_cpu_s",
                          "return"}
    assert out["train_s"] > 0 and out["steady_sps"] > 0 and out["steady_cpu_sps"] > 0
    assert 8 <= out["return"] <= 500  # CartPole's returns, 20 greedy episodes


def test_one_core_confines_the_child(benchmarks_on_path: None) -> None:
    import os

    import whole_process

    _, _, out = whole_process.run_child("rlloop", "dqn", 1100, 0, 1,
                                        core=max(os.sched_getaffinity(0)))
    assert out["cores"] == 1 and out["steady_sps"] > 0
