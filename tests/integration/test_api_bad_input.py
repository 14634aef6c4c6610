"""Bad input to the Python API: each is one typed rlloop error naming the problem and the
fix, raised before any work, never NumPy's, pathlib's or the OS's own error (or a NaN
action)."""

from __future__ import annotations

import numpy as np
import pixel_envs
import pytest
import torch

from rlloop import PPO, SAC, Callback, load
from rlloop.errors import ConfigError, RunDirError

QUIET = {"save_video": False, "progress": False, "mlflow": False}
SMALL = {"num_envs": 2, "rollout_steps": 16, "minibatch_size": 32, "eval_every": 1,
         "eval_episodes": 1, **QUIET}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model = PPO("CartPole-v1", seed=0, run_dir=tmp_path_factory.mktemp("api") / "run",
                **SMALL)
    model.learn(32)
    yield model
    model.close()


def test_numpy_integers_are_integers_and_bools_are_not():
    """PPO(num_envs=np.int64(4)) was refused: "num_envs must be an integer, got
    np.int64(4)"."""
    model = PPO("CartPole-v1", num_envs=np.int64(4), rollout_steps=np.int32(16),
                seed=np.uint32(7), **QUIET)
    assert (model.config.num_envs, model.config.hparams.rollout_steps) == (4, 16)
    assert type(model.config.num_envs) is int and type(model.config.seed) is int
    lr = PPO("CartPole-v1", lr=np.float32(0.5), **QUIET).config.hparams.lr  # was refused
    assert lr == float(np.float32(0.5)) and type(lr) is float
    for flag in (True, np.True_, torch.tensor(True)):
        with pytest.raises(ConfigError, match="num_envs must be an integer"):
            PPO("CartPole-v1", num_envs=flag, **QUIET)


def test_learn_and_evaluate_take_numpy_integers(tmp_path):
    """learn(np.int64(n)) and evaluate(np.int64(n)) were refused as non-integers."""
    model = PPO("CartPole-v1", seed=0, run_dir=tmp_path / "run", **SMALL)
    for flag in (True, np.True_, torch.tensor(True)):
        with pytest.raises(ConfigError, match="total_env_steps must be an integer"):
            model.learn(flag)
        with pytest.raises(ConfigError, match="episodes must be an integer"):
            model.evaluate(flag)
    assert model.learn(np.int64(32)).env_steps == 32
    stats = model.evaluate(np.int64(2))
    assert stats["episodes"] == 2 and type(stats["episodes"]) is int
    model.close()


def test_a_path_argument_that_is_no_path_is_a_config_error():
    """run_dir=5, load(5) and save(5) gave pathlib's TypeError."""
    with pytest.raises(ConfigError, match=r"run_dir must be a path \(str or os\.PathLike\), "
                                          r"got 5"):
        PPO("CartPole-v1", run_dir=5, **QUIET)
    with pytest.raises(ConfigError, match=r"load\(\) path must be a path \(str or "
                                          r"os\.PathLike\), got 5"):
        load(5)
    with pytest.raises(ConfigError, match=r"save\(\) path must be a path \(str or "
                                          r"os\.PathLike\), got 5"):
        PPO("CartPole-v1", **QUIET).save(5)


def test_save_onto_a_file_is_a_run_dir_error(trained, tmp_path):
    """save() onto an existing file raised NotADirectoryError; a file as run_dir failed only
    in training."""
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    for dest in (file, file / "copy"):
        with pytest.raises(RunDirError, match=rf"{file}.* is a file.*a directory path that "
                                              r"does not exist or is empty"):
            trained.save(dest)
    with pytest.raises(RunDirError, match=rf"run_dir {file} is a file"):
        PPO("CartPole-v1", run_dir=file, **QUIET)
    assert file.read_text() == "keep me"


@pytest.mark.parametrize("obs", [["a", "b", "c", "d"], [[0, 0, 0, 0], [0, 0]],
                                 [object()] * 4])
def test_predict_names_an_observation_that_is_no_numeric_array(obs):
    """predict gave NumPy's ValueError ("could not convert string to float",
    "inhomogeneous shape")."""
    model = PPO("CartPole-v1", seed=0, **QUIET)
    with pytest.raises(ConfigError, match=r"predict expects an observation of shape \(4,\) "
                                          r"\(float32\).*got \["):
        model.predict(obs)
    model.close()


def test_predict_refuses_non_finite_observations():
    """SAC's predict on an observation holding inf returned array([nan])."""
    model = SAC("Pendulum-v1", seed=0, **QUIET)
    for obs in (np.array([np.inf, 0, 0]), np.array([[0, 0, 0], [0, np.nan, 0]])):
        with pytest.raises(ConfigError, match=r"observation holds non-finite values"):
            model.predict(obs)
    assert np.isfinite(model.predict(np.array([1.0, 0, 0]))).all()
    model.close()


def test_predict_takes_inf_that_the_saved_normaliser_clips(tmp_path):
    """A lidar's inf ("no hit") was a valid input of a normalize_obs policy: the
    normaliser clips it. NaN stays refused."""
    model = PPO("CartPole-v1", seed=0, run_dir=tmp_path / "run", normalize_obs=True,
                num_envs=2, rollout_steps=16, minibatch_size=32, **QUIET)
    model.learn(32)
    assert model.predict(np.array([np.inf, 0, 0, 0])) in (0, 1)
    with pytest.raises(ConfigError, match=r"observation holds non-finite values"):
        model.predict(np.array([np.nan, 0, 0, 0]))


