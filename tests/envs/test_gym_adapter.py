"""GymVecEnv and make_env: Gymnasium envs behind the VecEnv contract.

The contract details that matter for learning are pinned against a plain single
Gymnasium env run with the same seed and actions: the truncated episode's true last
observation arrives in ``final_obs`` (needed to bootstrap), terminated and truncated
stay separate, and resumed RNG state reproduces the same episodes.
"""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlloop.envs import (
    Box,
    CartPoleVecEnv,
    Discrete,
    EnvError,
    GymVecEnv,
    VecEnv,
    env_spec,
    make_env,
)


def pendulum_actions(steps: int, n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((steps, n, 1), generator=generator) * 4.0 - 2.0


def test_shapes_dtypes_and_specs() -> None:
    cartpole = GymVecEnv("CartPole-v1", 3, seed=0)
    pendulum = GymVecEnv("Pendulum-v1", 3, seed=0)
    assert isinstance(cartpole, VecEnv) and isinstance(pendulum, VecEnv)
    assert cartpole.spec.action_space == Discrete(2) and cartpole.spec.obs_shape == (4,)
    assert cartpole.spec.max_episode_steps == 500 and cartpole.spec.reward_threshold == 475.0
    assert pendulum.spec.action_space == Box(low=(-2.0,), high=(2.0,), shape=(1,))
    assert pendulum.spec.max_episode_steps == 200
    for env, actions in (
        (cartpole, torch.tensor([0, 1, 1])),
        (pendulum, torch.zeros(3, 1)),
    ):
        obs = env.reset()
        assert obs.shape == (3, *env.spec.obs_shape) and obs.dtype == torch.float32
        result = env.step(actions)
        assert result.obs.shape == result.final_obs.shape == obs.shape
        assert result.obs.dtype == result.final_obs.dtype == torch.float32
        assert result.reward.shape == (3,) and result.reward.dtype == torch.float32
        assert result.terminated.dtype == result.truncated.dtype == torch.bool
        env.close()


def test_pendulum_truncation_returns_true_last_obs() -> None:
    env = GymVecEnv("Pendulum-v1", 2, seed=0)
    reference = gymnasium.make("Pendulum-v1")  # plays env 0 by hand
    obs = env.reset()
    ref_obs, _ = reference.reset(seed=0)
    np.testing.assert_array_equal(obs[0].numpy(), ref_obs)
    actions = pendulum_actions(200, 2, seed=0)
    for step, action in enumerate(actions, start=1):
        result = env.step(action)
        ref_obs, ref_reward, _, ref_trunc, _ = reference.step(action[0].numpy())
        assert not result.terminated.any()
        assert result.truncated.tolist() == [step == 200] * 2 == [ref_trunc] * 2
        assert result.reward[0].item() == pytest.approx(ref_reward, rel=1e-6)
    np.testing.assert_array_equal(result.final_obs[0].numpy(), ref_obs)
    # The returned obs is already the next episode's first observation.
    ref_reset_obs, _ = reference.reset()
    np.testing.assert_array_equal(result.obs[0].numpy(), ref_reset_obs)
    assert not torch.equal(result.final_obs, result.obs)
    reference.close()
    env.close()


def test_cartpole_termination_is_separate_from_truncation() -> None:
    env = GymVecEnv("CartPole-v1", 4, seed=0)
    env.reset()
    always_right = torch.ones(4, dtype=torch.long)
    for _ in range(100):
        result = env.step(always_right)
        if result.terminated.any():
            break
    assert result.terminated.any() and not result.truncated.any()
    ended = result.terminated
    x, theta = result.final_obs[ended, 0], result.final_obs[ended, 2]
    assert ((x.abs() > 2.4) | (theta.abs() > 12 * 2 * np.pi / 360)).all()
    assert (result.obs[ended].abs() <= 0.05).all()
    assert torch.equal(result.obs[~ended], result.final_obs[~ended])
    env.close()


def test_terminated_wins_when_both_flags_are_set() -> None:
    # Always pushing right, the seed-0 episode falls on step 8; with an 8-step limit
    # Gymnasium reports both flags on that step, rlloop only terminated.
    env = GymVecEnv("CartPole-v1", 1, seed=0, env_kwargs={"max_episode_steps": 8})
    assert env.spec.max_episode_steps == 8
    reference = gymnasium.make("CartPole-v1", max_episode_steps=8)
    env.reset()
    reference.reset(seed=0)
    for _ in range(8):
        result = env.step(torch.ones(1, dtype=torch.long))
        *_, ref_term, ref_trunc, _ = reference.step(1)
    assert ref_term and ref_trunc  # the premise: Gymnasium sets both on this step
    assert result.terminated.tolist() == [True] and result.truncated.tolist() == [False]
    env.close()
    reference.close()


def test_box_actions_are_clipped_to_bounds() -> None:
    clipped, at_bound = GymVecEnv("Pendulum-v1", 2, seed=3), GymVecEnv("Pendulum-v1", 2, seed=3)
    clipped.reset()
    at_bound.reset()
    a = clipped.step(torch.tensor([[50.0], [-7.0]]))
    b = at_bound.step(torch.tensor([[2.0], [-2.0]]))
    assert torch.equal(a.obs, b.obs) and torch.equal(a.reward, b.reward)


def test_discrete_observations_are_one_hot() -> None:
    env = make_env("FrozenLake-v1", 2, seed=0)
    obs = env.reset()
    assert env.spec.obs_shape == (16,)
    assert obs.shape == (2, 16) and torch.equal(obs.sum(dim=1), torch.ones(2))
    assert obs[:, 0].tolist() == [1.0, 1.0]  # both start in state 0
    env.close()


def rollout(env: VecEnv, actions: torch.Tensor) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for a in actions:
        out.extend(env.step(a))
    return out


def test_seeding_and_get_state_set_state() -> None:
    actions = pendulum_actions(250, 2, seed=1)  # crosses a truncation + autoreset
    a, b = GymVecEnv("Pendulum-v1", 2, seed=5), GymVecEnv("Pendulum-v1", 2)
    assert torch.equal(a.reset(), b.reset(seed=5))
    first = rollout(a, actions)
    assert all(torch.equal(x, y) for x, y in zip(first, rollout(b, actions), strict=True))

    # Only RNG state is saved: a restored env followed by reset() replays the episodes
    # the original env would have played after its own reset().
    saved = a.get_state()
    expected = [a.reset(), *rollout(a, actions)]
    c = GymVecEnv("Pendulum-v1", 2, seed=99)
    c.set_state(saved)
    got = [c.reset(), *rollout(c, actions)]
    assert all(torch.equal(x, y) for x, y in zip(expected, got, strict=True))
    assert c._vec.action_space.sample().tolist() == a._vec.action_space.sample().tolist()
    for env in (a, b, c):
        env.close()


def test_make_env_picks_backends() -> None:
    native = make_env("CartPole-v1", 2, seed=0)
    assert isinstance(native, CartPoleVecEnv)
    adapter = make_env("CartPole-v1", 2, backend="gymnasium", seed=0)
    assert isinstance(adapter, GymVecEnv)
    assert isinstance(make_env("Pendulum-v1"), GymVecEnv)
    assert native.spec == adapter.spec == env_spec("CartPole-v1")
    assert env_spec("CartPole-v1", backend="gymnasium") == adapter.spec
    assert env_spec("Pendulum-v1").max_episode_steps == 200
    adapter.close()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"env_id": "CartPol-v1"}, r"unknown env id 'CartPol-v1'; did you mean 'CartPole-v1'"),
        ({"env_id": "CartPole-v1", "backend": "jax"}, r"unknown env backend 'jax'; choose one"),
        (
            {"env_id": "Pendulum-v1", "backend": "native"},
            r"no native implementation of 'Pendulum-v1' \(native ids: CartPole-v1\)",
        ),
        (
            {"env_id": "CartPole-v1", "env_kwargs": {"gravity": 3.0}},
            r"native 'CartPole-v1' does not accept env_kwargs \['gravity'\]",
        ),
    ],
)
def test_make_env_errors_are_one_line_env_errors(kwargs: dict, expected: str) -> None:
    with pytest.raises(EnvError, match=expected) as info:
        make_env(**kwargs)
    assert "\n" not in str(info.value)


