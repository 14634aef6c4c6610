"""The Python API as a user runs it: plain scripts in subprocesses, real run directories, a
real MLflow store, the CLI reading what the API wrote and the other way round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from conftest import rlloop_cmd
from torch import Tensor

from rlloop import DQN, PPO, Callback, load
from rlloop.api import _register_again
from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.envs.core import StepResult, VecEnv
from rlloop.envs.registry import make_env
from rlloop.envs.wrappers import NormalizeObservation
from rlloop.errors import ConfigError, EnvError, RunDirError
from rlloop.runners.evaluation import evaluate
from rlloop.runs.build import COMPONENTS, build_algorithm
from rlloop.runs.saved import acting_config, policy_checkpoint
from rlloop.runs.session import solve_threshold
from rlloop.trainers.callbacks import load_callback

QUIET = {"save_video": False, "progress": False, "mlflow": False}

SCRIPT = """\
import numpy as np
from rlloop import PPO
model = PPO("CartPole-v1", seed=0, run_dir="run", save_video=False)
model.learn(4096)
print(model.predict(np.zeros(4, np.float32)))
"""


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=240)


def test_plain_script_without_main_guard_writes_a_cli_run(tmp_path, cli_env, cli_in_process):
    (tmp_path / "train.py").write_text(SCRIPT)
    out = _run([sys.executable, "train.py"], cli_env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] in ("0", "1")
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "run.json", "mlflow.db", "report.md"):
        assert (run / name).is_file(), name
    latest = CheckpointManager(run / "checkpoints").latest()
    assert latest is not None and load_checkpoint(latest).metadata["env_steps"] == 4096

    from mlflow.tracking import MlflowClient

    run_id = json.loads((run / "run.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.params["algo"] == "ppo"
    assert max(m.value for m in client.get_metric_history(run_id, "env/steps")) == 4096

    # The CLI evaluates the API's run as its own, with the same numbers as the API.
    ev = cli_in_process(["eval", str(run), "--episodes", "4", "--json"])
    assert ev.returncode == 0, ev.stderr
    cli = json.loads(ev.stdout.strip().splitlines()[-1])
    assert load(run).evaluate(4)["return_mean"] == pytest.approx(cli["return_mean"])
    assert load(run).evaluate(4)["episodes"] == cli["episodes"] == 4
    assert isinstance(load(run).evaluate(1)["episodes"], int)


class _RecordRaw:
    """A VecEnv that remembers the raw observations it returns."""

    def __init__(self, env: VecEnv) -> None:
        self.env, self.num_envs, self.spec = env, env.num_envs, env.spec
        self.seen: list[Tensor] = []

    def reset(self, seed: int | None = None) -> Tensor:
        obs = self.env.reset(seed=seed)
        self.seen.append(obs.clone())
        return obs

    def step(self, actions: Tensor) -> StepResult:
        res = self.env.step(actions)
        self.seen.append(res.obs.clone())
        return res

    def close(self) -> None:
        self.env.close()


def test_predict_equals_eval_actions_of_the_same_checkpoint(tmp_path):
    model = PPO("CartPole-v1", seed=1, run_dir=tmp_path / "run", normalize_obs=True, **QUIET)
    model.learn(2048)
    # What `rlloop eval` does: the acting config, the policy checkpoint, evaluate() on an
    # env behind the shared observation normaliser.
    algo = build_algorithm(acting_config(model.config))
    state = load_checkpoint(policy_checkpoint(tmp_path / "run"),
                            expected_components=COMPONENTS).components["algorithm"]
    algo.set_policy_state(state)
    assert algo.obs_stats is not None and algo.obs_stats.count > 1  # it normalises for real
    raw = _RecordRaw(make_env("CartPole-v1", 4, seed=7))
    actions: list[Tensor] = []

    def act(obs: Tensor) -> Tensor:
        actions.append(algo.act(obs, deterministic=True))
        return actions[-1]

    evaluate(act, NormalizeObservation(raw, algo.obs_stats, update=False), 4)
    algo.close()
    loaded = load(tmp_path / "run")
    for obs, taken in zip(raw.seen, actions, strict=False):
        np.testing.assert_array_equal(loaded.predict(obs.numpy()), taken.numpy())
    one = loaded.predict(raw.seen[0][0].numpy())
    assert one.shape == () and one == actions[0][0].item()
    with pytest.raises(ConfigError, match=r"shape \(4,\)"):
        loaded.predict(np.zeros(3))


class _StopAt(Callback):
    def __init__(self, steps: int) -> None:
        self.steps, self.checkpoints, self.evals, self.result = steps, [], 0, None

    def on_step(self, stats):
        return stats["env/steps"] < self.steps

    def on_eval(self, stats):
        self.evals += 1

    def on_checkpoint(self, path):
        self.checkpoints.append(path)

    def on_train_end(self, result):
        self.result = result


def test_callback_stops_training_and_sees_checkpoints(tmp_path):
    model = PPO("CartPole-v1", seed=0, run_dir=tmp_path / "run", eval_every=1,
                stop_on_solve=False, **QUIET)
    stop = _StopAt(1024)
    result = model.learn(100_000, callbacks=[stop])
    assert result.env_steps == 1024 and result.stopped_by == "callback _StopAt"
    assert stop.result is result and stop.evals >= 2
    assert stop.checkpoints and stop.checkpoints[-1] == CheckpointManager(
        tmp_path / "run" / "checkpoints").latest()
    # learn again: the same run continues from its checkpoint for that many more steps
    assert model.learn(1024).env_steps == 2048
    # off-policy runs (the off-policy cadence) stop on the same rule
    dqn = DQN("CartPole-v1", run_dir=tmp_path / "dqn", num_envs=4, **QUIET)
    result = dqn.learn(100_000, callbacks=[_StopAt(400)])
    assert result.env_steps == 400 and result.stopped_by == "callback _StopAt"


class _StopOnEval(Callback):
    def __init__(self) -> None:
        self.evals: list[dict] = []

    def on_eval(self, stats):
        self.evals.append(dict(stats))
        return False


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_callback_stops_training_from_on_eval(tmp_path, algo):
    cls, cadence = (PPO, {"eval_every": 1}) if algo == "ppo" else (DQN, {"num_envs": 4})
    model = cls("CartPole-v1", seed=0, run_dir=tmp_path / "run", stop_on_solve=False,
                **cadence, **QUIET)
    stop = _StopOnEval()
    result = model.learn(20_000, callbacks=[stop])
    assert result.stopped_by == "callback _StopOnEval"
    assert len(stop.evals) == 1 and result.env_steps < 20_000


def _train_quietly(cli_in_process, steps: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``rlloop train ppo`` into ``./run`` for ``steps`` env steps, quiet, without MLflow or
    video, with ``args`` added."""
    return cli_in_process(["train", "ppo", "--run-dir", "run", "--total-env-steps", steps,
                           "--quiet", "--set", "mlflow=false", "--set", "save_video=false",
                           *args])


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    """Commands run from ``tmp_path``, where --callback finds the test's modules; the
    modules they import are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    yield
    for name in ("stopper", "boom"):
        sys.modules.pop(name, None)


@pytest.mark.usefixtures("in_tmp_path")
def test_cli_callback_flag(tmp_path, cli_in_process):
    (tmp_path / "stopper.py").write_text(
        "from rlloop import Callback\n"
        "class Stop(Callback):\n"
        "    def on_step(self, stats):\n"
        "        return stats['env/steps'] < 1024\n")
    out = _train_quietly(cli_in_process, "100000", "--set", "stop_on_solve=false",
                         "--callback", "stopper:Stop")
    assert out.returncode == 0, out.stderr
    assert "callback Stop" in out.stdout
    bad = cli_in_process(["train", "ppo", "--callback", "nosuchmodule:Stop"])
    assert bad.returncode == 2 and "no module named 'nosuchmodule'" in bad.stderr


@pytest.mark.usefixtures("in_tmp_path")
def test_a_callback_raising_in_training_is_named_by_the_cli(tmp_path, cli_in_process,
                                                           monkeypatch):
    """It read "(unexpected; ...)": as if rlloop had failed, naming no callback."""
    monkeypatch.delenv("RLLOOP_TRACEBACK", raising=False)
    (tmp_path / "boom.py").write_text(
        "from rlloop import Callback\n"
        "class Boom(Callback):\n"
        "    def on_step(self, stats):\n"
        "        raise ValueError('my bug')\n")
    out = _train_quietly(cli_in_process, "4096", "--callback", "boom:Boom")
    assert out.returncode == 1, out.stderr
    assert "ValueError: my bug (in callback Boom.on_step;" in out.stderr, out.stderr
    assert "unexpected" not in out.stderr
    assert CheckpointManager(tmp_path / "run" / "checkpoints").latest() is not None


@pytest.mark.parametrize(("source", "message"), [
    ("def broken(:\n", r"importing 'cbbad' raised SyntaxError: .*; fix the module"),
    ("raise RuntimeError('explodes')\n",
     r"importing 'cbbad' raised RuntimeError: explodes; fix the module"),
    ("import no_such_dependency_xyz\n",
     r"importing 'cbbad' failed \(No module named 'no_such_dependency_xyz'\); install what "
     r"it needs"),
    ("from rlloop import Callback\nclass C(Callback):\n    def __init__(self):\n"
     "        raise ValueError('bad init')\n", r"C\(\) raised ValueError: bad init; fix the class"),
])
def test_a_callback_module_that_fails_is_one_config_error(tmp_path, monkeypatch, source,
                                                           message):
    """A module with a SyntaxError, raising at import or in its class's constructor was a
    raw error (exit 1, "unexpected"); one whose own import fails was told to put the
    module on PYTHONPATH, which it was."""
    (tmp_path / "cbbad.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cbbad", raising=False)
    with pytest.raises(ConfigError, match=message):
        load_callback("cbbad:C")


class _NumpyStop(Callback):
    """Answers with numpy's bool, as `stats[...] < n` on numpy values does."""

    def on_step(self, stats):
        return np.float64(stats["env/steps"]) < 1024


