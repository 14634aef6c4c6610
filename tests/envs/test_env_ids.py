"""Env ids: provider packages imported on demand, ``module:Id`` ids, one-line errors.

An id read from a run directory must never import a module of its choosing: only the
ids a user types (``rlloop train --env``) may, and only from a fixed list of known
provider packages otherwise.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import rlloop_cmd

from rlloop.config.loading import build_config
from rlloop.envs.ids import resolve_env_id
from rlloop.errors import EnvError
from rlloop.runs.run_dir import claim_default_run_dir, default_run_dir

MODULE = """
import gymnasium
from pathlib import Path

Path("{marker}").write_text("imported")
gymnasium.register(id="{env}", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                   max_episode_steps=50)
"""


def _write_module(directory, name, env, marker):
    (directory / f"{name}.py").write_text(MODULE.format(marker=marker, env=env))


def test_module_id_is_imported_only_when_allowed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # undo the import path change
    marker = tmp_path / "imported.txt"
    _write_module(tmp_path, "rlloop_test_envmod", "RlloopTestCart-v0", marker)
    env_id = "rlloop_test_envmod:RlloopTestCart-v0"

    # As when loading a run: its config names the module, the user did not type it.
    with pytest.raises(EnvError, match="imports a module named in an env id only when"):
        resolve_env_id(env_id)
    assert not marker.exists() and "rlloop_test_envmod" not in sys.modules
    assert str(tmp_path) not in sys.path

    # A run's id the user consented to import: the working directory is not searched.
    with pytest.raises(EnvError, match="no module named 'rlloop_test_envmod'"):
        resolve_env_id(env_id, allow_import=True)
    assert not marker.exists() and str(tmp_path) not in sys.path

    # Typed by the user: found in the working directory, as `python -m` would.
    assert resolve_env_id(env_id, allow_import=True, search_cwd=True) == env_id
    assert marker.exists()
    assert resolve_env_id(env_id) == env_id  # imported now: no new code runs


def _train_as_console_script(cwd: Path, cli_env: dict[str, str],
                             *args: str) -> subprocess.CompletedProcess[str]:
    """A short PPO run with -P: no working directory on sys.path, exactly like the
    `rlloop` console script."""
    cmd = [sys.executable, "-P", *rlloop_cmd("train", "ppo")[1:], *args,
           "--total-env-steps", "512", "--quiet", "--set", "mlflow=false",
           "--set", "save_video=false", "--set", "stop_on_solve=false"]
    return subprocess.run(cmd, cwd=cwd, env=cli_env, capture_output=True, text=True,
                          timeout=240)


def test_console_script_finds_a_module_in_the_working_directory(tmp_path, cli_env):
    _write_module(tmp_path, "myenvs", "MyCart-v0", tmp_path / "imported.txt")
    out = _train_as_console_script(tmp_path, cli_env, "--env", "myenvs:MyCart-v0")
    assert out.returncode == 0, out.stderr
    (run,) = (tmp_path / "runs").iterdir()  # one directory, not nested by the id
    assert run.name.startswith("ppo-myenvs-MyCart-v0-") and (run / "summary.json").is_file()
    # eval (and resume, export) with consent find it where train did (they did not).
    cmd = [sys.executable, "-P", *rlloop_cmd("eval", str(run), "--episodes", "1",
                                             "--allow-import")[1:]]
    out = subprocess.run(cmd, cwd=tmp_path, env=cli_env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr


def test_run_dir_is_one_component_for_any_id():
    path = default_run_dir(build_config("dqn", "ale_py:ALE/Pong-v5"))
    assert path.parent.name == "runs" and path.name.startswith("dqn-ale_py-ALE-Pong-v5-")


def _resolve_in_fresh_process(env_id, cli_env):
    code = ("import sys; from rlloop.envs.registry import env_spec, resolve_env_id; "
            f"print(resolve_env_id({env_id!r})); print(env_spec({env_id!r}).action_space)")
    out = subprocess.run([sys.executable, "-c", code], env=cli_env, capture_output=True,
                         text=True, timeout=120)
    return out


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs ale-py")
def test_ale_ids_import_ale_py_on_demand(cli_env):
    out = _resolve_in_fresh_process("ALE/Pong-v5", cli_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == ["ale_py:ALE/Pong-v5", "Discrete(n=6)"]


@pytest.mark.skipif(importlib.util.find_spec("minigrid") is None, reason="needs minigrid")
def test_minigrid_ids_import_minigrid_on_demand(cli_env):
    out = _resolve_in_fresh_process("MiniGrid-Empty-5x5-v0", cli_env)
    # Found; MiniGrid's mission text is then left out with one line of notice.
    assert out.returncode == 0 and "unknown env id" not in out.stderr
    assert "leaving out observation 'mission'" in out.stderr


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    """Two seeds launched together used to get one default directory; the second failed on
    the first one's lock."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20260101-000000")
    config = build_config("ppo", "CartPole-v1")
    paths = [claim_default_run_dir(config) for _ in range(3)]
    assert [p.name for p in paths] == ["ppo-CartPole-v1-20260101-000000",
                                       "ppo-CartPole-v1-20260101-000000-2",
                                       "ppo-CartPole-v1-20260101-000000-3"]
    assert all(p.is_dir() for p in paths)


