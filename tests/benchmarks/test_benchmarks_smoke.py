"""benchmarks/gpu.py keeps running where no GPU is at hand: a tiny budget on the CPU (and
benchmarks/zoo_sb3.py on 2% of a row's budget); the scripts whose result files the docs
draw figures from append rows with the fields those figures read.

rl8 is measured too when this interpreter can import it; otherwise only rlloop is.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

GPU_BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


def run_benchmark(monkeypatch: pytest.MonkeyPatch, script: Path, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script adds its own folder
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)


def run_gpu_benchmark(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    run_benchmark(monkeypatch, GPU_BENCHMARK, *args)


def test_gpu_benchmark_on_cpu(monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    run_gpu_benchmark(monkeypatch, "--device", "cpu", "--num-envs", "16", "--steps", "4",
                      "--iters", "2", "--rounds", "1", "--peak-seconds", "0.05")
    out = capsys.readouterr().out
    assert "device: CPU" in out and "matmul peak (fp32)" in out
    # library, envs, rounds, median env/s, the rounds' env/s, GFLOP/it, share of the peak
    row = re.search(r"^rlloop\s+16\s+1\s+([\d,]+)\s+[\d,]+\s+([\d.]+)\s+([\d.]+)%$", out,
                    re.MULTILINE)
    assert row is not None, out
    assert float(row[1].replace(",", "")) > 0
    assert float(row[3]) > 0
    rl8_measured = re.search(r"^rl8\s+16\s", out, re.MULTILINE) is not None
    assert rl8_measured == ("measuring rlloop only" not in out)
    assert ("16 envs: rlloop / rl8 env steps/s" in out) == rl8_measured


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="no CUDA device is visible; use --device cpu"):
        run_gpu_benchmark(monkeypatch, "--device", "cuda", "--num-envs", "16")


@pytest.mark.slow
def test_gpu_benchmark_measures_the_compiled_update(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run_gpu_benchmark(monkeypatch, "--device", "cpu", "--num-envs", "16", "--steps", "4",
                      "--iters", "1", "--rounds", "1", "--peak-seconds", "0.05", "--compile")
    out = capsys.readouterr().out
    # the compiled run (its own process) reports the eager run's FLOPs: the same maths
    rows = {m[1]: m for m in re.finditer(
        r"^(rlloop|rlloop-compiled)\s+16\s+1\s+([\d,]+)\s+[\d,]+\s+([\d.]+)\s+([\d.]+)%$", out,
        re.MULTILINE)}
    assert rows.keys() == {"rlloop", "rlloop-compiled"}, out
    assert rows["rlloop-compiled"][3] == rows["rlloop"][3]
    assert float(rows["rlloop-compiled"][4]) > 0


def test_zoo_sb3_benchmark_runs_a_row(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("stable_baselines3")
    run_benchmark(monkeypatch, GPU_BENCHMARK.with_name("zoo_sb3.py"), "MountainCar-v0/dqn",
                  "--seeds", "1", "--first-seed", "1", "--fraction", "0.02",
                  "--eval-episodes", "1")
    out = capsys.readouterr().out
    assert re.search(r"SB3 seed 1: best while training -?[\d.]+, fresh -?[\d.]+", out), out
    assert "SB3 mean over 1 seeds:" in out


def test_offpolicy_benchmark_runs_sac_on_the_threads_asked(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("stable_baselines3")
    run_benchmark(monkeypatch, GPU_BENCHMARK.with_name("offpolicy.py"), "--tasks", "sac",
                  "--sac-steps", "150", "--paths", "default", "--threads", "2",
                  "--clock", "cpu", "--eval-episodes", "2")
    out = capsys.readouterr().out
    assert "torch threads: 2" in out and "matmul peak (2 thread(s), fp32)" in out, out
    assert re.search(r"sac Pendulum-v1 seed 0: rlloop 1 env / SB3 env steps/s [\d.]+x", out), out


def test_quantile_benchmark_reports_each_task_s_ratio(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sb3_contrib")
    # TQC and CrossQ past their 100 warm-up steps, so both libraries take gradient steps
    run_benchmark(monkeypatch, GPU_BENCHMARK.with_name("quantile.py"), "--qrdqn-steps", "64",
                  "--tqc-steps", "120", "--crossq-steps", "120", "--chunk", "40")
    out = capsys.readouterr().out
    for algo, env in (("qrdqn", "CartPole-v1"), ("tqc", "Pendulum-v1"),
                      ("crossq", "Pendulum-v1")):
        assert re.search(rf"^{algo} {env}: rlloop / sb3-contrib env steps/s [\d.]+x$", out,
                         re.MULTILINE), out
        assert re.search(rf"^{algo} {env}, \d+ env steps, 1 thread\(s\)$", out,
                         re.MULTILINE), out


@pytest.mark.slow
def test_atari_learning_benchmark_reports_untrained_and_trained_returns(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ale_py")
    run_benchmark(monkeypatch, GPU_BENCHMARK.with_name("atari_learn.py"), "--steps", "1024",
                  "--episodes", "1")
    out = capsys.readouterr().out
    number = r"-?[\d.]+ ± [\d.]+"
    assert re.search(rf"ALE/Breakout-v5 ppo seed 0: 1,024 env steps in \d+ s; per-life return "
                     rf"over 1 episodes: untrained \(sampled\) {number}, trained \(sampled\) "
                     rf"{number}, trained \(greedy\) {number}", out), out


def _figure_fields(kind: str) -> frozenset[str]:
    """The fields the docs' ``benchmark-figure`` reads from a result file of ``kind``."""
    sys.path.insert(0, str(GPU_BENCHMARK.parents[1] / "docs" / "_ext"))
    try:
        from benchmark_figures import FIELDS
    finally:
        sys.path.pop(0)
    return FIELDS[kind]


def test_recurrent_benchmark_appends_the_rows_the_docs_figure_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    results = tmp_path / "recurrent.jsonl"
    for seed in ("0", "1"):  # a second sitting appends to the same file
        run_benchmark(monkeypatch, GPU_BENCHMARK.with_name("recurrent.py"), "--seeds", seed,
                      "--budget", "512", "--eval-every", "512", "--eval-episodes", "1",
                      "--only", "rlloop", "--results", str(results))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["contender"], r["seed"], r["budget"]) for r in rows] == [
        ("rlloop", 0, 512), ("rlloop", 1, 512)]
    assert all(_figure_fields("solve") <= r.keys() and r["train_sps"] > 0 for r in rows)


def test_multi_agent_benchmark_appends_a_curve_and_the_random_reference(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("pettingzoo")
    results = tmp_path / "multi_agent.jsonl"
    run_benchmark(monkeypatch, GPU_BENCHMARK.with_name("multi_agent.py"), "--seeds", "3",
                  "--budget", "512", "--eval-every", "512", "--games", "8",
                  "--results", str(results))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["contender"], r["env_steps"]) for r in rows] == [
        ("random", 0), ("ma_ppo", 0), ("ma_ppo", 512)]
    assert all(_figure_fields("curve") <= r.keys() and -1 <= r["return_mean"] <= 1
               for r in rows)