def test_a_numpy_false_from_a_callback_stops_training(tmp_path):
    """Only the Python `False` stopped a run: numpy's was taken as "go on"."""
    model = PPO("CartPole-v1", run_dir=tmp_path / "run", stop_on_solve=False, **QUIET)
    result = model.learn(8192, callbacks=[_NumpyStop()])
    assert result.stopped_by == "callback _NumpyStop" and result.env_steps < 8192


def test_a_callback_class_that_needs_arguments_is_one_config_error(tmp_path, monkeypatch):
    """It was a raw TypeError, exit 1."""
    (tmp_path / "cbargs.py").write_text("from rlloop import Callback\n"
                                        "class Needs(Callback):\n"
                                        "    def __init__(self, n):\n"
                                        "        self.n = n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"Needs\(\) cannot be made without arguments"):
        load_callback("cbargs:Needs")


def test_factory_and_instance_envs_train(tmp_path, cli_env):
    def cartpole() -> gymnasium.Env:
        return gymnasium.make("CartPole-v1")

    model = PPO(cartpole, seed=0, run_dir=tmp_path / "run", num_envs=4,
                minibatch_size=64, **QUIET)
    # The factory's env keeps its solve threshold, as an instance's does (it was lost).
    assert solve_threshold(model.config) == 475.0
    assert model.learn(1024).env_steps == 1024
    assert model.predict(np.zeros((2, 4))).shape == (2,)
    instance = PPO(gymnasium.make("CartPole-v1"), run_dir=tmp_path / "inst", num_envs=2,
                   minibatch_size=64, **QUIET)
    assert instance.learn(256).env_steps == 256
    # Another process has no such env registered: the error says how to load it.
    ev = _run(rlloop_cmd("eval", str(tmp_path / "run"), "--episodes", "1"), cli_env, tmp_path)
    assert ev.returncode == 2 and "rlloop.load(run, env=" in ev.stderr
    script = ("import gymnasium, rlloop, sys\n"
              "m = rlloop.load(sys.argv[1], env=lambda: gymnasium.make('CartPole-v1'))\n"
              "print(m.evaluate(2)['episodes'])\n")
    out = _run([sys.executable, "-c", script, str(tmp_path / "run")], cli_env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"  # an int, as `rlloop eval --json` gives it


def test_loading_an_instance_run_registers_its_env_once(tmp_path, monkeypatch):
    """In a fresh process the instance's generated id is the saved one: load(run,
    env=instance) registered it twice ("Overriding environment ... already in registry")."""
    import itertools
    import warnings

    from rlloop.envs import objects

    class ProbeOnceEnv(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1, 1, (2,))
        action_space = gymnasium.spaces.Discrete(2)

    monkeypatch.setattr(objects, "_counter", itertools.count(1))  # as in a fresh process
    saved = "ProbeOnceEnv-rlloop1-v0"
    (tmp_path / "config.yaml").write_text(f"algo: ppo\nenv: {saved}\n")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _register_again(tmp_path, ProbeOnceEnv())
        assert saved in gymnasium.registry
        assert not [w for w in caught if "Overriding" in str(w.message)]
    finally:
        gymnasium.registry.pop(saved, None)


def test_settings_are_checked_and_untrusted_runs_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"lrr.*valid ppo settings: .*lr"):
        PPO("CartPole-v1", lrr=1e-3)
    assert PPO("CartPole-v1", lr=1e-4, num_envs=2).config.hparams.lr == 1e-4
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv: 'evil_payload:Evil-v0'\n")
    with pytest.raises(EnvError, match="allow_import=True"):
        load(run)


def test_bad_arguments_are_refused_before_training(tmp_path):
    """A model on a directory that holds a run trained that run with its own settings
    (these were dropped); callbacks and episode counts were not checked."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv: CartPole-v1\n")
    with pytest.raises(RunDirError, match=r"already holds a run; continue it with rlloop.load"):
        PPO("Acrobot-v1", run_dir=run, lr=1e-3)
    model = PPO("CartPole-v1", run_dir=tmp_path / "new", **QUIET)
    for bad in ([lambda stats: False], "stop", 3):
        with pytest.raises(ConfigError, match=r"callbacks must be rlloop\.Callback instances"):
            model.learn(256, callbacks=bad)
    for episodes in (0, -1, 2.5, "3", True):
        with pytest.raises(ConfigError, match=r"episodes must be an integer in 1\.\."):
            model.evaluate(episodes)
    assert not (tmp_path / "new").exists()  # nothing trained

    class Stop(Callback):
        def on_step(self, stats):
            return False

    assert model.learn(10_000, callbacks=Stop()).stopped_by == "callback Stop"  # one, alone


def test_save_then_load_resumes(tmp_path):
    model = PPO("CartPole-v1", seed=0, run_dir=tmp_path / "run", **QUIET)
    model.learn(1024)
    model.save(tmp_path / "copy")
    with pytest.raises(Exception, match="not empty"):
        model.save(tmp_path / "copy")
    with pytest.raises(ConfigError, match="a resumed run cannot change seed"):
        load(tmp_path / "copy", seed=3)  # refused here, not by a later learn()
    copy = load(tmp_path / "copy", device="cpu")
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_array_equal(copy.predict(obs), model.predict(obs))
    assert copy.learn(512).env_steps == 1536


def test_import_rlloop_stays_light(cli_env, tmp_path):
    code = "import sys, rlloop; print(rlloop.__version__, 'torch' in sys.modules)"
    out = _run([sys.executable, "-c", code], cli_env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"


def test_predict_takes_the_envs_own_discrete_observations():
    """FrozenLake's observation is an index; predict refused it ("expects shape (16,)")."""
    model = PPO("FrozenLake-v1", seed=0, **QUIET)
    obs, _ = gymnasium.make("FrozenLake-v1").reset(seed=0)
    one_hot = np.eye(16, dtype=np.float32)
    assert model.predict(obs) == model.predict(one_hot[obs])
    np.testing.assert_array_equal(model.predict(np.array([0, 5, 15])),
                                  model.predict(one_hot[[0, 5, 15]]))
    with pytest.raises(EnvError, match=r"indices in Discrete\(16\)"):
        model.predict(16)


def test_recurrent_predict_starts_memory_afresh_where_an_episode_starts():
    """predict carried an LSTM's memory across unrelated calls, with no way to reset it."""
    model = PPO("CartPole-v1", recurrent="lstm", seed=0, **QUIET)
    obs = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)

    def episode() -> tuple[list[int], np.ndarray]:
        actions = [int(model.predict(o, episode_start=i == 0)) for i, o in enumerate(obs)]
        return actions, model._acting()._act_state.clone().numpy()

    (a1, s1), (a2, s2) = episode(), episode()
    assert a1 == a2
    np.testing.assert_array_equal(s1, s2)  # not the first episode's memory carried on


