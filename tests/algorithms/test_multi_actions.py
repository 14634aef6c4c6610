"""MultiDiscrete and MultiBinary actions for PPO: factorised heads, learning, refusals."""

from __future__ import annotations

import pytest
import torch
from pixel_envs import register

from rlloop.config.loading import build_config
from rlloop.envs.core import MultiBinary, MultiDiscrete, sample_random_actions
from rlloop.errors import ConfigError
from rlloop.modules.distributions import Bernoulli, MultiCategorical
from rlloop.runs.build import build_algorithm

register()
QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def test_multi_categorical_is_the_product_of_its_parts():
    logits = torch.randn(5, 7)
    d = MultiCategorical(logits, (3, 4))
    actions = torch.stack([torch.randint(3, (5,)), torch.randint(4, (5,))], -1)
    a = torch.distributions.Categorical(logits=logits[:, :3])
    b = torch.distributions.Categorical(logits=logits[:, 3:])
    torch.testing.assert_close(d.log_prob(actions),
                               a.log_prob(actions[:, 0]) + b.log_prob(actions[:, 1]))
    torch.testing.assert_close(d.entropy(), a.entropy() + b.entropy())
    assert d.sample(torch.Generator().manual_seed(0)).shape == (5, 2)


def test_bernoulli_matches_torch():
    logits = torch.randn(6, 3) * 3
    actions = torch.randint(2, (6, 3))
    ref = torch.distributions.Bernoulli(logits=logits)
    d = Bernoulli(logits)
    torch.testing.assert_close(d.log_prob(actions), ref.log_prob(actions.float()).sum(-1))
    torch.testing.assert_close(d.entropy(), ref.entropy().sum(-1))
    assert set(d.sample(torch.Generator().manual_seed(0)).unique().tolist()) <= {0, 1}


def test_random_actions_stay_in_range():
    g = torch.Generator().manual_seed(0)
    md = sample_random_actions(MultiDiscrete((3, 4)), 2000, g)
    assert md.dtype == torch.int64 and md.shape == (2000, 2)
    assert md[:, 0].unique().tolist() == [0, 1, 2] and md[:, 1].unique().tolist() == [0, 1, 2, 3]
    assert sample_random_actions(MultiBinary(3), 500, g).unique().tolist() == [0, 1]


def _learn(env: str, iterations: int) -> float:
    algo = build_algorithm(build_config(
        "ppo", env, flags={"seed": 0, "num_envs": 8},
        sets=[*QUIET, "ppo.rollout_steps=16", "ppo.minibatch_size=64", "ppo.lr=0.01",
              "ppo.ent_coef=0.0"]))
    try:
        steps = 0
        for _ in range(iterations):
            steps += int(algo.collect()["env/steps"])
            algo.update(steps)
        return float(algo.evaluate(10)["return_mean"])
    finally:
        algo.close()


@pytest.mark.slow
def test_ppo_learns_two_independent_bandits_to_the_optimum():
    assert _learn("rlloop-test/TwoBandits-v0", 40) == 2.0


@pytest.mark.slow
def test_ppo_learns_a_bit_pattern_with_bernoulli_heads():
    assert _learn("rlloop-test/BitPattern-v0", 40) == 4.0


@pytest.mark.parametrize("algo, takes", [("dqn", "Discrete"), ("sac", "Box"), ("td3", "Box")])
def test_other_algorithms_refuse_multi_discrete_actions_with_the_fix(algo, takes):
    with pytest.raises(ConfigError, match=rf"^{algo} takes {takes} actions but "
                                          r".*TwoBandits-v0 has MultiDiscrete ones; use ppo"):
        build_algorithm(build_config(algo, "rlloop-test/TwoBandits-v0", sets=QUIET))
