"""The native CartPole must be Gymnasium's CartPole-v1, only faster.

Equivalence is pinned one step at a time from thousands of states (trajectories drift
apart at float32 rounding level, since Gymnasium integrates in float64), then the
episode bookkeeping (time limit, autoreset, seeding, exact resume) is pinned directly.
"""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from rlloop.envs import CartPoleVecEnv, EnvError, VecEnv
from rlloop.envs.native.cartpole import THETA_LIMIT, X_LIMIT, step_physics

# A linear controller that balances the pole and keeps the cart near the centre for
# the full 500 steps from any initial state (checked by test_truncation_at_step_500).
BALANCE = torch.tensor([0.5, 1.0, 10.0, 2.0])


def balance(obs: torch.Tensor) -> torch.Tensor:
    return (obs @ BALANCE > 0).long()


def random_states(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Float32 states, half spread widely and half hugging the termination bounds."""
    rng = np.random.default_rng(seed)
    wide = rng.uniform([-2.6, -3.0, -0.3, -3.5], [2.6, 3.0, 0.3, 3.5], size=(n // 2, 4))
    edge = rng.uniform([-0.03, -1.0, -0.01, -1.0], [0.03, 1.0, 0.01, 1.0], size=(n - n // 2, 4))
    signs = rng.choice([-1.0, 1.0], size=(n - n // 2, 2))
    edge[:, 0] += signs[:, 0] * X_LIMIT
    edge[:, 2] += signs[:, 1] * THETA_LIMIT
    states = np.concatenate([wide, edge]).astype(np.float32)
    return states, rng.integers(0, 2, size=n)


def gymnasium_steps(states: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gymnasium's next state (float64), reward and terminated for each (state, action)."""
    env = gymnasium.make("CartPole-v1").unwrapped
    assert isinstance(env, CartPoleEnv)
    env.reset(seed=0)
    next_states, rewards, terminated = [], [], []
    for state, action in zip(states, actions, strict=True):
        env.state = state.astype(np.float64)
        env.steps_beyond_terminated = None  # each sample is the first step past a reset
        _, reward, term, _, _ = env.step(int(action))
        next_states.append(np.array(env.state))
        rewards.append(reward)
        terminated.append(term)
    env.close()
    return np.array(next_states), np.array(rewards), np.array(terminated)


def unambiguous(next_states: np.ndarray) -> np.ndarray:
    """Samples whose termination does not hinge on float32 vs float64 rounding."""
    return (np.abs(np.abs(next_states[:, 0]) - X_LIMIT) > 1e-5) & (
        np.abs(np.abs(next_states[:, 2]) - THETA_LIMIT) > 1e-6
    )


def with_state(env: CartPoleVecEnv, state: np.ndarray, steps: list[int] | None = None) -> None:
    saved = env.get_state()
    saved["state"] = torch.from_numpy(state)
    saved["steps"] = torch.tensor(steps if steps is not None else [0] * len(state))
    env.set_state(saved)


def test_step_physics_matches_gymnasium() -> None:
    states, actions = random_states(4000, seed=1)
    expected = torch.from_numpy(gymnasium_steps(states, actions)[0])
    # In float64 the only differences left are rounding: this pins the equations (a
    # one-step change is only tau * d(acceleration), too small for float32 to resolve).
    got64 = step_physics(torch.from_numpy(states).double(), torch.from_numpy(actions))
    torch.testing.assert_close(got64, expected, rtol=1e-12, atol=1e-12)
    # The float32 path the env runs agrees to float32 precision.
    got32 = step_physics(torch.from_numpy(states), torch.from_numpy(actions))
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), expected, rtol=1e-6, atol=1e-6)


def test_step_physics_is_pure_and_batched_over_any_leading_shape() -> None:
    states, actions = random_states(12, seed=2)
    state, action = torch.from_numpy(states), torch.from_numpy(actions)
    before = state.clone()
    flat = step_physics(state, action)
    nested = step_physics(state.reshape(3, 4, 4), action.reshape(3, 4))
    assert torch.equal(state, before)
    torch.testing.assert_close(nested.reshape(12, 4), flat)


def test_env_reward_and_termination_match_gymnasium() -> None:
    states, actions = random_states(4000, seed=3)
    expected_next, expected_reward, expected_term = gymnasium_steps(states, actions)
    env = CartPoleVecEnv(len(states), seed=0)
    env.reset()
    with_state(env, states)
    result = env.step(torch.from_numpy(actions))

    clear = unambiguous(expected_next)
    assert clear.mean() > 0.99 and expected_term[clear].any() and not expected_term[clear].all()
    np.testing.assert_array_equal(result.terminated.numpy()[clear], expected_term[clear])
    np.testing.assert_array_equal(result.reward.numpy(), expected_reward.astype(np.float32))
    assert result.reward.dtype == torch.float32
    assert not result.truncated.any()
    # final_obs is exactly the physics step; obs only differs where an episode ended.
    assert torch.equal(
        result.final_obs, step_physics(torch.from_numpy(states), torch.from_numpy(actions))
    )
    running = ~result.terminated
    assert torch.equal(result.obs[running], result.final_obs[running])


