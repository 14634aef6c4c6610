"""The offline algorithms in the Python API: ``BC``, ``CQL`` and ``IQL`` take a dataset
(and the env it was recorded in by default), ``learn`` counts gradient updates and continues
the run, and ``save``, ``load``, ``predict`` and ``evaluate`` are every model's; bad input
answers in one line. Datasets of random play are written directly (no expert to train)."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import pytest

import rlloop
from rlloop import BC, CQL, IQL, PPO
from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.data.offline_dataset import Episode, write_minari
from rlloop.errors import ConfigError

pytest.importorskip("minari")
QUIET = {"mlflow": False, "progress": False, "save_video": False, "eval_episodes": 1}
SMALL = {"hidden": [16, 16], "batch_size": 16, "eval_interval": 10}


def _random_play(path: Path, env_id: str, episodes: int = 4) -> Path:
    env = gymnasium.make(env_id)
    env.action_space.seed(0)
    recorded = []
    for i in range(episodes):
        obs, actions, rewards, ended = [env.reset(seed=i)[0]], [], [], False
        terminated = []
        while not ended and len(actions) < 50:
            action = env.action_space.sample()
            o, r, term, trunc, _ = env.step(action)
            obs.append(o)
            actions.append(action)
            rewards.append(r)
            terminated.append(term)
            ended = term or trunc
        n = len(actions)
        recorded.append(Episode(np.stack(obs), np.stack(actions), np.array(rewards),
                                np.array(terminated), np.arange(n) == n - 1))
    env.close()
    return write_minari(path, recorded, env_id)


@pytest.fixture(scope="module")
def cartpole_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _random_play(tmp_path_factory.mktemp("api-offline") / "cartpole-random", "CartPole-v1")


def _updates(run_dir: Path) -> int:
    latest = CheckpointManager(run_dir / "checkpoints").latest()
    assert latest is not None
    return load_checkpoint(latest).components["trainer"]["counters"]["algorithm/steps"]


def test_bc_learns_continues_saves_loads_and_acts(cartpole_data, tmp_path) -> None:
    model = BC(cartpole_data, run_dir=tmp_path / "bc", seed=0, **SMALL, **QUIET)
    assert model.config.env == "CartPole-v1"  # the env the dataset was recorded in
    result = model.learn(10)
    assert result.env_steps == 0 and _updates(tmp_path / "bc") == 10
    model.learn(5)  # 5 more, a resume of the same run
    assert _updates(tmp_path / "bc") == 15
    assert model.predict(np.zeros(4, np.float32)) in (0, 1)
    assert model.predict(np.zeros((3, 4), np.float32)).shape == (3,)
    assert model.evaluate(1)["episodes"] == 1
    saved = model.save(tmp_path / "saved")
    for loaded in (rlloop.load(saved), BC.load(saved)):
        assert type(loaded) is BC and loaded.config.hparams.dataset == str(cartpole_data)
        assert loaded.predict(np.zeros(4, np.float32)) == model.predict(np.zeros(4, np.float32))
    with pytest.raises(ConfigError, match="is a bc run, not cql"):
        CQL.load(saved)
    with pytest.raises(ConfigError, match="is a bc run, not ppo"):
        PPO.load(saved)


def test_cql_learns_from_continuous_data_in_the_env_given(tmp_path) -> None:
    data = _random_play(tmp_path / "pendulum-random", "Pendulum-v1", episodes=2)
    model = CQL(str(data), "Pendulum-v1", run_dir=tmp_path / "cql", **SMALL, **QUIET)
    model.learn(4)
    assert _updates(tmp_path / "cql") == 4
    action = model.predict(np.zeros(3, np.float32))
    assert action.shape == (1,) and -2 <= float(action[0]) <= 2


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: BC(""), "BC needs a dataset"),
    (lambda d: BC(d.parent / "missing"), "does not exist; record one with `rlloop collect"),
    (lambda d: BC(d, total_gradient_steps=5), "BC(...).learn(5) trains that many gradient"),
    (lambda d: BC(d, dataset=str(d)), "BC(dataset, ...) takes the dataset first"),
    (lambda d: BC(d, "Pendulum-v1"), "has observations of shape (4,) and Discrete(2)"),
    (lambda d: IQL(d), "but CartPole-v1 has discrete ones; use bc or cql (offline)"),
    (lambda d: BC(d, lr=-1.0), "bc.lr must be > 0"),
    (lambda d: BC(d).learn(0), "total_gradient_steps must be an integer > 0, got 0"),
    (lambda d: BC(d).learn(total_timesteps=5), "total_timesteps is learn(total_gradient_steps)"),
], ids=["no-dataset", "missing", "budget-setting", "dataset-setting", "other-env", "iql-discrete",
        "bad-lr", "zero-updates", "sb3-keyword"])
def test_bad_offline_model_input_answers_in_one_line(cartpole_data, make, expected) -> None:
    with pytest.raises(ConfigError) as info:
        make(cartpole_data)
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)
