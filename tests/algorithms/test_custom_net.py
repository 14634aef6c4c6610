"""Custom networks: ``policy=`` in the Python API and ``--set ppo.net=module:Class`` on the
CLI. rlloop puts its heads on the user's bodies; a bad class path is one line and exit
2; a saved run names its network and loads again, importing that module only with
--allow-import."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import rlloop_cmd
from custom_nets import TinyEncoder
from torch import Tensor

from rlloop import PPO, SAC, load
from rlloop.config.loading import build_config
from rlloop.envs.core import Box, Discrete
from rlloop.errors import ConfigError
from rlloop.modules.actor_critic import ActorCritic
from rlloop.runs.build import build_algorithm
from rlloop.runs.start import train

QUIET = {"save_video": False, "progress": False, "mlflow": False}
NETS = Path(__file__).parents[1] / "custom_nets.py"


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rlloop_cmd(*args), env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=240)


def test_user_bodies_get_rlloop_heads_for_the_action_space():
    discrete = ActorCritic((4,), Discrete(3), features=TinyEncoder)
    assert isinstance(discrete.actor[0], TinyEncoder) and isinstance(discrete.critic[0],
                                                                     TinyEncoder)
    assert discrete.actor[0] is not discrete.critic[0]  # separate bodies, as the MLPs
    assert discrete.actor[-1].out_features == 3 and discrete.critic[-1].out_features == 1
    obs = torch.randn(5, 4)
    assert discrete.act(obs)[0].shape == (5,) and discrete.value(obs).shape == (5,)
    box = ActorCritic((2, 3), Box((-1.0,) * 2, (1.0,) * 2, (2,)), features=TinyEncoder,
                      sde=(True, False))
    assert box.sde is not None and box.sde.latent_dim == 64  # gSDE acts on its features
    assert box.act(torch.randn(5, 2, 3))[0].shape == (5, 2)  # it sees unflattened obs


@pytest.mark.parametrize("net,match", [
    ("justaname", r"ppo\.net must name a network as module:Class"),
    ("custom_nets:Missing", r"module 'custom_nets' has no 'Missing'"),
    ("custom_nets:NoFeaturesDim", r"NoFeaturesDim must set features_dim"),
    # A run whose network lived in the training script, evaluated from the CLI
    ("__main__:Encoder", r"the network was defined in the script that trained the run.*"
                         r"rlloop\.load\(run\).*ppo\.net=module:Encoder"),
    # Networks that do not fit: they failed inside the first rollout with torch's shape
    # error (exit 1); a zero batch at build refuses them
    ("custom_nets:WrongDim", r"network WrongDim sets features_dim=16 but makes features of "
                             r"shape \(2, 32\).*set features_dim to what it makes"),
    ("custom_nets:WrongInput", r"network WrongInput failed on observations of shape \[B, 4\] "
                               r"\(RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
])
def test_bad_networks_are_config_errors(net, match):
    with pytest.raises(ConfigError, match=match):
        build_algorithm(build_config("ppo", "CartPole-v1", sets=[
            "mlflow=false", "num_envs=2", "ppo.minibatch_size=64", f"ppo.net={net}"]))


@pytest.mark.parametrize("net,match", [
    # Called with the observation shape: os.system((4,)) and eval((4,)) raised TypeError
    # (exit 1, "unexpected"), and a string-taking callable would have run it.
    ("os:system", r"ppo\.net='os:system' is a builtin_function_or_method, not a network "
                  r"class or factory function; name a torch\.nn\.Module subclass"),
    ("builtins:eval", r"ppo\.net='builtins:eval' is a builtin_function_or_method"),
    ("shutil:rmtree", r"shutil\.rmtree from Python's standard library, not a network "
                      r"factory; name a torch\.nn\.Module subclass"),
    ("collections:OrderedDict", r"is a class but not a torch\.nn\.Module subclass"),
    ("custom_nets:feature_count", r"network factory feature_count\(\(4,\)\) returned a "
                                  r"int, not a torch\.nn\.Module; make it return the network"),
    ("torch.nn:Linear", r"network Linear\(\(4,\)\) raised TypeError: .*out_features.*"
                        r"rlloop builds a network as Linear\(obs_shape\)"),
])
def test_a_path_to_a_callable_that_is_no_network_is_refused_before_it_is_called(net, match):
    with pytest.raises(ConfigError, match=match):
        build_algorithm(build_config("ppo", "CartPole-v1", sets=[
            "mlflow=false", "num_envs=2", "ppo.minibatch_size=64", f"ppo.net={net}"]))


def test_cli_network_naming_os_system_is_one_line_exit_2(tmp_path, capsys):
    from rlloop.cli.main import main

    code = main(["train", "ppo", "--env", "CartPole-v1", "--quiet", "--set", "mlflow=false",
                 "--set", "ppo.net=os:system", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("rlloop: error: ppo.net='os:system' is a "), err


def _inner_class() -> type:
    class Inner(TinyEncoder):
        pass
    return Inner


@pytest.mark.parametrize("policy", [lambda shape: TinyEncoder(shape), _inner_class(),
                                    functools.partial(TinyEncoder), TinyEncoder((4,))],
                         ids=["lambda", "local class", "partial", "instance"])
def test_a_policy_a_saved_run_could_not_name_is_refused_in_one_line(policy):
    """These raised a raw AttributeError or blamed a 'module:Class' string never typed."""
    with pytest.raises(ConfigError, match=r"policy= must be a class or function defined at "
                                          r"the top level of a module"):
        PPO("CartPole-v1", policy=policy)


def test_policy_is_refused_where_unsupported():
    with pytest.raises(ConfigError, match="supported by PPO, not sac"):
        SAC("Pendulum-v1", policy=TinyEncoder)


def test_cli_bad_class_path_is_one_line_exit_2(tmp_path, cli_env):
    out = _run(["train", "ppo", "--env", "CartPole-v1", "--quiet", "--set",
                "ppo.net=no_such_module:Net", "--run-dir", "run"], cli_env, tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("rlloop: error: ppo.net='no_such_module:Net': no module named "
                               "'no_such_module'"), lines


def test_network_run_loads_again_and_imports_only_when_allowed(tmp_path, cli_env,
                                                                monkeypatch):
    shutil.copy(NETS, tmp_path / "my_nets.py")  # the user's module, in the working dir
    monkeypatch.syspath_prepend(str(tmp_path))
    config = build_config("ppo", "CartPole-v1", sets=[
        "ppo.net=my_nets:TinyEncoder", "total_env_steps=512", "eval_every=0",
        *(f"{k}={str(v).lower()}" for k, v in QUIET.items())])
    train(config, tmp_path / "run")
    assert "net: my_nets:TinyEncoder" in (tmp_path / "run" / "config.yaml").read_text()
    # A fresh process has not imported my_nets: the run's config may not import it...
    refused = _run(["eval", "run", "--episodes", "2"], cli_env, tmp_path)
    assert refused.returncode == 2
    assert "would import module 'my_nets'" in refused.stderr
    assert "--allow-import" in refused.stderr
    # ...unless the user allows it; then the checkpoint loads into the same network.
    allowed = _run(["eval", "run", "--episodes", "2", "--json", "--allow-import"], cli_env,
                   tmp_path)
    assert allowed.returncode == 0, allowed.stderr


@pytest.mark.slow
def test_custom_network_trains_cartpole_from_the_python_api(tmp_path):
    model = PPO("CartPole-v1", policy=TinyEncoder, seed=0, run_dir=tmp_path / "run",
                **QUIET)
    assert model.config.hparams.net == "custom_nets:TinyEncoder"
    model.learn(100_000)
    assert model.evaluate(20)["return_mean"] >= 475
    loaded = load(tmp_path / "run")  # the class is found again by its path
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs), model.predict(obs))


def test_a_custom_net_gets_float32_frames_scaled_to_one():
    """Frames reached the user's network as uint8 0-255 (the README promises float32), so
    a float first layer failed inside the first rollout."""
    import pixel_envs  # noqa: F401  (registers rlloop-test/SidePixels-v0)
    from custom_nets import SeesInput

    SeesInput.seen.clear()
    algo = build_algorithm(build_config("ppo", "rlloop-test/SidePixels-v0", sets=[
        "mlflow=false", "num_envs=2", "ppo.rollout_steps=16", "ppo.minibatch_size=32",
        "ppo.net=custom_nets:SeesInput"]))
    algo.collect()
    algo.update(32)
    seen = SeesInput.seen[2:]  # after the two build-time checks
    assert seen and all(dtype == torch.float32 and shape[1:] == (36, 36, 1)
                        and 0.0 <= top <= 1.0 for dtype, shape, top in seen), seen
    assert max(top for _, _, top in seen) > 0.5  # scaled, not zeroed
    algo.close()


def test_a_custom_net_gets_dict_pixels_scaled_like_rlloops_encoders():
    import dict_envs  # noqa: F401
    from custom_nets import SeesInput

    from rlloop.modules.encoders import NetInput

    SeesInput.seen.clear()
    algo = build_algorithm(build_config("ppo", "rlloop-test/DictCue-v0", sets=[
        "mlflow=false", "num_envs=2", "ppo.rollout_steps=16", "ppo.minibatch_size=32",
        "ppo.net=custom_nets:SeesInput"]))
    algo.collect()
    assert all(dtype == torch.float32 and top <= 1.0 for dtype, _, top in SeesInput.seen)
    algo.close()
    # the image entry's columns are divided by 255, the vector entry's left alone
    net_input = NetInput((("cue", (2,), False), ("pixels", (2, 2), True)))
    x = torch.tensor([[0.5, 1.0, 255.0, 0.0, 51.0, 255.0]])
    assert torch.allclose(net_input(x), torch.tensor([[0.5, 1.0, 1.0, 0.0, 0.2, 1.0]]))
    standardized = NetInput((("cue", (2,), False), ("pixels", (2, 2), True)),
                            standardized=True)
    assert torch.equal(standardized(x), x)


def test_the_build_time_check_leaves_weights_and_random_stream_alone(monkeypatch):
    """A seed gives the same initial weights and the same draws after the build as before
    the check existed."""
    def build() -> tuple[dict[str, Tensor], Tensor]:
        torch.manual_seed(0)
        policy = ActorCritic((4,), Discrete(2), features=TinyEncoder)
        return policy.state_dict(), torch.rand(3)

    checked = build()
    monkeypatch.setattr("rlloop.modules.actor_critic.check_features", lambda *args: None)
    unchecked = build()
    assert checked[0].keys() == unchecked[0].keys()
    assert all(torch.equal(checked[0][k], unchecked[0][k]) for k in checked[0])
    assert torch.equal(checked[1], unchecked[1])


def test_settings_a_custom_net_replaces_are_named():
    """encoder and cnn_precision changed nothing, without a word (hidden and activation
    neither, but presets set them: a warning there would name what the user never set)."""
    from rlloop.config.unused_settings import unused_settings

    config = build_config("ppo", "CartPole-v1", sets=[
        "ppo.net=custom_nets:TinyEncoder", "ppo.hidden=[32]", "ppo.activation=relu",
        "ppo.encoder=nature_cnn", "ppo.cnn_precision=bfloat16"])
    lines = unused_settings(config.hparams)
    for name in ("encoder", "cnn_precision"):
        assert any(line.startswith(f"ppo.{name}=") and "has no effect with "
                   "ppo.net='custom_nets:TinyEncoder'" in line for line in lines), lines
    assert unused_settings(build_config("ppo", "HalfCheetah-v5", sets=[
        "ppo.net=custom_nets:TinyEncoder"]).hparams) == []  # its preset sets hidden


@pytest.mark.parametrize("net", ["builtins:print", "os:getcwd", "torch:zeros", "shutil:rmtree",
                                 "torch.hub:load", "rlloop.api:load"])
def test_a_run_naming_a_callable_that_is_no_network_is_refused(tmp_path, net):
    """A module already imported passed the import check, and loading the run called
    whatever its config named (``builtins:print`` printed the observation shape)."""
    from rlloop.errors import EnvError
    from rlloop.runs.saved import load_run_config

    config = build_config("ppo", "CartPole-v1", sets=[
        "ppo.net=custom_nets:TinyEncoder", "total_env_steps=256", "num_envs=2",
        "ppo.rollout_steps=128", "eval_every=0", *(f"{k}={str(v).lower()}"
                                                  for k, v in QUIET.items())])
    run = train(config, tmp_path / "run").run_dir
    assert load_run_config(run).hparams.net == "custom_nets:TinyEncoder"  # a class: loads
    saved = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(saved.replace("custom_nets:TinyEncoder", net))
    with pytest.raises(EnvError, match=rf"names network ppo.net='{net}', which is not a "
                                       r"network class.*--allow-import"):
        load_run_config(run)
    assert load_run_config(run, allow_import=True).hparams.net == net  # the user's consent


def test_a_run_naming_a_factory_function_of_the_users_module_loads(tmp_path, monkeypatch):
    """A factory function (not a class) from the user's own module, imported by the
    loading script, loads without --allow-import, as a class does."""
    from rlloop.runs.saved import load_run_config

    (tmp_path / "user_nets.py").write_text(
        "from custom_nets import TinyEncoder\n"
        "def make_net(obs_shape):\n"
        "    return TinyEncoder(obs_shape)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_nets

    config = build_config("ppo", "CartPole-v1", sets=[
        "ppo.net=user_nets:make_net", "total_env_steps=256", "num_envs=2",
        "ppo.rollout_steps=128", "eval_every=0", *(f"{k}={str(v).lower()}"
                                                  for k, v in QUIET.items())])
    run = train(config, tmp_path / "run").run_dir
    assert user_nets.make_net and load_run_config(run).hparams.net == "user_nets:make_net"


def test_lazy_layers_take_their_shapes_at_build_each_body_its_own_weights():
    """A LazyLinear net failed at the optimiser ("uninitialized parameter"); the build's
    check materialises it, and actor and critic must not draw the same weights."""
    from custom_nets import LazyEncoder

    torch.manual_seed(0)
    policy = ActorCritic((4,), Discrete(2), features=LazyEncoder)
    actor, critic = policy.actor[0].net[1].weight, policy.critic[0].net[1].weight
    assert actor.shape == critic.shape == (16, 4)
    assert not torch.equal(actor, critic)