@pytest.mark.parametrize(("message", "expected"), [
    ('Box2D is not installed, you can install it by run `pip install swig` followed by '
     '`pip install "gymnasium[box2d]"`', "needs Box2D, which is not installed: pip install "
                                          "'rlloop[box2d]'"),
    ('MuJoCo is not installed, run `pip install "gymnasium[mujoco]"`',
     "needs MuJoCo, which is not installed: pip install 'rlloop[mujoco]'"),
    ('opencv-python package not installed, run `pip install "gymnasium[other]"`',
     "needs OpenCV, which is not installed: pip install 'rlloop[atari]'"),
])
def test_a_missing_extra_names_rlloops_own_install(message, expected):
    """Gymnasium's advice (swig builds, gymnasium[...] extras) contradicted the README."""
    import gymnasium

    from rlloop.envs.gym_spec import _dependency_error

    error = _dependency_error("X-v0", gymnasium.error.DependencyNotInstalled(message))
    assert str(error) == f"X-v0 {expected}"


def test_the_v4_atari_ids_come_from_ale_py():
    pytest.importorskip("ale_py")
    assert resolve_env_id("BreakoutNoFrameskip-v4") == "ale_py:BreakoutNoFrameskip-v4"


def test_a_word_containing_ale_is_not_taken_for_ale_py():
    import gymnasium

    from rlloop.envs.gym_spec import _dependency_error

    message = "scalene is not installed, run `pip install scalene`"
    error = _dependency_error("X-v0", gymnasium.error.DependencyNotInstalled(message))
    assert "rlloop[" not in str(error) and "scalene" in str(error)


def test_a_missing_package_with_no_extra_keeps_gymnasiums_advice():
    """CarRacing without pygame named Box2D's extra (its message mentions gymnasium[box2d]),
    which does not install pygame."""
    import gymnasium

    from rlloop.envs.gym_spec import _dependency_error

    message = 'pygame is not installed, run `pip install "gymnasium[box2d]"`'
    error = _dependency_error("CarRacing-v3", gymnasium.error.DependencyNotInstalled(message))
    assert str(error) == f"CarRacing-v3 needs a package that is not installed: {message}"


def test_an_env_module_named_in_the_users_config_file_is_imported(tmp_path, cli_env):
    """`rlloop train ppo --config best.yaml` (what `rlloop tune` suggests) failed when the
    file's env was module:Id: only --env's module was imported."""
    _write_module(tmp_path, "cfgenvs", "CfgCart-v0", tmp_path / "imported.txt")
    (tmp_path / "best.yaml").write_text("env: cfgenvs:CfgCart-v0\n")
    out = _train_as_console_script(tmp_path, cli_env, "--config", "best.yaml")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "imported.txt").exists()
