"""Videos: the end-of-run clip, ``rlloop eval --video``, and the task API's ``sample_clip``.

Each mp4 must exist, decode, and hold one frame per step of the filmed episode.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from conftest import rlloop_cmd

from rlloop.config.loading import build_config
from rlloop.runs.start import train
from rlloop.runs.video import record_run_video

imageio = pytest.importorskip("imageio.v2")
QUIET = ["mlflow=false", "progress=false", "stop_on_solve=false", "eval_every=0"]


def decoded_frames(path: Path) -> list[np.ndarray]:
    with imageio.get_reader(path, format="FFMPEG") as reader:
        return [frame for frame in reader]  # not list(reader): its len() is inf


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("video") / "run"
    config = build_config("ppo", "CartPole-v1", flags={"seed": 1},
                          sets=[*QUIET, "total_env_steps=4096"])
    assert config.save_video  # on by default
    train(config, path)
    return path


def test_a_run_saves_a_clip_of_its_best_policy(run_dir, tmp_path):
    frames = decoded_frames(run_dir / "video.mp4")
    assert frames and frames[0].shape == (400, 600, 3)
    # Filming again gives the same deterministic episode: CartPole pays 1 per step, so
    # the return is the episode's length, and there is one frame per step.
    info = record_run_video(run_dir, tmp_path / "again.mp4")
    assert info.frames == int(info.episode_return) == len(frames)
    assert len(decoded_frames(tmp_path / "again.mp4")) == info.frames


def test_cli_eval_writes_a_video(run_dir, tmp_path, cli_in_process):
    out = tmp_path / "clip.mp4"
    done = cli_in_process(["eval", str(run_dir), "--episodes", "2", "--json", "--video",
                           str(out)])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["video"] == str(out) and len(decoded_frames(out)) == result["video_frames"]


def test_gymnasium_backend_films_through_pygame(run_dir, tmp_path):
    pytest.importorskip("pygame")
    info = record_run_video(run_dir, tmp_path / "gym.mp4", backend="gymnasium")
    frames = decoded_frames(info.path)
    assert len(frames) == info.frames == int(info.episode_return)
    assert frames[0].shape == (400, 600, 3)


def test_filming_a_gymnasium_env_prints_nothing_from_sdl_or_pygame(run_dir, tmp_path, cli_env):
    # No display and no XDG_RUNTIME_DIR, as in a container or CI: SDL used to print
    # "error: XDG_RUNTIME_DIR is invalid or not set" and pygame its banner on stdout.
    pytest.importorskip("pygame")
    env = {k: v for k, v in cli_env.items()
           if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "PYGAME_HIDE_SUPPORT_PROMPT",
                        "DISPLAY", "WAYLAND_DISPLAY")}
    out = tmp_path / "gym.mp4"
    done = subprocess.run(rlloop_cmd("eval", str(run_dir), "--episodes", "1", "--json",
                                     "--backend", "gymnasium", "--video", str(out)),
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stderr and "error" not in done.stderr, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1, done.stdout  # just the JSON
    assert json.loads(done.stdout)["video_frames"] == len(decoded_frames(out))


class NoRender(gymnasium.Env):
    """An env with no rgb_array rendering at all."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 20, False, {}

    def render(self):
        return None


@pytest.mark.filterwarnings("ignore:.*render_mode.*:UserWarning")
def test_unrenderable_env_skips_the_video_with_one_warning(tmp_path, caplog):
    gymnasium.register("rlloop-test/NoRender-v0", entry_point=NoRender)
    config = build_config("ppo", "rlloop-test/NoRender-v0",
                          sets=[*QUIET, "total_env_steps=256", "num_envs=2",
                                "ppo.minibatch_size=64"])
    with caplog.at_level(logging.WARNING):
        result = train(config, tmp_path / "run")
    assert result.env_steps == 256 and not (tmp_path / "run" / "video.mp4").exists()
    skipped = [r for r in caplog.records if "video skipped" in r.getMessage()]
    assert len(skipped) == 1 and "\n" not in skipped[0].getMessage()


def test_task_sample_clip_to_mp4(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from reinforce_cartpole import ReinforceCartPole, default_config, make_policy

    task = ReinforceCartPole(default_config())
    states = task.sample_clip(make_policy(0), save_path=tmp_path / "task.mp4",
                              return_states=True)
    frames = decoded_frames(tmp_path / "task.mp4")
    assert len(frames) == len(states) and states[-1].terminated
    images = task.sample_clip(make_policy(0))
    assert tuple(images.shape) == (len(states), 400, 600, 3)  # same seed, same episode


def test_example_films_its_checkpoint_into_its_run_dir_without_training(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from reinforce_cartpole import main

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    trained = main(["--run-dir", str(run), "--workers", "2", "--epoch-samples", "256",
                    "--total-steps", "2", "--eval-episodes", "1", "--quiet"])
    metrics = (run / "metrics.jsonl").read_text()
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    filmed = main(["--run-dir", str(run), "--video"])
    assert filmed["video"] == str(run / "video.mp4") and filmed["train_steps"] == 2
    assert len(decoded_frames(run / "video.mp4")) == filmed["frames"]
    # The checkpoint's policy, on the evaluation's first episode: the same return.
    assert filmed["episode_return"] == trained["eval_return_mean"]
    # Nothing trained, nothing written outside the run directory.
    assert (run / "metrics.jsonl").read_text() == metrics
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
