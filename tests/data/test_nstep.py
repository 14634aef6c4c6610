"""The n-step step processor against hand-computed transitions."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from rlloop.data.nstep import NStepProcessor
from rlloop.data.transitions import Transitions

GAMMA = 0.9

# Two envs, five steps. obs = 100 * env + t (a fresh episode keeps the numbering);
# final observations of ended episodes are 100 * env + t + 0.5.
# env 0 terminates at t=1 (window holds 2 of 3 steps), then runs a new episode.
# env 1 fills its window at t=2 and is truncated at t=3.
REWARDS = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]])
TERMINATED = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0], [0, 0]], dtype=torch.bool)
TRUNCATED = torch.tensor([[0, 0], [0, 0], [0, 0], [0, 1], [0, 0]], dtype=torch.bool)


def _step(t: int) -> tuple[torch.Tensor, ...]:
    env = torch.arange(2)
    obs = (100 * env + t).float().unsqueeze(1)  # [2, 1]
    done = TERMINATED[t] | TRUNCATED[t]
    next_obs = torch.where(done, 100 * env + t + 0.5, 100 * env + t + 1.0).unsqueeze(1)
    action = 10 * env + t  # int64 [2]
    return obs, action, REWARDS[t], next_obs, TERMINATED[t], TRUNCATED[t]


def _expected(rows: list[tuple[float, int, float, float, bool, int]]) -> Transitions:
    """rows of (obs, action, reward sum, next_obs, terminated, k rewards summed)."""
    if not rows:
        return Transitions(
            torch.zeros(0, 1),
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0),
            torch.zeros(0, 1),
            torch.zeros(0, dtype=torch.bool),
            torch.zeros(0),
        )
    obs, action, reward, next_obs, terminated, k = zip(*rows, strict=True)
    return Transitions(
        obs=torch.tensor(obs).unsqueeze(1),
        action=torch.tensor(action),
        reward=torch.tensor(reward),
        next_obs=torch.tensor(next_obs).unsqueeze(1),
        terminated=torch.tensor(terminated),
        discount=torch.tensor([GAMMA**kk for kk in k]),
    )


EXPECTED = [
    # t=0: windows hold one step each.
    [],
    # t=1: env 0 terminates with 2 pending steps: both cut, no bootstrap.
    [
        (0.0, 0, 1 + 0.9 * 2, 1.5, True, 2),
        (1.0, 1, 2.0, 1.5, True, 1),
    ],
    # t=2: env 1's window is full: the 3-step transition from t=0.
    [(100.0, 10, 10 + 0.9 * 20 + 0.81 * 30, 103.0, False, 3)],
    # t=3: env 1 truncated: all 3 pending steps bootstrap from the final obs 103.5.
    [
        (101.0, 11, 20 + 0.9 * 30 + 0.81 * 40, 103.5, False, 3),
        (102.0, 12, 30 + 0.9 * 40, 103.5, False, 2),
        (103.0, 13, 40.0, 103.5, False, 1),
    ],
    # t=4: env 0's second episode fills its window (t=2..4).
    [(2.0, 2, 3 + 0.9 * 4 + 0.81 * 5, 5.0, False, 3)],
]


def _assert_transitions(got: Transitions, want: Transitions) -> None:
    for name in ("obs", "action", "reward", "next_obs", "terminated", "discount"):
        assert_close(getattr(got, name), getattr(want, name), msg=name)


def _processor(n: int) -> NStepProcessor:
    return NStepProcessor(2, n, GAMMA, (1,), (), torch.int64)


def test_three_step_transitions_with_termination_and_truncation() -> None:
    proc = _processor(3)
    for t, rows in enumerate(EXPECTED):
        _assert_transitions(proc.process(*_step(t)), _expected(rows))


def test_termination_with_full_window_cuts_all_pending() -> None:
    proc = NStepProcessor(1, 2, GAMMA, (1,), (), torch.int64)
    no = torch.tensor([False])
    proc.process(torch.tensor([[0.0]]), torch.tensor([0]), torch.tensor([1.0]),
                 torch.tensor([[1.0]]), no, no)  # fmt: skip
    out = proc.process(torch.tensor([[1.0]]), torch.tensor([1]), torch.tensor([2.0]),
                       torch.tensor([[9.0]]), torch.tensor([True]), no)  # fmt: skip
    _assert_transitions(
        out, _expected([(0.0, 0, 1 + 0.9 * 2, 9.0, True, 2), (1.0, 1, 2.0, 9.0, True, 1)])
    )


def test_one_step_is_the_raw_step() -> None:
    proc = _processor(1)
    for t in range(len(EXPECTED)):
        obs, action, reward, next_obs, terminated, _ = step = _step(t)
        out = proc.process(*step)
        want = Transitions(obs, action, reward, next_obs, terminated, torch.full((2,), GAMMA))
        _assert_transitions(out, want)


def test_continuous_actions_and_image_obs_shapes() -> None:
    proc = NStepProcessor(4, 2, 0.99, (3, 8, 8), (2,), torch.float32, obs_dtype=torch.uint8)
    obs = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    no = torch.zeros(4, dtype=torch.bool)
    step = (obs, torch.zeros(4, 2), torch.ones(4), obs, no, no)
    assert len(proc.process(*step)) == 0
    out = proc.process(*step)
    assert out.obs.shape == (4, 3, 8, 8) and out.obs.dtype == torch.uint8
    assert out.action.shape == (4, 2)
    assert_close(out.reward, torch.full((4,), 1.99))
    with pytest.raises(ValueError, match="action has shape"):
        proc.process(obs, torch.zeros(4), torch.ones(4), obs, no, no)


def test_state_round_trip_and_reset() -> None:
    proc = _processor(3)
    for t in range(3):
        proc.process(*_step(t))
    restored = _processor(3)
    restored.set_state(proc.get_state())
    _assert_transitions(restored.process(*_step(3)), _expected(EXPECTED[3]))
    restored.reset()
    assert len(restored.process(*_step(4))) == 0  # nothing pending after reset


def _reference(
    steps: list[tuple[torch.Tensor, ...]], n: int, gamma: float
) -> list[list[tuple[float, int, float, float, bool, int]]]:
    """A per-env, per-step Python loop computing the same n-step transitions."""
    num_envs = steps[0][0].shape[0]
    pending: list[list[tuple[float, int, list[float]]]] = [[] for _ in range(num_envs)]
    emitted = []
    for obs, action, reward, next_obs, terminated, truncated in steps:
        out = []
        for e in range(num_envs):
            for item in pending[e]:
                item[2].append(float(reward[e]))
            pending[e].append((float(obs[e, 0]), int(action[e]), [float(reward[e])]))
            done = bool(terminated[e] or truncated[e])
            ready = pending[e] if done else [p for p in pending[e] if len(p[2]) == n]
            for o, a, rs in ready:
                ret = sum(gamma**k * r for k, r in enumerate(rs))
                out.append((o, a, ret, float(next_obs[e, 0]), bool(terminated[e]), len(rs)))
            pending[e] = [] if done else [p for p in pending[e] if len(p[2]) < n]
        emitted.append(out)
    return emitted


@pytest.mark.parametrize("n", [1, 2, 4])
def test_matches_per_env_reference_on_random_episodes(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    num_envs, gamma = 3, 0.95
    steps: list[tuple[torch.Tensor, ...]] = []
    for t in range(60):
        ended = torch.rand(num_envs, generator=g) < 0.15
        terminated = ended & (torch.rand(num_envs, generator=g) < 0.5)
        obs = torch.randn(num_envs, 1, generator=g)
        steps.append(
            (
                obs,
                torch.arange(num_envs) + 10 * t,
                torch.randn(num_envs, generator=g),
                torch.randn(num_envs, 1, generator=g),
                terminated,
                ended & ~terminated,
            )
        )
    proc = NStepProcessor(num_envs, n, gamma, (1,), (), torch.int64)
    for step, rows in zip(steps, _reference(steps, n, gamma), strict=True):
        got = proc.process(*step)
        want = _expected(rows)
        want = dataclasses.replace(want, discount=torch.tensor([gamma**k for *_, k in rows]))
        _assert_transitions(got, want)
