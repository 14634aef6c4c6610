"""``<algo>.compile=true``: the update (PPO's: each micro-batch's forward pass and loss)
runs through ``torch.compile`` and computes what the eager update computes (same batches,
same noise, same losses and parameters).

Compiling takes tens of seconds on a small CPU, so the comparisons are marked slow.
"""

from __future__ import annotations

from typing import cast

import pytest
import torch
from torch.testing import assert_close

from rlloop.algorithms.offpolicy_base import OffPolicyAlgorithmBase
from rlloop.algorithms.ppo import PPO
from rlloop.config.loading import build_config
from rlloop.errors import ConfigError
from rlloop.runs.build import build_algorithm

ENVS = {"dqn": "CartPole-v1", "sac": "Pendulum-v1", "td3": "Pendulum-v1"}


def _algo(name: str, compile: bool) -> OffPolicyAlgorithmBase:
    sets = ["mlflow=false", "progress=false", "num_envs=1", f"{name}.hidden=[32,32]",
            f"{name}.batch_size=16", f"{name}.learning_starts=20", f"{name}.buffer_size=1000",
            f"{name}.compile={str(compile).lower()}"]
    if name == "dqn":  # several updates per optimisation step, a target sync among them
        sets += ["dqn.gradient_steps=3", "dqn.opt_interval=1", "dqn.target_update_interval=4"]
    algo = cast(OffPolicyAlgorithmBase, build_algorithm(
        build_config(name, ENVS[name], flags={"seed": 1}, sets=sets)))
    for _ in range(40):
        algo.env_step()
    return algo


@pytest.mark.slow
# TD3 compiles two graphs (with and without its delayed actor update), about a minute
# from an empty cache on two cores: out of the default run (the toy test in
# test_whole_update.py covers an inactive optimiser).
@pytest.mark.parametrize("name", ["dqn", "sac", pytest.param("td3", marks=pytest.mark.heavy)])
def test_compiled_updates_equal_eager_updates(name):
    eager, compiled = _algo(name, False), _algo(name, True)
    for _ in range(4):
        a, b = eager.optimize(40), compiled.optimize(40)
        assert a is not None and b is not None and a.keys() == b.keys()
        for key in a:
            assert_close(torch.as_tensor(b[key]), torch.as_tensor(a[key]),
                         rtol=1e-4, atol=1e-5, msg=key)
    assert compiled.learner._whole  # the whole update went through torch.compile
    for p, q in zip(eager.learner.modules.parameters(), compiled.learner.modules.parameters(),
                    strict=True):
        assert_close(q, p, rtol=1e-4, atol=1e-5)
    assert eager.learner.updates == compiled.learner.updates


@pytest.mark.slow
def test_a_parameter_frozen_after_compiling_stays_frozen():
    """The whole update was built for the parameters trainable then: freezing one later
    falls back (with a warning) to the loss-only compile, which steps only what has a
    gradient, as the eager update does."""
    algo = _algo("dqn", True)
    algo.optimize(40)
    weight = algo.learner.module().online.net.layers[0].weight
    weight.requires_grad_(False)
    frozen = weight.detach().clone()
    with pytest.warns(UserWarning, match="do not step exactly the module's trainable"):
        algo.optimize(40)
    assert torch.equal(weight, frozen)


def test_compile_and_the_hand_derived_backward_exclude_each_other():
    with pytest.raises(ConfigError, match=r"manual_backward and dqn\.compile exclude"):
        build_config("dqn", "CartPole-v1",
                     sets=["dqn.compile=true", "dqn.manual_backward=true"])


def test_top_level_compile_sets_the_algorithm_setting():
    assert build_config("sac", "Pendulum-v1", sets=["compile=true"]).hparams.compile
    assert not build_config("sac", "Pendulum-v1", sets=["compile=false",
                                                        "sac.compile=true"]).hparams.compile
    assert build_config("td3", "Pendulum-v1", sets=["td3.compile=true"]).hparams.compile
    assert build_config("ppo", "CartPole-v1", sets=["compile=true"]).hparams.compile
    assert build_config("ma_ppo", "pettingzoo:classic.tictactoe_v3",
                        sets=["ma_ppo.compile=true"]).hparams.compile
    with pytest.raises(ConfigError, match=r"manual_backward and dqn\.compile exclude"):
        build_config("dqn", "CartPole-v1", sets=["compile=true", "dqn.manual_backward=true"])


def test_ppo_compile_refuses_recurrent_policies():
    with pytest.raises(ConfigError, match=r"ppo\.compile covers feed-forward policies only"):
        build_config("ppo", "CartPole-v1", sets=["ppo.compile=true", "ppo.recurrent=gru"])


def _ppo(env: str, compile: bool, sets: list[str], device: str = "cpu") -> PPO:
    sets = ["mlflow=false", "progress=false", "num_envs=4", "ppo.rollout_steps=32",
            "ppo.hidden=[32,32]", "ppo.num_epochs=2", "ppo.minibatch_size=64",
            "ppo.micro_batch=32", f"ppo.compile={str(compile).lower()}", f"device={device}",
            *sets]
    return cast(PPO, build_algorithm(build_config("ppo", env, flags={"seed": 3}, sets=sets)))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize(("env", "sets"), [
    ("CartPole-v1", []),
    # Box actions with gSDE, and schedules that move clip_coef and ent_coef every update:
    # they enter the graph as tensors, so they must not recompile it.
    ("Pendulum-v1", ["ppo.use_sde=true",
                     "ppo.clip_coef={type: linear, start: 0.3, end: 0.1, steps: 400}",
                     "ppo.ent_coef={type: linear, start: 0.02, end: 0.0, steps: 400}"]),
])
def test_compiled_ppo_updates_equal_eager_updates(env, sets, device):
    torch._dynamo.reset()  # graphs of the other case belong to the same function
    eager, compiled = _ppo(env, False, sets, device), _ppo(env, True, sets, device)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(3):
            eager.collect(), compiled.collect()
            a, b = eager.update(128 * i), compiled.update(128 * i)
            assert a.keys() == b.keys()
            for key in (k for k in a if not k.endswith("_throughput")):  # wall-clock rates
                assert_close(torch.as_tensor(b[key]), torch.as_tensor(a[key]),
                             rtol=1e-4, atol=1e-5, msg=key)
    assert compiled.learner._compiled_loss is not None  # it went through torch.compile
    for p, q in zip(eager.learner.modules.parameters(), compiled.learner.modules.parameters(),
                    strict=True):
        assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_compile_without_a_cpu_compiler_is_a_clear_error(monkeypatch):
    """On the CPU (pinned: ``device=auto`` picks CUDA where a GPU is present)."""
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(ConfigError, match=r"ppo\.compile=true on the CPU needs a C\+\+ "
                                          r"compiler.*no-such-c\+\+-compiler"):
        build_algorithm(build_config("ppo", "CartPole-v1", sets=["mlflow=false", "compile=true",
                                                          "device=cpu"]))
