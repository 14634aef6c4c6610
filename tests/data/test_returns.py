"""GAE and discounted returns against hand-computed and analytic answers."""

import math

import torch

from rlloop.data.returns import discounted_returns, gae


def _flags(t: int, n: int = 1) -> torch.Tensor:
    return torch.zeros(t, n, dtype=torch.bool)


def test_gae_constant_value_is_zero_advantage_at_the_fixed_point():
    # With r = 1 forever and V = 1 / (1 - gamma), every TD error is zero.
    gamma, t = 0.9, 50
    v = torch.full((t, 1), 1 / (1 - gamma))
    adv, ret = gae(torch.ones(t, 1), v, v.clone(), _flags(t), _flags(t), gamma, 0.95)
    torch.testing.assert_close(adv, torch.zeros(t, 1), atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, v)


def test_gae_zero_value_lambda_one_is_monte_carlo_return():
    gamma, t = 0.9, 5
    rewards = torch.arange(1.0, t + 1).unsqueeze(1)
    term = _flags(t)
    term[-1] = True
    zero = torch.zeros(t, 1)
    adv, _ = gae(rewards, zero, zero, term, _flags(t), gamma, 1.0)
    expected = [sum(gamma**k * (i + 1 + k) for k in range(t - i)) for i in range(t)]
    torch.testing.assert_close(adv.squeeze(1), torch.tensor(expected))


def test_gae_hand_computed_with_termination_and_truncation():
    gamma, lam = 0.5, 0.5
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    values = torch.tensor([[1.0], [1.0], [1.0], [1.0]])
    # step 1 is truncated with V(final_obs) = 10; step 3 terminates.
    next_values = torch.tensor([[1.0], [10.0], [1.0], [7.0]])
    term = torch.tensor([[False], [False], [False], [True]])
    trunc = torch.tensor([[False], [True], [False], [False]])
    adv, ret = gae(rewards, values, next_values, term, trunc, gamma, lam)
    d3 = 4.0 - 1.0  # terminal: no bootstrap
    d2 = 3.0 + 0.5 * 7.0 * 0 + 0.5 * 1.0 - 1.0  # next_values[2] = 1
    a3 = d3
    a2 = d2 + gamma * lam * a3
    d1 = 2.0 + 0.5 * 10.0 - 1.0  # truncation bootstraps from V(final_obs)
    a1 = d1  # ... but the advantage does not flow across the cut
    d0 = 1.0 + 0.5 * 1.0 - 1.0
    a0 = d0 + gamma * lam * a1
    torch.testing.assert_close(adv.squeeze(1), torch.tensor([a0, a1, a2, a3]))
    torch.testing.assert_close(ret, adv + values)


def test_truncation_bootstrap_matters_for_infinite_horizon_value():
    # An endless task cut every 10 steps: bootstrapping keeps the target at 1/(1-gamma).
    gamma, t = 0.9, 10
    v = torch.full((t, 1), 1 / (1 - gamma))
    trunc = _flags(t)
    trunc[-1] = True
    _, ret = gae(torch.ones(t, 1), v, v.clone(), _flags(t), trunc, gamma, 0.95)
    torch.testing.assert_close(ret, v, atol=1e-4, rtol=0)
    # Treating the cut as a termination drags the last target to r = 1.
    _, wrong = gae(torch.ones(t, 1), v, v.clone(), trunc, _flags(t), gamma, 0.95)
    assert math.isclose(float(wrong[-1]), 1.0, rel_tol=1e-6)


def test_discounted_returns_restart_at_episode_ends():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0])
    term = torch.tensor([False, True, False, False])
    trunc = torch.tensor([False, False, False, True])
    boot = torch.tensor([0.0, 0.0, 0.0, 5.0])
    out = discounted_returns(rewards, term, trunc, 0.5, bootstrap=boot)
    torch.testing.assert_close(out, torch.tensor([1.5, 1.0, 1.0 + 0.5 * 3.5, 3.5]))
