"""CartPole-v1 as one batched torch tensor program.

The physics, reward, termination thresholds, initial-state distribution and 500-step
time limit are those of Gymnasium 1.x ``CartPole-v1`` (Barto, Sutton & Anderson 1983,
with the corrected equations of https://coneural.org/florian/papers/05_cart_pole.pdf),
so returns and "solved" thresholds are comparable with published results. Everything
else is built for throughput: one ``[N, 4]`` float32 state, about 30 small tensor ops
per step whatever ``N`` is, no Python loop over envs and no host synchronisation, so
the same code runs unchanged on a GPU.

Two deliberate differences from Gymnasium:

* The state is float32 (Gymnasium integrates in float64 and casts the observation):
  one step agrees to float32 precision (see ``tests/envs/test_native_cartpole.py``), but
  like any chaotic system long trajectories from the same start eventually diverge.
* All envs share one ``torch.Generator`` for their reset draws, so ``reset(seed=s)``
  makes the whole batch reproducible rather than env ``i`` depending on ``s + i`` alone.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, Final

import numpy as np
import torch
from torch import Tensor

from rlloop.envs.core import Discrete, EnvSpec, StepResult
from rlloop.errors import EnvError
from rlloop.system.devices import set_generator_state
from rlloop.system.seeding import derive_seed

GRAVITY: Final = 9.8
CART_MASS: Final = 1.0
POLE_MASS: Final = 0.1
TOTAL_MASS: Final = CART_MASS + POLE_MASS
POLE_HALF_LENGTH: Final = 0.5
POLE_MASS_LENGTH: Final = POLE_MASS * POLE_HALF_LENGTH
FORCE_MAG: Final = 10.0
TAU: Final = 0.02  # seconds per step, explicit Euler
X_LIMIT: Final = 2.4
THETA_LIMIT: Final = 12 * 2 * math.pi / 360
RESET_BOUND: Final = 0.05
STREAM: Final = "native-cartpole"  # see rlloop.system.seeding
MAX_EPISODE_STEPS: Final = 500

CARTPOLE_SPEC: Final = EnvSpec(
    env_id="CartPole-v1",
    obs_shape=(4,),
    action_space=Discrete(2),
    max_episode_steps=MAX_EPISODE_STEPS,
    reward_threshold=475.0,
)

#: ``mask_velocity=True``: observations are ``(x, theta)``.
MASKED_CARTPOLE_SPEC: Final = dataclasses.replace(CARTPOLE_SPEC, obs_shape=(2,))


@functools.cache
def _physics_constants(device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Tensor constants for ``step_physics``, made once per device and dtype.

    Tensor operands instead of Python floats: an op with a Python-scalar operand wraps it
    in a fresh tensor and costs about 3x a tensor-tensor op at small batch sizes.
    """
    # Force over total mass, indexed by the action: 0 pushes left, 1 pushes right.
    force_per_mass = torch.tensor([-FORCE_MAG, FORCE_MAG], device=device, dtype=dtype)
    # Constant part of the effective pole length, divided by g (see step_physics).
    length_over_g = torch.tensor(POLE_HALF_LENGTH * 4.0 / 3.0 / GRAVITY, device=device, dtype=dtype)
    return force_per_mass / TOTAL_MASS, length_over_g


def step_physics(state: Tensor, action: Tensor) -> Tensor:
    """One explicit-Euler step of the cart-pole equations of motion.

    Pure and batched: ``state`` is ``[..., 4]`` as ``(x, x_dot, theta, theta_dot)``,
    ``action`` is ``[...]`` int64 with 0 = push left, 1 = push right. Returns the new
    state; nothing is modified in place. The env and the Gymnasium-equivalence test both
    call this, so the test pins exactly the code that runs.

    With ``M`` the total mass, ``m`` the pole mass and ``l`` the pole's half length:

        temp      = (F + m l w^2 sin) / M
        theta_acc = (g sin - cos temp) / (l (4/3 - m cos^2 / M))
        x_acc     = temp - m l theta_acc cos / M

    ``theta_acc`` is computed with numerator and denominator divided by ``g``, which
    saves two scalar ops and changes the result only at float rounding level.
    """
    force_per_mass, length_over_g = _physics_constants(state.device, state.dtype)
    # One unbind for the four columns: each index or slice of a view costs a dispatch.
    x, x_dot, theta, theta_dot = state.unbind(-1)
    cos = torch.cos(theta)
    sin = torch.sin(theta)
    # addcmul(a, b, c, value=v) is a + v * b * c in one op.
    temp = torch.addcmul(
        torch.take(force_per_mass, action),
        theta_dot * theta_dot,
        sin,
        value=POLE_MASS_LENGTH / TOTAL_MASS,
    )
    eff_length_over_g = torch.addcmul(
        length_over_g, cos, cos, value=-POLE_HALF_LENGTH * POLE_MASS / TOTAL_MASS / GRAVITY
    )
    theta_acc = torch.sub(sin, cos * temp, alpha=1.0 / GRAVITY).div_(eff_length_over_g)
    x_acc = torch.addcmul(temp, theta_acc, cos, value=-POLE_MASS_LENGTH / TOTAL_MASS)

    # Explicit Euler: positions advance with the old velocities, Gymnasium's default
    # integrator. Writing into the column views of one output tensor is several times
    # cheaper than torch.stack at small N.
    new = torch.empty_like(state)
    new_x, new_x_dot, new_theta, new_theta_dot = new.unbind(-1)
    torch.add(x, x_dot, alpha=TAU, out=new_x)
    torch.add(x_dot, x_acc, alpha=TAU, out=new_x_dot)
    torch.add(theta, theta_dot, alpha=TAU, out=new_theta)
    torch.add(theta_dot, theta_acc, alpha=TAU, out=new_theta_dot)
    return new


