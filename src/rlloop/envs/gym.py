"""Any Gymnasium environment behind rlloop's ``VecEnv`` interface.

Gymnasium's own vector envs do the batching (``SyncVectorEnv`` in-process, the same with
one thread per env, or ``AsyncVectorEnv`` with one subprocess per env). All run in
``SAME_STEP`` autoreset mode, which matches rlloop's contract: the observation returned
for a finished env is already the first one of its next episode, and the last
observation of the finished episode arrives in ``infos["final_obs"]`` (an object array, valid where
``infos["_final_obs"]`` is set). Gymnasium's default (``NEXT_STEP``) would instead
return the final observation and spend the following step on the reset.

Reading an env's spaces into an ``EnvSpec``, and refusing one that cannot be built or
encoded, is :mod:`rlloop.envs.gym_spec`; the envs' state in a checkpoint is
:mod:`rlloop.envs.gym_state`; this module steps the made envs.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch import Tensor

import rlloop.envs.atari as atari
from rlloop.envs.core import (
    StepResult,
)
from rlloop.envs.gym_async import GuardedAsyncVectorEnv
from rlloop.envs.gym_spec import (
    MASK_KEY,
    construction_errors,
    describe_space,
    dict_mask_dims,
    made_spec,
    probe_action_mask,
    spec_from_gym,
)
from rlloop.envs.gym_state import restore_vector_env_state, vector_env_state
from rlloop.envs.gym_threads import ThreadedVectorEnv
from rlloop.errors import EnvError, RlloopError
from rlloop.system.devices import arrays_to_device
from rlloop.system.seeding import derive_seed
from rlloop.system.signals import StopInterrupted, interrupted


def find_gym_env(env: Any) -> GymVecEnv | None:
    """The Gymnasium env under ``env``'s wrappers (it knows how observations flatten and
    encode, and how actions map onto its spaces), or None for an env that is none."""
    while not isinstance(env, GymVecEnv):
        if not hasattr(env, "env"):
            return None
        env = env.env
    return env


#: Raised by rlloop itself around the env (async workers that failed, a stop signal while
#: waiting for them): already one clear line, passed on as they are.
_PASSED_ON = (RlloopError, StopInterrupted)


class GymVecEnv:
    """``num_envs`` copies of a Gymnasium env as a ``VecEnv``.

    Observations become float32 tensors (Box as-is, Discrete one-hot; image Boxes stay
    uint8); Discrete actions
    are ``[N]`` int64 in ``[0, n)``, Box actions ``[N, *shape]`` float32, clipped to the
    bounds before stepping. When Gymnasium reports both ``terminated`` and ``truncated``
    only ``terminated`` is kept (a terminal state needs no bootstrap).

    ``get_state`` saves random-number state (each sub-env's ``np_random`` and the
    action spaces' generators). Gymnasium envs expose no general way to read or write
    their physics; where every sub-env has a numpy ``unwrapped.state`` (classic control:
    CartPole, Pendulum, Acrobot, MountainCar) it is saved too, with the time-limit step
    counts, and ``set_state`` continues mid-episode. Otherwise resume with
    ``set_state(s)`` then ``reset()``: the new episodes then unfold exactly as they would
    have in the saved run after a reset.

    Args:
        env_id: A registered Gymnasium id.
        num_envs: Batch size ``N``.
        seed: Used by the first ``reset()`` that gets no seed of its own; sub-env ``i``
            is seeded with ``seed + i``, as in Gymnasium.
        asynchronous: One subprocess per env (``AsyncVectorEnv``); worth it only when a
            single env step is slow compared with inter-process communication. A worker
            that raises, dies or hangs raises ``EnvWorkerError`` and closes the workers;
            ``get_state`` then returns ``{"lost": why}`` (see
            :mod:`rlloop.envs.gym_async`).
        step_timeout: Seconds an async worker may take to answer (``None``: no limit).
        threads: Step the sub-envs at once, one thread each (``ThreadedVectorEnv``, see
            :mod:`rlloop.envs.gym_threads`); worth it when an env step waits with the
            GIL released (a simulator in C, a socket, a sleep).
        env_kwargs: Keyword arguments for ``gymnasium.make`` (``render_mode``,
            ``max_episode_steps``, env-specific options).
        device: Where the returned tensors are. The envs step on the host; off the CPU,
            each step's whole batch crosses in one (pinned, non-blocking) copy.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int | None = None,
        asynchronous: bool = False,
        env_kwargs: dict[str, Any] | None = None,
        device: str | torch.device = "cpu",
        step_timeout: float | None = 60.0,
        threads: bool = False,
    ) -> None:
        if num_envs < 1:
            raise EnvError(f"num_envs must be >= 1, got {num_envs}")
        kwargs = dict(env_kwargs or {})
        # Async workers start from a forkserver, not from a copy of this process: hand
        # them the registered spec, so envs registered at run time work there too
        # ("module:Env-v0" ids import their module in the worker instead).
        target = gymnasium.registry.get(env_id, env_id) if asynchronous else env_id
        env_fns = [functools.partial(atari.make, target, **kwargs)] * num_envs
        with construction_errors(env_id, kwargs):
            self._vec: SyncVectorEnv | GuardedAsyncVectorEnv = (
                GuardedAsyncVectorEnv(env_fns, env_id=env_id, step_timeout=step_timeout)
                if asynchronous
                else ThreadedVectorEnv(env_fns) if threads
                else SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
            )
        try:
            obs_space = self._vec.single_observation_space
            act_space = self._vec.single_action_space
            if isinstance(self._vec, SyncVectorEnv):
                gym_spec = self._vec.envs[0].spec
                # Sub-env 0's first reset, seeded or not, happens later and reseeds it.
                mask_dims = probe_action_mask(env_id, self._vec.envs[0])
            else:  # read here: a worker cannot pickle back an entry point pickled by value
                gym_spec, mask_dims = made_spec(env_id, env_fns[0])
            self.spec = spec_from_gym(env_id, gym_spec, obs_space, act_space, mask_dims)
        except BaseException:
            self._vec.close()
            raise
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.render_mode: str | None = kwargs.get("render_mode")
        self._pending_seed = seed
        self._obs_space = obs_space
        self._act_space = act_space
        self._mask_in_obs = bool(dict_mask_dims(env_id, obs_space, act_space))
        self._make_one = env_fns[0]
        self._copy: gymnasium.Env[Any, Any] | None = None
        self.last_infos: dict[str, Any] = {}

    # -- conversions ---------------------------------------------------------------

    def _obs_array(self, obs: Any, mask: Any = None) -> np.ndarray:
        """``[B, *obs_shape]`` float32 from a batch of Gymnasium observations (and their
        action masks ``[B, n]`` appended, when the spec has them: from ``info``, or from the
        observation's own ``action_mask`` entry)."""
        if self._mask_in_obs:
            mask = obs[MASK_KEY]
        if self.spec.action_mask:
            flat = self._obs_array_plain(obs).reshape(len(mask), -1)
            return np.concatenate([flat, np.asarray(mask, dtype=np.float32)], axis=1)
        return self._obs_array_plain(obs)

    def _obs_array_plain(self, obs: Any, space: gymnasium.Space[Any] | None = None
                         ) -> np.ndarray:
        space = self._obs_space if space is None else space
        if isinstance(space, spaces.Dict):  # entries flattened and concatenated, in order
            return np.concatenate(
                [self._obs_array_plain(obs[k], v).reshape(len(obs[k]), -1).astype(np.float32)
                 for k, v in space.spaces.items() if k != MASK_KEY], axis=1)
        if isinstance(space, spaces.Discrete):
            index = np.asarray(obs, dtype=np.int64) - int(space.start)
            one_hot: np.ndarray = np.eye(int(space.n), dtype=np.float32)[index]
            return one_hot
        if self.spec.image_obs:  # frames stay uint8 up to the network (4x fewer bytes)
            return np.asarray(obs, dtype=np.uint8)
        return np.asarray(obs, dtype=np.float32)

    @property
    def discrete_obs(self) -> bool:
        """Whether observations are Discrete indices (``step`` one-hot encodes them)."""
        return isinstance(self._obs_space, spaces.Discrete)

    def flatten_obs(self, obs: Any) -> tuple[np.ndarray, bool]:
        """Rows ``[B, *obs_shape]``, as ``step`` returns them, of one Dict observation or
        of a batch of ``B`` (each entry stacked), or of one Discrete index or a batch of
        them, and whether it was one (``predict``)."""
        space = self._obs_space
        if isinstance(space, spaces.Discrete):
            index = np.asarray(obs)
            if index.ndim > 1 or index.dtype.kind not in "iu" or not all(
                    space.contains(int(i)) for i in index.reshape(-1)):
                raise EnvError(f"{self.spec.env_id} observations are indices in "
                               f"{describe_space(space)}; got {obs!r}")
            return self._obs_array_plain(index.reshape(-1)), index.ndim == 0
        if not isinstance(space, spaces.Dict):
            raise EnvError(f"{self.spec.env_id} has {describe_space(space)} observations, "
                           "not a Dict; pass an array")
        missing = sorted(set(space.spaces) - set(obs))
        if missing:
            raise EnvError(f"the observation lacks the entries {missing} of {self.spec.env_id}'s "
                           f"{describe_space(space)}; pass all of them")
        arrays = {k: np.asarray(obs[k]) for k in space.spaces}
        expected = {k: tuple(v.shape or ()) for k, v in space.spaces.items()}
        not_one = [k for k, a in arrays.items() if a.shape != expected[k]]
        single = not not_one
        if not single:  # a batch: every entry [B, *its shape], one B
            not_rows = [k for k, a in arrays.items() if a.shape[1:] != expected[k] or not a.ndim]
            sizes = {a.shape[0] for a in arrays.values() if a.ndim}
            if not_rows or len(sizes) > 1:
                # the entry off in the reading (one observation or a batch) most fit
                key = min(not_one, not_rows or not_one, key=len)[0]
                raise EnvError(f"the observation's entry {key!r} has shape "
                               f"{arrays[key].shape}; {self.spec.env_id} takes "
                               f"{expected[key]} for one observation, or (B, *that) for a batch "
                               "(the same B for every entry)")
        for key, entry in space.spaces.items():
            if isinstance(entry, spaces.Discrete) and not (
                    arrays[key].dtype.kind in "iu"
                    and all(entry.contains(int(i)) for i in arrays[key].reshape(-1))):
                raise EnvError(f"the observation's entry {key!r} holds indices in "
                               f"{describe_space(entry)}; got {obs[key]!r}")
        batch = {k: a[None] if single else a for k, a in arrays.items()}
        return self._obs_array(batch), single

    def _to_tensors(self, *arrays: np.ndarray) -> list[Tensor]:
        return arrays_to_device(arrays, self.device)

    def _to_gym_actions(self, actions: Tensor) -> np.ndarray:
        return self.env_actions(actions.detach().cpu().numpy(), self.num_envs)

    def action_offset(self) -> np.ndarray | None:
        """The ``start`` of a Discrete or MultiDiscrete action space that does not count
        from 0 (added to the policy's indices, as :meth:`env_actions` does), else None."""
        space = self._act_space
        if isinstance(space, spaces.Discrete | spaces.MultiDiscrete) and np.any(space.start):
            return np.asarray(space.start, dtype=np.int64)
        return None

    def env_actions(self, array: np.ndarray, rows: int | None = None) -> np.ndarray:
        """Policy actions ``[B, *act]`` as this env's Gymnasium action space takes them
        (each step, and ``predict``): Discrete and MultiDiscrete indices shifted by the
        space's ``start``, MultiBinary as int8, Box actions clipped to its bounds in its
        dtype. ``rows``: the ``B`` expected (default: ``len(array)``)."""
        space = self._act_space
        rows = len(array) if rows is None else rows
        if isinstance(space, spaces.Discrete):
            if array.shape != (rows,):
                raise EnvError(f"expected Discrete actions of shape ({rows},), got {array.shape}")
            return array.astype(np.int64) + int(space.start)
        if isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary):
            if array.shape != (rows, *space.shape):
                raise EnvError(f"expected {type(space).__name__} actions of shape "
                               f"{(rows, *space.shape)}, got {array.shape}")
            if isinstance(space, spaces.MultiBinary):
                return array.astype(np.int8)
            return array.astype(np.int64) + space.start
        assert isinstance(space, spaces.Box)
        if array.shape != (rows, *space.shape):
            raise EnvError(f"expected Box actions of shape {(rows, *space.shape)}, got "
                           f"{array.shape}")
        # Policies with unbounded Gaussians produce out-of-range actions; clipping here
        # rather than in every env keeps the loss computed on the unclipped sample.
        clipped: np.ndarray = np.clip(array, space.low, space.high)
        return clipped.astype(space.dtype)

    # -- VecEnv --------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> Tensor:
        """Reset all sub-envs; ``seed`` (or the constructor's, once) seeds env ``i`` with
        ``seed + i`` and the action spaces with ``seed + num_envs``."""
        if seed is None:
            seed, self._pending_seed = self._pending_seed, None
        if seed is not None:
            # Not ``seed`` itself: equal seeds give equal PCG64 streams, which would make
            # sampled actions replay env 0's reset noise.
            self._vec.action_space.seed(seed + self.num_envs)
            self._vec.single_action_space.seed(seed + self.num_envs)
        try:
            obs, infos = self._vec.reset(seed=seed)
        except _PASSED_ON:
            raise
        except Exception as e:
            raise self._env_failed("reset", e) from e
        return self._to_tensors(self._obs_array(obs, self._mask(infos)))[0]

    def _mask(self, infos: dict[str, Any], rows: Any = slice(None)) -> Any:
        """The ``rows``' action masks ``[B, n]`` from vector ``infos`` (None: no masks, or
        masks that come inside the observations)."""
        if not self.spec.action_mask or self._mask_in_obs:
            return None
        present = infos.get("_action_mask")
        if "action_mask" not in infos or (present is not None
                                          and not np.all(np.asarray(present)[rows])):
            raise EnvError(f"{self.spec.env_id} stopped returning info['action_mask']; return "
                           "it from every reset and step")
        masks = infos["action_mask"]
        if np.asarray(masks).dtype == np.dtype(object):  # lists, kept as Python objects
            masks = np.stack([np.asarray(m) for m in masks])
        return np.asarray(masks)[rows]

    def step(self, actions: Tensor) -> StepResult:
        """Step all sub-envs; finished ones are reset in the same call (see module doc).

        Where no episode ended, ``final_obs`` is ``obs`` itself (the same tensor): there
        is nothing else to copy or transfer.
        """
        gym_actions = self._to_gym_actions(actions)
        try:
            obs, reward, terminated, truncated, infos = self._vec.step(gym_actions)
        except _PASSED_ON:
            raise
        except Exception as e:
            raise self._env_failed("step", e) from e
        self.last_infos = infos  # Gymnasium's vector infos (see goal_env.step_infos)
        obs_np = self._obs_array(obs, self._mask(infos))
        terminated = np.asarray(terminated, dtype=bool)
        arrays = [obs_np, np.asarray(reward, dtype=np.float32), terminated,
                  np.asarray(truncated, dtype=bool) & ~terminated]
        ended = np.flatnonzero(infos.get("_final_obs", ()))
        if ended.size:
            final_np = obs_np.copy()
            # (masks from info; a Dict observation's own come with its final_obs)
            final_masks = None if not self.spec.action_mask or self._mask_in_obs else \
                self._mask(infos["final_info"], ended)
            final_np[ended] = self._obs_array(
                _stack([infos["final_obs"][i] for i in ended]), final_masks)
            arrays.append(final_np)
        tensors = self._to_tensors(*arrays)
        obs_t, reward_t, terminated_t, truncated_t = tensors[:4]
        return StepResult(obs=obs_t, reward=reward_t, terminated=terminated_t,
                          truncated=truncated_t, final_obs=tensors[4] if ended.size else obs_t)

    def _env_failed(self, method: str, e: Exception) -> EnvError | KeyboardInterrupt:
        """The env's own code raised: one line naming it (the cause stays chained). A
        second stop signal that a C extension turned into an error of its own (Box2D's
        SWIG layer makes a TypeError of it) stays the interrupt it was."""
        if interrupted():
            return KeyboardInterrupt()
        first = str(e).splitlines()[0] if str(e) else ""
        return EnvError(f"env {self.spec.env_id!r} raised {type(e).__name__} in {method}(): "
                        f"{first}; fix the env (gymnasium.make({self.spec.env_id!r}) "
                        f"reproduces it without rlloop)")

    def get_state(self) -> dict[str, Any]:
        """RNG states, and physics where exposed (see the class docstring); only
        ``{"lost": why}`` once async workers failed (their state died with them)."""
        return vector_env_state(self._vec)

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore the RNG states from ``get_state``, and the physics where it was saved
        (``state_restored`` then says the envs continue their episodes; else their
        episodes restart at the next ``reset()``). A lost state (workers that failed)
        leaves the envs as they are."""
        self.state_restored = False
        if "lost" in state:  # workers had failed: their RNG states were not saved
            if self._pending_seed is not None:  # not the first episodes' seeds again
                self._pending_seed = derive_seed(self._pending_seed, "resumed-after-loss") \
                    % 2**31
            return
        env_rngs = state["env_rngs"]
        if len(env_rngs) != self.num_envs:
            raise EnvError(
                f"saved state holds {len(env_rngs)} sub-envs but this env has "
                f"num_envs={self.num_envs}; create the env with the saved num_envs"
            )
        self.state_restored = restore_vector_env_state(self._vec, state)
        self._pending_seed = None

    def one_env(self) -> gymnasium.Env[Any, Any]:
        """Sub-env 0 where the sub-envs run in this process, else a copy made here: what
        an env's own methods (a goal env's ``compute_reward``) are called on."""
        if isinstance(self._vec, SyncVectorEnv):  # the threaded backend's too
            return self._vec.envs[0]
        if self._copy is None:
            self._copy = self._make_one()
        return self._copy

    def close(self) -> None:
        """Close the sub-envs (and join the worker processes of the async backend)."""
        self._vec.close()
        if self._copy is not None:
            self._copy.close()

    @property
    def metadata(self) -> dict[str, Any]:
        """The Gymnasium env's metadata (its ``render_fps`` is a video's frame rate)."""
        return dict(getattr(self._vec, "metadata", None) or {})

    def render_rgb(self) -> np.ndarray:
        """``[H, W, 3]`` uint8 frame of sub-env 0; needs ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array":
            raise EnvError(
                f"render_rgb() needs frames but the env was made with render_mode="
                f"{self.render_mode!r}; pass env_kwargs={{'render_mode': 'rgb_array'}}"
            )
        if isinstance(self._vec, SyncVectorEnv):
            frame = self._vec.envs[0].render()
        else:
            frame = self._vec.call("render")[0]
        return np.asarray(frame, dtype=np.uint8)


def _stack(observations: list[Any]) -> Any:
    """One batch of single observations (Dict ones key by key)."""
    if isinstance(observations[0], dict):
        return {k: np.stack([np.asarray(o[k]) for o in observations])
                for k in observations[0]}
    return np.stack([np.asarray(o) for o in observations])