class _Offset(gymnasium.Env):  # type: ignore[type-arg]
    """Actions with a ``start`` offset: Discrete(3, start=-1), or MultiDiscrete."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, multi: bool = False) -> None:
        self.action_space = (gymnasium.spaces.MultiDiscrete([2, 5], start=[1, -2]) if multi
                             else gymnasium.spaces.Discrete(3, start=-1))

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):  # type: ignore[no-untyped-def]
        assert self.action_space.contains(action), action
        return np.zeros(2, np.float32), 0.0, False, True, {}


@pytest.mark.parametrize("multi", [False, True])
def test_predict_gives_actions_as_the_env_takes_them(multi):
    """predict returned indices from 0 where the action space starts elsewhere (as
    ``Discrete(3, start=-1)``): actions the env rejects or that mean another action."""
    model = PPO(lambda: _Offset(multi), seed=0, **QUIET)
    space = _Offset(multi).action_space
    one = model.predict(np.zeros(2, np.float32))
    batch = model.predict(np.zeros((5, 2), np.float32))
    assert space.contains(one) if multi else space.contains(int(one))
    assert all(space.contains(a) if multi else space.contains(int(a)) for a in batch)
    # the same action the env is stepped with: the policy's index shifted by start
    policy = model._acting()
    index = policy.act(torch.zeros(1, 2), True).numpy()[0]
    np.testing.assert_array_equal(one, index + space.start)


def test_predict_names_a_dict_entry_of_the_wrong_shape():
    """A wrong Dict entry gave numpy's concatenation error, or a negative Discrete index
    wrapped round to the last one-hot position."""
    from dict_envs import DictCue

    model = PPO(DictCue, seed=0, **QUIET)
    obs, _ = DictCue().reset(seed=0)
    assert model.predict(obs).shape == ()
    with pytest.raises(EnvError, match=r"entry 'cue' has shape \(5,\); .* takes \(3,\) for one "):
        model.predict({**obs, "cue": np.zeros(5, np.float32)})
    with pytest.raises(EnvError, match=r"entry 'pixels' has shape \(2,\)"):
        model.predict({**obs, "pixels": np.zeros(2, np.uint8)})
    with pytest.raises(EnvError, match=r"entry 'cue' has shape \(2, 3\)"):  # B of 2 and 3
        model.predict({"cue": np.zeros((2, 3), np.float32), "pixels": np.zeros((3, 2, 2))})
    with pytest.raises(ConfigError, match=r"episode_start must be one bool or one per "
                                          r"observation \(2\), got shape \(3,\)"):
        model.predict({k: np.stack([v, v]) for k, v in obs.items()},
                      episode_start=[True, False, True])
    with pytest.raises(ConfigError, match=r"not a list of dicts: stack each entry"):
        model.predict([obs, obs])


def test_a_dict_image_entry_is_scaled_once_under_normalize_obs():
    """Standardised observations had their image entries divided by 255 again, which
    all but erased them from the policy's input."""
    from dict_envs import DictCue

    from rlloop.modules.encoders import DictEncoder

    for normalize, image_scale in ((False, 1 / 255), (True, 1.0)):
        model = PPO(DictCue, seed=0, normalize_obs=normalize, **QUIET)
        encoder = model._acting().policy.encoder
        assert isinstance(encoder, DictEncoder)
        assert encoder.scales == [1.0, image_scale]  # cue, pixels


