"""``<algo>.compile=true``: the update runs through ``torch.compile`` and computes what the
eager update computes (same batches, same noise, same losses and parameters).

Compiling takes tens of seconds on a small CPU, so the comparisons are marked slow.
"""

from __future__ import annotations

from typing import cast

import pytest
import torch
from torch.testing import assert_close

from rlloop.algorithms.offpolicy_algorithm import OffPolicyAlgorithmBase
from rlloop.config import build_config
from rlloop.errors import ConfigError
from rlloop.run import build_algorithm

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
@pytest.mark.parametrize("name", ["dqn", "sac", "td3"])
def test_compiled_updates_equal_eager_updates(name):
    eager, compiled = _algo(name, False), _algo(name, True)
    for _ in range(4):
        a, b = eager.optimize(40), compiled.optimize(40)
        assert a is not None and b is not None and a.keys() == b.keys()
        for key in a:
            assert_close(torch.as_tensor(b[key]), torch.as_tensor(a[key]),
                         rtol=1e-4, atol=1e-5, msg=key)
    assert compiled.learner._compiled  # the update really went through torch.compile
    for p, q in zip(eager.learner.modules.parameters(), compiled.learner.modules.parameters(),
                    strict=True):
        assert_close(q, p, rtol=1e-4, atol=1e-5)
    assert eager.learner.updates == compiled.learner.updates


def test_compile_and_the_hand_derived_backward_exclude_each_other():
    with pytest.raises(ConfigError, match=r"manual_backward and dqn\.compile exclude"):
        build_config("dqn", "CartPole-v1",
                     sets=["dqn.compile=true", "dqn.manual_backward=true"])


def test_top_level_compile_sets_the_algorithm_setting():
    assert build_config("sac", "Pendulum-v1", sets=["compile=true"]).hparams.compile
    assert not build_config("sac", "Pendulum-v1", sets=["compile=false",
                                                        "sac.compile=true"]).hparams.compile
    assert build_config("td3", "Pendulum-v1", sets=["td3.compile=true"]).hparams.compile
    with pytest.raises(ConfigError, match="compile: ppo has no compiled update"):
        build_config("ppo", "CartPole-v1", sets=["compile=true"])
    with pytest.raises(ConfigError, match=r"manual_backward and dqn\.compile exclude"):
        build_config("dqn", "CartPole-v1", sets=["compile=true", "dqn.manual_backward=true"])