class CartPoleVecEnv:
    """``num_envs`` CartPole-v1 envs stepped together (see the module docstring).

    Args:
        num_envs: Batch size ``N``.
        seed: Seeds the reset generator; ``None`` draws a nondeterministic seed.
            ``CartPoleVecEnv(n, seed=s).reset()`` equals ``CartPoleVecEnv(n).reset(seed=s)``.
        device: Where the state lives; all returned tensors are on this device.
        render_mode: Accepted so that Gymnasium-style ``env_kwargs`` work with the
            native backend; ``render_rgb`` works whatever its value.
        mask_velocity: Observe only the cart position and the pole angle ``[N, 2]`` (the
            velocities are hidden: a partially observed task that needs memory, the
            standard test of recurrent policies). The dynamics are unchanged.
    """

    spec: EnvSpec = CARTPOLE_SPEC
    #: Scratch storage, redrawn every step before it is read: not state.
    transient_attrs: ClassVar[frozenset[str]] = frozenset({"_fresh"})
    #: ``step`` runs device ops on state it updates in place, with no host read: a CUDA
    #: graph can capture it (``ppo.cuda_graph``).
    graph_safe: ClassVar[bool] = True

    def __init__(
        self,
        num_envs: int,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        render_mode: str | None = None,
        mask_velocity: bool = False,
    ) -> None:
        if num_envs < 1:
            raise EnvError(f"num_envs must be >= 1, got {num_envs}")
        if render_mode not in (None, "rgb_array"):
            raise EnvError(
                f"CartPoleVecEnv supports render_mode None or 'rgb_array', got {render_mode!r}"
            )
        self.num_envs = num_envs
        self.mask_velocity = mask_velocity
        if mask_velocity:
            self.spec = MASKED_CARTPOLE_SPEC
        self.device = torch.device(device)
        self.render_mode = render_mode
        self._generator = torch.Generator(self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(derive_seed(seed, STREAM))
        self._state = torch.zeros((num_envs, 4), dtype=torch.float32, device=self.device)
        self._steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._one = torch.ones_like(self._steps)
        self._max_steps = torch.tensor(MAX_EPISODE_STEPS, device=self.device)
        self._fresh = torch.empty_like(self._state)  # reset candidates, redrawn every step
        limits = [X_LIMIT, math.inf, THETA_LIMIT, math.inf]  # velocities never terminate
        self._limits = torch.tensor(limits, device=self.device)
        self._needs_reset = True

    def reset(self, seed: int | None = None) -> Tensor:
        """Start new episodes in every env; ``seed`` reseeds the shared generator."""
        if seed is not None:
            self._generator.manual_seed(derive_seed(seed, STREAM))
        self._state.uniform_(-RESET_BOUND, RESET_BOUND, generator=self._generator)
        self._steps.zero_()
        self._needs_reset = False
        return self._observe(self._state)

    def _observe(self, state: Tensor) -> Tensor:
        """A new tensor: the state, or its positions (x, theta) with mask_velocity."""
        return state[:, 0::2].clone() if self.mask_velocity else state.clone()

    def step(self, actions: Tensor) -> StepResult:
        """Advance every env one step with ``actions`` (``[N]`` ints in {0, 1})."""
        if self._needs_reset:
            raise EnvError("CartPoleVecEnv.step() called before reset(); call env.reset() first")
        if actions.shape != self._steps.shape:
            raise EnvError(
                f"expected actions of shape ({self.num_envs},), got {tuple(actions.shape)}"
            )
        final_obs = step_physics(self._state, actions.to(self.device))
        # |x| > 2.4 or |theta| > 12 degrees.
        terminated = final_obs.abs().gt(self._limits).any(dim=1)
        self._steps += self._one  # a tensor operand: cheaper than the Python int 1
        done = self._steps.ge(self._max_steps) | terminated
        # The time limit fires on the 500th step, but a terminal state wins: it needs no
        # bootstrap. terminated is a subset of done, so xor leaves "truncated only".
        truncated = done ^ terminated
        # Drawing a reset state for every env each step, then selecting, keeps the step
        # free of data-dependent shapes and host syncs (cheaper than nonzero() on GPU).
        self._fresh.uniform_(-RESET_BOUND, RESET_BOUND, generator=self._generator)
        torch.where(done.unsqueeze(1), self._fresh, final_obs, out=self._state)
        self._steps.masked_fill_(done, 0)
        reward = torch.ones(self.num_envs, device=self.device)  # +1 on every step, terminal too
        return StepResult(self._observe(self._state), reward, terminated, truncated,
                          self._observe(final_obs) if self.mask_velocity else final_obs)

    @property
    def generators(self) -> tuple[torch.Generator, ...]:
        """The generators ``step`` draws from (registered with a CUDA graph that captures it)."""
        return (self._generator,)

    def get_state(self) -> dict[str, Any]:
        """Physics state, episode step counters and generator state: enough to resume exactly."""
        return {
            "state": self._state.clone(),
            "steps": self._steps.clone(),
            "generator": self._generator.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned (possibly from another env instance)."""
        new_state = torch.as_tensor(state["state"], dtype=torch.float32, device=self.device)
        if new_state.shape != self._state.shape:
            raise EnvError(
                f"saved CartPole state has shape {tuple(new_state.shape)} but this env has "
                f"num_envs={self.num_envs}; create the env with the saved num_envs"
            )
        self._state.copy_(new_state)
        self._steps.copy_(torch.as_tensor(state["steps"], device=self.device))
        # A state saved from another kind of device cannot be set: reseed instead.
        set_generator_state(self._generator, state["generator"],
                            derive_seed(self._generator.initial_seed(), "resumed"))
        self._needs_reset = False

    def close(self) -> None:
        """Nothing to release: the env is plain tensors."""

    def render_rgb(self, index: int = 0) -> np.ndarray:
        """A ``[400, 600, 3]`` uint8 frame of env ``index``, drawn with numpy only."""
        x, _, theta, _ = self._state[index].tolist()
        return draw_cartpole(x, theta)


_HEIGHT, _WIDTH = 400, 600
_SCALE = _WIDTH / (2 * X_LIMIT)  # pixels per metre: the track spans the frame
_CART_W, _CART_H, _POLE_W = 50.0, 30.0, 10.0
_CART_Y = _HEIGHT - 100.0  # row of the cart's centre (Gymnasium draws y upwards)


@functools.cache
def _pixel_grid() -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.mgrid[0:_HEIGHT, 0:_WIDTH].astype(np.float32)
    return rows, cols


def draw_cartpole(x: float, theta: float) -> np.ndarray:
    """Draw a cart at position ``x`` with its pole at angle ``theta`` (radians, 0 = up)."""
    frame = np.full((_HEIGHT, _WIDTH, 3), 255, dtype=np.uint8)
    frame[int(_CART_Y), :] = 0  # track
    cart_x = x * _SCALE + _WIDTH / 2
    top, left = int(_CART_Y - _CART_H / 2), int(cart_x - _CART_W / 2)
    frame[max(top, 0) : top + int(_CART_H), max(left, 0) : max(left + int(_CART_W), 0)] = 0

    # Pole: all pixels within half its width of the segment from the axle to the tip.
    axle = np.array([_CART_Y - _CART_H / 4, cart_x], dtype=np.float32)
    direction = np.array([-math.cos(theta), math.sin(theta)], dtype=np.float32)
    length = _SCALE * 2 * POLE_HALF_LENGTH
    # Only the box around the segment can hold pole pixels: testing it alone, not the whole
    # frame, makes a frame ~10x cheaper (the end-of-run video draws hundreds).
    tip = axle + length * direction
    pad = _POLE_W / 2 + 1
    r0, r1 = (max(int(min(axle[0], tip[0]) - pad), 0),
              min(int(max(axle[0], tip[0]) + pad) + 1, _HEIGHT))
    c0, c1 = (max(int(min(axle[1], tip[1]) - pad), 0),
              min(int(max(axle[1], tip[1]) + pad) + 1, _WIDTH))
    if r0 >= r1 or c0 >= c1:
        return frame  # the pole is outside the frame
    rows, cols = _pixel_grid()
    rel_r, rel_c = rows[r0:r1, c0:c1] - axle[0], cols[r0:r1, c0:c1] - axle[1]
    along = np.clip(rel_r * direction[0] + rel_c * direction[1], 0.0, length)
    dist2 = (rel_r - along * direction[0]) ** 2 + (rel_c - along * direction[1]) ** 2
    frame[r0:r1, c0:c1][dist2 <= (_POLE_W / 2) ** 2] = (202, 152, 101)
    return frame
