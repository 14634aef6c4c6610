"""The end of a run, made cheap: figures drawn in a matplotlib child the CLI starts ahead
(falling back to this process when it fails), video frames streamed into ffmpeg as they are
rendered, and a batched native evaluation."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from rlloop.config.loading import build_config
from rlloop.logging.process_sink import discard_spares, has_spare, prestart
from rlloop.runs.build import build_algorithm
from rlloop.runs.report import FIGURE_PRELOAD
from rlloop.runs.saved import acting_config
from rlloop.runs.start import train
from rlloop.runs.video import EpisodeFrames
from rlloop.trainers.callbacks import Callback

QUIET = ["mlflow=false", "progress=false", "stop_on_solve=false", "save_video=false",
         "eval_every=0", "total_env_steps=512"]
FIGURES = ["learning_curves.png", "losses.png", "diagnostics.png", "throughput.png"]


def test_cli_run_draws_its_figures_in_the_child(tmp_path: Path, cli_env: dict[str, str]) -> None:
    code = """
import json, sys
from rlloop.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "matplotlib": "matplotlib" in sys.modules}))
"""
    args = ["train", "ppo", "--run-dir", "run", "--quiet", *(f"--set={s}" for s in QUIET)]
    out = subprocess.run([sys.executable, "-c", code, *args], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 0, "matplotlib": False}
    report = (tmp_path / "run" / "report.md").read_text()
    for name in FIGURES:
        assert (tmp_path / "run" / name).stat().st_size > 1000 and f"]({name})" in report


class _KillFigureChild(Callback):
    """Kills the figure child on the first step: a real process dying mid-run."""

    def on_step(self, stats: dict[str, float]) -> None:
        for child in psutil.Process().children():
            if "matplotlib.figure" in " ".join(child.cmdline()):
                child.kill()


def test_a_dead_figure_child_leaves_the_figures_to_this_process(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prestart(FIGURE_PRELOAD)
    try:
        assert has_spare(FIGURE_PRELOAD)
        config = build_config("ppo", "CartPole-v1", sets=QUIET)
        with caplog.at_level(logging.WARNING):
            train(config, tmp_path / "run", callbacks=[_KillFigureChild()])
    finally:
        discard_spares()
    assert any("drawing them in this process" in r.getMessage() for r in caplog.records)
    report = (tmp_path / "run" / "report.md").read_text()
    for name in FIGURES:
        assert (tmp_path / "run" / name).stat().st_size > 1000 and f"]({name})" in report


def test_video_frames_are_rendered_as_the_encoder_pulls_them() -> None:
    from rlloop.envs.registry import make_env

    env = make_env("CartPole-v1", 1)
    steps = []

    def act(obs):  # counts the env steps taken so far
        steps.append(1)
        return (obs[:, 2] > 0).long()

    episode = EpisodeFrames(act, env, env.render_rgb, seed=0)
    frames = iter(episode)
    first = next(frames)
    assert first.shape == (400, 600, 3) and not steps  # nothing stepped ahead of the encoder
    next(frames)
    assert len(steps) == 1
    rest = sum(1 for _ in frames)
    assert 2 + rest == episode.episode_return  # one frame per step of the whole episode


def test_native_evaluation_steps_one_env_per_episode() -> None:
    config = build_config("ppo", "CartPole-v1", sets=QUIET)
    algorithm = build_algorithm(acting_config(config))
    try:
        result = algorithm.evaluate(100)
        assert result["episodes"] == 100
        # 100 envs, one episode each: one episode's sequential steps, not four.
        assert [env.num_envs for env in algorithm._eval_envs.values()] == [100]
    finally:
        algorithm.close()


@pytest.mark.parametrize("thread", [False, True])
def test_a_sink_child_exits_without_module_teardown(tmp_path: Path, thread: bool) -> None:
    from exit_sinks import MarkerSink

    from rlloop.logging.process_sink import ProcessSink

    sink = ProcessSink(MarkerSink, folder=str(tmp_path), thread=thread)
    sink.log_metrics({"a": 1.0}, 1)
    sink.close()
    assert (tmp_path / "atexit").exists()  # exit handlers run (MLflow's among them)
    # Module teardown (over a second with MLflow loaded) is skipped, unless a non-daemon
    # thread is still running: then the normal exit waits for it.
    assert (tmp_path / "teardown").exists() == thread
    assert (tmp_path / "thread").exists() == thread
