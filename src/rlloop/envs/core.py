"""The one batched environment interface every rlloop env speaks.

A ``VecEnv`` holds ``num_envs`` copies of an environment and steps them all at
once on tensors. Episodes reset automatically *in the same step* they end: the
observation returned for a finished env is the first observation of its next
episode, and the last observation of the finished episode is kept in
``StepResult.final_obs`` so that truncated episodes can be bootstrapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from rlloop.errors import EnvError as EnvError  # defined torch-free, for the CLI


@dataclass(frozen=True)
class Discrete:
    """``n`` actions, encoded as int64 indices in ``[0, n)``."""

    n: int


@dataclass(frozen=True)
class Box:
    """Continuous values in ``[low, high]`` per dimension, encoded as float32."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    shape: tuple[int, ...]

    @property
    def dim(self) -> int:
        size = 1
        for s in self.shape:
            size *= s
        return size


@dataclass(frozen=True)
class MultiDiscrete:
    """One index per entry of ``nvec``, actions int64 ``[len(nvec)]`` with entry ``i`` in
    ``[0, nvec[i])`` (a factorised categorical policy, one head per entry)."""

    nvec: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.nvec),)

    @property
    def n(self) -> int:
        """Logits of the factorised policy (the sum of ``nvec``)."""
        return sum(self.nvec)


@dataclass(frozen=True)
class MultiBinary:
    """``n`` independent on/off choices, actions int64 ``[n]`` of 0 or 1 (a Bernoulli
    policy per entry)."""

    n: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n,)


ActionSpace = Discrete | Box | MultiDiscrete | MultiBinary


@dataclass(frozen=True)
class EnvSpec:
    """What a learner needs to know about an environment.

    Attributes:
        env_id: The id the env was made from (e.g. ``"CartPole-v1"``).
        obs_shape: Shape of one observation (without the batch dimension).
        action_space: ``Discrete`` or ``Box``.
        max_episode_steps: Time limit after which episodes are truncated, if any.
        reward_threshold: Return at which the task counts as solved, if known.
        image_obs: Observations are images (a uint8 Box of 2 or 3 dims): they arrive and
            are stored as uint8, and the algorithms' encoders pick a CNN for them.
        action_mask: Number of trailing observation features that are a legal-action
            mask (1 legal, 0 not; from the env's ``info["action_mask"]`` or the
            ``action_mask`` entry of a Dict observation), 0 for none.
        obs_parts: For a ``Dict`` observation space, its entries in order as ``(key,
            shape, image)``: observations are their concatenation, flattened (Discrete
            entries one-hot, image entries as float pixel values 0-255), and encoders
            split them again; an ``action_mask`` entry is not one of them (it follows them
            as ``action_mask`` features). Empty for any other space.
    """

    env_id: str
    obs_shape: tuple[int, ...]
    action_space: ActionSpace
    max_episode_steps: int | None = None
    reward_threshold: float | None = None
    image_obs: bool = False
    action_mask: int = 0
    obs_parts: tuple[tuple[str, tuple[int, ...], bool], ...] = ()

    @property
    def obs_dtype(self) -> torch.dtype:
        """dtype of observations as the env returns them (uint8 pixels, else float32)."""
        return torch.uint8 if self.image_obs else torch.float32


class StepResult(NamedTuple):
    """One batched env step. Shapes use ``N = num_envs``.

    Attributes:
        obs: ``[N, *obs_shape]`` ``spec.obs_dtype`` (float32, uint8 for images), next
            observation; for envs whose episode
            just ended this is already the first observation of the next episode.
        reward: ``[N]`` float32.
        terminated: ``[N]`` bool, episode ended in a terminal state (no bootstrap).
        truncated: ``[N]`` bool, episode cut by a time limit (bootstrap from
            ``final_obs``). Never both true for one env.
        final_obs: ``[N, *obs_shape]`` float32, last observation of the episode that
            ended for envs with ``terminated | truncated``; equals ``obs`` elsewhere. An
            env may return ``obs`` itself (the same tensor) when no episode ended.

    All fields are on the env's device. The caller keeps them without copying, so an
    env never writes into a tensor it has returned.
    """

    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    final_obs: Tensor


@runtime_checkable
class VecEnv(Protocol):
    """A batch of environments stepped together on tensors."""

    num_envs: int
    spec: EnvSpec

    def reset(self, seed: int | None = None) -> Tensor:
        """Reset every env; ``seed`` seeds env ``i`` with ``seed + i``. Returns ``[N, *obs]``."""
        ...

    def step(self, actions: Tensor) -> StepResult:
        """Step every env with ``actions`` (``[N]`` int64 or ``[N, *act]`` float32)."""
        ...

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue exactly: RNG states and, where possible, env state.

        Values are tensors, numbers, strings, lists or dicts of these (checkpointable data).
        """
        ...

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        ...

    def close(self) -> None:
        """Release processes, files and windows."""
        ...


def sample_random_actions(space: ActionSpace, n: int, generator: torch.Generator) -> Tensor:
    """``n`` uniformly random actions from ``space`` (for random baselines and warm-up),
    on the generator's device."""
    device = generator.device
    if isinstance(space, Discrete):
        return torch.randint(space.n, (n,), generator=generator, device=device)
    if isinstance(space, MultiDiscrete | MultiBinary):
        high = torch.tensor(space.nvec if isinstance(space, MultiDiscrete) else
                            (2,) * space.n, device=device)
        u = torch.rand((n, *space.shape), generator=generator, device=device)
        return (u * high).long()
    return sample_box(space.low, space.high, space.shape, n, generator)


def sample_box(low: Any, high: Any, shape: tuple[int, ...], n: int,
               generator: torch.Generator) -> Tensor:
    """``n`` random points of the box ``[low, high]`` (Gymnasium's ``Box.sample``
    convention): uniform where both bounds are finite, normal where neither is, and
    ``low + Exp(1)`` / ``high - Exp(1)`` where only one is (never NaN)."""
    device = generator.device
    lo = torch.as_tensor(low, dtype=torch.float32, device=device).reshape(shape)
    hi = torch.as_tensor(high, dtype=torch.float32, device=device).reshape(shape)
    u = torch.rand((n, *shape), generator=generator, device=device)
    out = lo + u * (hi - lo)
    below, above = torch.isfinite(lo), torch.isfinite(hi)
    if bool((below & above).all()):
        return out
    normal = torch.randn((n, *shape), generator=generator, device=device)
    tail = -torch.log1p(-u)  # Exp(1) from the same uniforms
    out = torch.where(below & above, out, normal)
    out = torch.where(below & ~above, lo + tail, out)
    return torch.where(~below & above, hi - tail, out)