def test_truncation_at_step_500() -> None:
    env = CartPoleVecEnv(16, seed=0)
    obs = env.reset()
    for step in range(1, 501):
        result = env.step(balance(obs))
        obs = result.obs
        assert not result.terminated.any()
        if step < 500:
            assert not result.truncated.any(), f"truncated early at step {step}"
    assert result.truncated.all()
    assert (result.obs.abs() <= 0.05).all()
    assert not torch.equal(result.obs, result.final_obs)
    assert (env.get_state()["steps"] == 0).all()


def test_terminal_step_at_time_limit_is_terminated_only() -> None:
    env = CartPoleVecEnv(2, seed=0)
    env.reset()
    # Env 0 crosses x = 2.4 on its 500th step; env 1 stays upright and is truncated.
    state = np.array([[2.399, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    with_state(env, state, steps=[499, 499])
    result = env.step(torch.tensor([1, 0]))
    assert result.terminated.tolist() == [True, False]
    assert result.truncated.tolist() == [False, True]


def test_autoreset_keeps_final_obs_and_starts_fresh() -> None:
    env = CartPoleVecEnv(2, seed=0)
    env.reset()
    state = np.array([[2.39, 2.0, 0.0, 0.0], [0.0, 0.1, 0.02, -0.1]], dtype=np.float32)
    with_state(env, state, steps=[17, 17])
    actions = torch.tensor([1, 1])
    result = env.step(actions)
    last = step_physics(torch.from_numpy(state), actions)

    assert result.terminated.tolist() == [True, False]
    assert torch.equal(result.final_obs, last)
    assert (result.obs[0].abs() <= 0.05).all() and not torch.equal(result.obs[0], last[0])
    assert torch.equal(result.obs[1], last[1])
    assert env.get_state()["steps"].tolist() == [0, 18]


def test_returned_tensors_are_not_aliased_to_env_state() -> None:
    env = CartPoleVecEnv(4, seed=0)
    obs = env.reset()
    snapshot = env.get_state()["state"].clone()
    obs.add_(100.0)  # e.g. in-place normalisation by the caller
    assert torch.equal(env.get_state()["state"], snapshot)


def trajectory(env: CartPoleVecEnv, steps: int, seed: int) -> list[torch.Tensor]:
    actions = torch.randint(2, (steps, env.num_envs), generator=torch.Generator().manual_seed(seed))
    out: list[torch.Tensor] = []
    for a in actions:
        out.extend(env.step(a))
    return out


def test_seeding_is_deterministic() -> None:
    a, b, c = CartPoleVecEnv(8, seed=7), CartPoleVecEnv(8), CartPoleVecEnv(8, seed=8)
    assert torch.equal(a.reset(), b.reset(seed=7))
    assert not torch.equal(CartPoleVecEnv(8, seed=7).reset(), c.reset())
    ta, tb = trajectory(a, 300, seed=0), trajectory(b, 300, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))
    assert any(r.any() for r in ta[2::5])  # episodes did end (and autoreset) on the way


def test_get_state_set_state_resumes_bit_exactly() -> None:
    env = CartPoleVecEnv(8, seed=0)
    env.reset()
    trajectory(env, 50, seed=1)
    saved = env.get_state()
    expected = trajectory(env, 200, seed=2)

    resumed = CartPoleVecEnv(8, seed=123)
    resumed.set_state(saved)
    got = trajectory(resumed, 200, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(expected, got, strict=True))


def test_misuse_raises_env_error() -> None:
    env = CartPoleVecEnv(4, seed=0)
    with pytest.raises(EnvError, match="before reset"):
        env.step(torch.zeros(4, dtype=torch.long))
    env.reset()
    with pytest.raises(EnvError, match="shape"):
        env.step(torch.zeros(3, dtype=torch.long))
    with pytest.raises(EnvError, match="num_envs"):
        CartPoleVecEnv(2).set_state(env.get_state())


def test_is_a_vec_env_with_cartpole_spec() -> None:
    env = CartPoleVecEnv(2)
    assert isinstance(env, VecEnv)
    assert env.spec.max_episode_steps == 500 and env.spec.reward_threshold == 475.0
    assert math.isclose(THETA_LIMIT, math.radians(12))


def test_render_rgb_draws_cart_and_pole() -> None:
    env = CartPoleVecEnv(2, seed=0)
    env.reset()
    frame = env.render_rgb(1)
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8
    assert (frame == 0).all(axis=2).sum() > 50 * 30  # cart (and track) in black
    assert (frame == (202, 152, 101)).all(axis=2).sum() > 500  # pole