def test_the_run_stays_the_models_after_a_chdir(tmp_path, monkeypatch):
    """A relative run_dir (and the default runs/...) was kept relative: after os.chdir,
    evaluate() acted with an untrained policy and learn() started a new run."""
    monkeypatch.chdir(tmp_path)
    model = PPO("CartPole-v1", seed=0, run_dir="rel/run", **SMALL)
    model.learn(32)
    assert model.run_dir == tmp_path / "rel" / "run"
    before = model.evaluate(2)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert model.evaluate(2) == before
    assert model.learn(32).env_steps == 64  # the same run, continued
    model.close()
    default = PPO("CartPole-v1", seed=0, **SMALL)
    result = default.learn(32)
    assert default.run_dir is not None and default.run_dir.is_absolute()
    assert result.run_dir == default.run_dir  # the result's path is absolute too
    default.close()


def test_paths_expand_the_home_directory(tmp_path, monkeypatch):
    """save("~/x") wrote a directory literally named '~' under the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert PPO("CartPole-v1", run_dir="~/run", **QUIET).run_dir == tmp_path / "run"
    with pytest.raises(RunDirError, match=str(tmp_path / "nothing")):
        load("~/nothing")


def test_an_exception_inside_learn_leaves_the_run_to_continue(tmp_path, monkeypatch):
    """A callback raising after the first checkpoint left model.run_dir None: the next
    learn() started a new run from zero."""
    monkeypatch.chdir(tmp_path)

    class Boom(Callback):
        def on_step(self, stats):
            if stats["env/steps"] >= 64:
                raise ValueError("boom")
            return True

    model = PPO("CartPole-v1", seed=0, checkpoint_every=1, **SMALL)
    with pytest.raises(ValueError, match="boom"):
        model.learn(128, callbacks=Boom())
    assert model.run_dir is not None and model.run_dir.parent == tmp_path / "runs"
    assert model.learn(32).env_steps > 64  # continued from its checkpoint
    model.close()
    runs = sorted((tmp_path / "runs").iterdir())
    assert runs == [model.run_dir]
    failed = PPO("CartPole-v1", seed=0, **SMALL)  # no checkpoint yet: nothing is kept
    with pytest.raises(ConfigError):
        failed.learn(32, callbacks=[object()])
    assert failed.run_dir is None and sorted((tmp_path / "runs").iterdir()) == runs


@pytest.mark.parametrize(("make", "names"), [
    (lambda: PPO("MlpPolicy", "CartPole-v1"), r"PPO\('CartPole-v1', \.\.\.\)"),
    (lambda: PPO("MlpPolicy", env="CartPole-v1"), r"PPO\('CartPole-v1', \.\.\.\)"),
    (lambda: SAC("MultiInputPolicy"), r"SAC\(env, \.\.\.\)"),
    (lambda: PPO("CartPole-v1", "Pendulum-v1"), "takes one env"),
    (lambda: PPO("CartPole-v1", policy="CnnPolicy"), "drop policy="),
    (lambda: PPO("CartPole-v1", verbose=1), "verbose is progress"),
    (lambda: PPO("CartPole-v1", tensorboard_log="tb"), "tensorboard_log is tensorboard"),
    (lambda: PPO("CartPole-v1", total_env_steps=5000), r"learn\(5000\)"),
    (lambda: PPO("CartPole-v1", **QUIET).learn(total_timesteps=10),
     r"total_timesteps is learn\(total_env_steps\)"),
    (lambda: PPO("CartPole-v1", **QUIET).learn(1000, callback=None), "callbacks="),
])
def test_stable_baselines3_spellings_name_rlloops(make, names):
    with pytest.raises(ConfigError, match=names):
        make()


def test_the_env_may_be_given_by_keyword():
    assert PPO(env="Pendulum-v1", **QUIET).config.env == "Pendulum-v1"
    assert PPO(**QUIET).config.env == "CartPole-v1"


def test_a_models_load_is_sb3s_and_checks_the_algorithm(trained):
    assert PPO.load(trained.run_dir).run_dir == trained.run_dir
    with pytest.raises(ConfigError, match="is a ppo run, not sac"):
        SAC.load(trained.run_dir)
    with pytest.raises(ConfigError, match="total_env_steps is learn"):
        load(trained.run_dir, total_env_steps=100)


def test_predict_refuses_float_frames_that_are_not_the_envs():
    """Frames scaled to [0, 1] were cast to uint8: black frames, a wrong action."""
    pixel_envs.register()
    model = PPO("rlloop-test/SidePixels-v0", **QUIET)
    frames = np.zeros((2, 36, 36, 1), np.uint8)
    frames[0, :, :18] = 200
    assert model.predict(frames).shape == (2,)
    np.testing.assert_array_equal(model.predict(frames.astype(np.float32)),
                                  model.predict(frames))  # whole numbers 0..255 are frames
    with pytest.raises(ConfigError, match=r"uint8 frames 0\.\.255.*values in \[0, 0\.78"):
        model.predict(frames.astype(np.float32) / 255)
    model.close()