def test_rejected_gym_env_kwargs_are_env_errors() -> None:
    with pytest.raises(EnvError, match=r"rejected env_kwargs \['gravity'\]"):
        make_env("Pendulum-v1", env_kwargs={"gravity": 3.0})  # Pendulum calls it g
    with pytest.raises(EnvError, match=r"rejected env_kwargs \['gravity'\]"):
        env_spec("Pendulum-v1", env_kwargs={"gravity": 3.0})
    assert make_env("Pendulum-v1", env_kwargs={"g": 3.0}).spec.obs_shape == (3,)


def test_env_spec_validates_like_make_env() -> None:
    with pytest.raises(EnvError, match="did you mean 'Pendulum-v1'"):
        env_spec("Pendulum-v2")
    with pytest.raises(EnvError, match="no native implementation"):
        env_spec("Pendulum-v1", backend="native")


class _MultiDiscreteActionEnv(gymnasium.Env):  # type: ignore[type-arg]
    observation_space = spaces.Box(-1.0, 1.0, (2,))
    # 1-d MultiDiscrete is supported (PPO's factorised heads); a 2-d one is not.
    action_space = spaces.MultiDiscrete([[2, 3], [2, 2]])


@pytest.fixture
def multidiscrete_id() -> Iterator[str]:
    env_id = "rlloop-test/MultiDiscreteAction-v0"
    gymnasium.register(env_id, entry_point=lambda **_: _MultiDiscreteActionEnv())
    yield env_id
    del gymnasium.registry[env_id]


