"""The step processor: batched env steps in, replay-ready (n-step) transitions out.

For ``n > 1`` each env keeps a window of its last ``n`` steps. A step emits, per env,
the n-step transition that starts at the oldest step of a full window, and when an
episode ends it emits every pending transition of that env, each shorter than ``n``:

- termination cuts: ``terminated=True``, the target does not bootstrap;
- truncation (time limit) bootstraps from the final observation: ``terminated=False``,
  ``discount = gamma**k`` for ``k`` summed rewards.

All envs step together, so one ring position serves every env; only the per-env count
of pending steps differs. See Sutton & Barto (2018), section 7.1, for n-step returns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlloop.data.transitions import Transitions


class NStepProcessor:
    """Turns ``[N, ...]`` env steps into ``Transitions`` for a replay buffer.

    Args:
        num_envs: ``N``, envs stepped together.
        n: Rewards summed per transition; 1 gives plain one-step transitions.
        gamma: Discount factor.
        obs_shape: Shape of one observation.
        action_shape: Shape of one action; ``()`` for discrete actions.
        action_dtype: ``torch.int64`` for discrete actions, a float dtype otherwise.
        device: Where the window lives (that of the env tensors).
        obs_dtype: dtype of observations.
    """

    def __init__(
        self,
        num_envs: int,
        n: int,
        gamma: float,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        action_dtype: torch.dtype,
        *,
        device: torch.device | str = "cpu",
        obs_dtype: torch.dtype = torch.float32,
    ) -> None:
        if num_envs < 1 or n < 1:
            raise ValueError(f"need num_envs >= 1 and n >= 1, got num_envs={num_envs}, n={n}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.num_envs, self.n, self.gamma = num_envs, n, gamma
        self.obs_shape, self.action_shape = tuple(obs_shape), tuple(action_shape)
        self.device = torch.device(device)
        # Window [n, N, ...], written circularly at slot self._pos.
        self._obs = torch.zeros((n, num_envs, *obs_shape), dtype=obs_dtype, device=self.device)
        self._action = torch.zeros(
            (n, num_envs, *action_shape), dtype=action_dtype, device=self.device
        )
        self._reward = torch.zeros((n, num_envs), dtype=torch.float32, device=self.device)
        self._count = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._pos = 0
        steps = torch.arange(n, device=self.device)
        self._age = n - steps  # age in steps of chronological slot i (oldest first): n - i
        # Ring slots oldest first when the newest step is at `pos`: the slice
        # [pos + 1, pos + 1 + n) of 0..n-1 twice over (a view; O(n) memory, not n**2).
        self._slots = torch.arange(2 * n, device=self.device) % n
        self._discount = torch.tensor(
            [gamma**k for k in range(n + 1)], dtype=torch.float32, device=self.device
        )

    def process(
        self,
        obs: Tensor,
        action: Tensor,
        reward: Tensor,
        next_obs: Tensor,
        terminated: Tensor,
        truncated: Tensor,
    ) -> Transitions:
        """One batched env step in, the transitions it completes out.

        Args:
            obs: ``[N, *obs_shape]`` observation the action was taken in.
            action: ``[N, *action_shape]``.
            reward: ``[N]``.
            next_obs: ``[N, *obs_shape]``, the *final* observation for envs whose
                episode ended (``StepResult.final_obs``), the next one otherwise.
            terminated: ``[N]`` bool.
            truncated: ``[N]`` bool.

        Returns:
            ``Transitions`` of ``[M, ...]``, ``0 <= M <= N * n``, ordered by env and,
            within an env, oldest start first. For ``n == 1`` (``M == N``) the input
            tensors are returned as they are, not copied.
        """
        self._check_step(obs, action, reward, next_obs, terminated, truncated)
        if self.n == 1:
            return Transitions(
                obs=obs,
                action=action,
                reward=reward.to(torch.float32),
                next_obs=next_obs,
                terminated=terminated,
                discount=self._discount[1].repeat(self.num_envs),
            )
        n, pos = self.n, self._pos
        self._obs[pos], self._action[pos], self._reward[pos] = obs, action, reward
        self._count += 1
        done = terminated | truncated

        order = self._slots[pos + 1 : pos + 1 + n]
        rewards = self._reward[order]
        returns = torch.empty_like(rewards)  # [n, N]: discounted sum from slot i to now
        acc = torch.zeros_like(rewards[0])
        for k in range(n - 1, -1, -1):
            acc = rewards[k] + self.gamma * acc
            returns[k] = acc

        age = self._age[:, None]
        pending = age <= self._count  # [n, N]
        emit = pending & (done | (age == n))
        env, i = emit.T.nonzero(as_tuple=True)  # by env, then oldest first
        slot = order[i]
        out = Transitions(
            obs=self._obs[slot, env],
            action=self._action[slot, env],
            reward=returns[i, env],
            next_obs=next_obs[env],
            terminated=terminated[env],
            discount=self._discount[self._age[i]],
        )
        # A full window has emitted its oldest step; a finished episode starts empty.
        self._count = torch.where(done, 0, self._count.clamp(max=n - 1))
        self._pos = (pos + 1) % n
        return out

    def reset(self) -> None:
        """Drop every pending step (e.g. after resetting all envs by hand)."""
        self._count.zero_()
        self._pos = 0

    def get_state(self) -> dict[str, Tensor | int]:
        """Window contents (copies) and counters."""
        return {
            "obs": self._obs.clone(),
            "action": self._action.clone(),
            "reward": self._reward.clone(),
            "count": self._count.clone(),
            "pos": self._pos,
        }

    def set_state(self, state: dict[str, Tensor | int]) -> None:
        """Restore what ``get_state`` returned."""
        for name in ("obs", "action", "reward", "count"):
            value, own = state[name], getattr(self, f"_{name}")
            if not isinstance(value, Tensor) or value.shape != own.shape:
                raise ValueError(
                    f"n-step state '{name}' must be a tensor of shape {tuple(own.shape)}; "
                    "was it saved with another num_envs or n?"
                )
            own.copy_(value)
        self._pos = int(state["pos"])

    def _check_step(self, obs: Tensor, action: Tensor, *flags: Tensor) -> None:
        n_env = self.num_envs
        if tuple(obs.shape) != (n_env, *self.obs_shape):
            raise ValueError(
                f"obs has shape {tuple(obs.shape)}, expected {(n_env, *self.obs_shape)}"
            )
        if tuple(action.shape) != (n_env, *self.action_shape):
            raise ValueError(
                f"action has shape {tuple(action.shape)}, expected {(n_env, *self.action_shape)}"
            )
        reward, next_obs, terminated, truncated = flags
        if next_obs.shape != obs.shape:
            raise ValueError(f"next_obs has shape {tuple(next_obs.shape)}, obs {tuple(obs.shape)}")
        for name, t in (("reward", reward), ("terminated", terminated), ("truncated", truncated)):
            if tuple(t.shape) != (n_env,):
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {(n_env,)}")