def test_an_exported_policy_numbers_actions_as_the_env_does(tmp_path):
    """The export gave indices from 0 for a ``start``-offset action space, unlike eval
    and predict."""
    from rlloop.cli.export import export_run

    if "rlloop-test/OffsetActions-v0" not in gymnasium.registry:
        gymnasium.register("rlloop-test/OffsetActions-v0", entry_point=_Offset,
                           max_episode_steps=4)
    model = PPO("rlloop-test/OffsetActions-v0", seed=0, run_dir=tmp_path / "run", num_envs=2,
                rollout_steps=8, minibatch_size=16, eval_every=1, eval_episodes=1, **QUIET)
    model.learn(16)
    policy = torch.jit.load(str(export_run(tmp_path / "run", "torchscript")))
    obs = np.random.default_rng(0).uniform(-1, 1, (6, 2)).astype(np.float32)
    exported = policy(torch.as_tensor(obs)).numpy()
    np.testing.assert_array_equal(exported, model.predict(obs))
    assert set(exported.tolist()) <= {-1, 0, 1}


def test_the_constructor_refuses_an_action_space_the_algorithm_cannot_act_in():
    """TD3("CartPole-v1") was accepted; the error came only at learn() or predict()."""
    from rlloop import TD3

    with pytest.raises(ConfigError, match=r"td3 needs continuous \(Box\) actions but "
                                          r"CartPole-v1 has discrete ones; use ppo, a2c or dqn"):
        TD3("CartPole-v1")


def test_predict_names_the_action_mask_in_a_shape_error():
    """A masked env's policy wanted (obs + mask) values; the error named only a shape."""
    import mask_envs

    model = DQN("rlloop-test/MaskedChoice-v0", **QUIET)
    n = mask_envs.N_ACTIONS
    with pytest.raises(ConfigError, match=rf"\({n} observation values, then the {n} 0/1 "
                                          r"entries of the env's action mask: append "
                                          r"info\['action_mask'\]\)"):
        model.predict(np.zeros(n, dtype=np.float32))
    model.close()