def test_unsupported_spaces_raise_env_error(multidiscrete_id: str) -> None:
    with pytest.raises(EnvError, match=r"Blackjack-v1: observation space Tuple\(.*FlattenObs"):
        make_env("Blackjack-v1")
    with pytest.raises(EnvError, match=r"action space MultiDiscrete\(\[\[2 3\] \[2 2\]\]\) is "
                                        r"not supported \(only Discrete, Box and 1-d"):
        make_env(multidiscrete_id)


def test_async_backend_matches_sync_and_closes() -> None:
    actions = torch.randint(2, (30, 2), generator=torch.Generator().manual_seed(0))
    sync_env = make_env("CartPole-v1", 2, backend="gymnasium", seed=0)
    async_env = make_env("CartPole-v1", 2, backend="gymnasium-async", seed=0)
    assert isinstance(async_env, GymVecEnv)
    expected = [sync_env.reset(), *rollout(sync_env, actions)]
    got = [async_env.reset(), *rollout(async_env, actions)]
    assert all(torch.equal(x, y) for x, y in zip(expected, got, strict=True))
    # RNG state round-trips through the worker processes too.
    async_env.reset(seed=123)
    async_env.set_state(sync_env.get_state())
    assert torch.equal(async_env.reset(), sync_env.reset())
    assert isinstance(async_env._vec, gymnasium.vector.AsyncVectorEnv)
    processes = async_env._vec.processes
    async_env.close()
    sync_env.close()
    assert not any(p.is_alive() for p in processes)


def test_render_rgb_needs_rgb_array_mode() -> None:
    pytest.importorskip("pygame")
    env = GymVecEnv("CartPole-v1", 2, seed=0, env_kwargs={"render_mode": "rgb_array"})
    env.reset()
    frame = env.render_rgb()
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8
    env.close()
    plain = GymVecEnv("CartPole-v1", 1)
    with pytest.raises(EnvError, match="render_mode"):
        plain.render_rgb()
    plain.close()


class _Mission(spaces.Space[str]):
    """Free text, like MiniGrid's MissionSpace: Gymnasium cannot flatten it."""

    def sample(self, mask: object = None, probability: object = None) -> str:
        return "get the key"

    def contains(self, x: object) -> bool:
        return isinstance(x, str)


class _GridEnv(gymnasium.Env):  # type: ignore[type-arg]
    """MiniGrid's observation layout: a symbolic 7x7x3 grid, a direction and a mission."""

    observation_space = spaces.Dict({"image": spaces.Box(0, 10, (7, 7, 3), np.uint8),
                                     "direction": spaces.Discrete(4), "mission": _Mission()})
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action: int) -> tuple:
        return self._obs(), 0.0, False, False, {}

    def _obs(self) -> dict:
        return {"image": np.ones((7, 7, 3), np.uint8), "direction": 1, "mission": "get the key"}


def test_dict_observation_text_entry_is_left_out_as_the_fix_did() -> None:
    """The mission text was once refused with the fix below; it is now applied as typed
    (issue 45, item 8), and gives the same parts as the fix."""
    gymnasium.register("rlloop-test/Grid-v0", entry_point=_GridEnv)
    assert env_spec("rlloop-test/Grid-v0").obs_parts == (("direction", (4,), False),
                                                         ("image", (7, 7, 3), True))
    with pytest.raises(NotImplementedError):  # what the message suggested first
        gymnasium.wrappers.FlattenObservation(_GridEnv())

    def fixed() -> gymnasium.Env:  # type: ignore[type-arg]
        return gymnasium.wrappers.FilterObservation(_GridEnv(), ["direction", "image"])

    gymnasium.register("rlloop-test/GridFiltered-v0", entry_point=fixed)
    env = make_env("rlloop-test/GridFiltered-v0", 2, seed=0)
    # one part per entry, the image kept as an image (its own CNN encoder)
    assert env.spec.obs_parts == (("direction", (4,), False), ("image", (7, 7, 3), True))
    assert env.reset().shape == (2, 4 + 7 * 7 * 3)
    env.close()
