"""What ``Model.predict`` does: observations checked and prepared as the env would give
them, actions returned as the env would step them.

An observation from a user's hand is untrusted in ways an env's is not: a Dict or Discrete
index to encode, float frames where the env gives uint8, a NaN, a batch of the wrong shape.
Each is refused in one line naming the fix before the policy runs; a recurrent policy's
memory starts afresh where ``episode_start`` says an episode begins.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlloop.algorithms import AlgorithmBase
from rlloop.envs.core import Box
from rlloop.envs.gym import find_gym_env
from rlloop.errors import ConfigError


def predict_actions(actor: AlgorithmBase, obs: Any, deterministic: bool,
                    episode_start: bool | np.ndarray) -> np.ndarray:
    """The action ``actor`` takes for one observation, or actions for a batch
    ``[B, *obs_shape]`` (see :meth:`rlloop.api.Model.predict`)."""
    spec = actor.settings.spec
    if isinstance(obs, list | tuple) and obs and all(isinstance(o, Mapping) for o in obs):
        raise ConfigError("predict takes one Dict observation, or a batch as one dict of "
                          "stacked entries ({key: array [B, *entry shape]}), not a list "
                          "of dicts: stack each entry (np.stack([o[key] for o in obs]))")
    if isinstance(obs, Mapping) or _indices_of_discrete_obs(actor.env, obs):
        # Flattened (a Dict) or one-hot encoded (Discrete indices) as the env does it.
        rows, one = _gym_env(actor.env).flatten_obs(obs)
        obs = rows[0] if one else rows
    # uint8 frames stay uint8: pixel encoders scale them.
    dtype = np.uint8 if spec.image_obs else np.float32
    if spec.image_obs:
        _check_frames(obs)
    expects = (f"predict expects an observation of shape {spec.obs_shape} "
               f"({np.dtype(dtype).name}) or a batch of shape "
               f"(B, {', '.join(map(str, spec.obs_shape))})")
    try:
        array = np.asarray(obs, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:  # strings, ragged rows, objects
        raise ConfigError(f"{expects}, got {reprlib.repr(obs)}, which is no numeric array "
                          f"of one shape ({e})") from None
    single = array.shape == spec.obs_shape
    if not single and array.shape[1:] != spec.obs_shape:
        mask = (f" ({spec.obs_shape[0] - spec.action_mask} observation values, then the "
                f"{spec.action_mask} 0/1 entries of the env's action mask: append "
                "info['action_mask'])") if spec.action_mask else ""
        raise ConfigError(f"{expects}{mask}, got {array.shape}")
    if dtype is np.float32:  # uint8 frames hold neither NaN nor inf
        # NaN makes a NaN action; inf too, unless the saved normaliser clips it (a
        # lidar's "no hit").
        bad = np.isnan(array) if actor.obs_stats is not None else ~np.isfinite(array)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ConfigError(f"observation holds non-finite values (first at index "
                              f"{where}: {array[where]}); the policy's action would be "
                              "NaN: pass finite observations (replace or clip inf/nan "
                              "first)")
    x = torch.as_tensor(array, device=actor.device)
    batch = x.unsqueeze(0) if single else x
    if actor.obs_stats is not None:  # what the eval env's NormalizeObservation does
        batch = actor.obs_stats.normalize(batch)
    starts = np.asarray(episode_start, dtype=bool)
    if starts.shape not in ((), (len(batch),)):
        raise ConfigError(f"episode_start must be one bool or one per observation "
                          f"({len(batch)}), got shape {starts.shape}")
    starts = np.broadcast_to(starts, (len(batch),))
    if starts.any():
        actor.begin_episodes(torch.as_tensor(starts.copy(), device=actor.device))
    actions = actor.act(batch, deterministic).cpu().numpy()
    gym = find_gym_env(actor.env)
    if gym is not None:  # as the env steps them: index offsets (start), clipping
        actions = gym.env_actions(actions)
    elif isinstance(spec.action_space, Box):  # native envs clip them too
        low = np.asarray(spec.action_space.low, np.float32).reshape(spec.action_space.shape)
        high = np.asarray(spec.action_space.high, np.float32).reshape(
            spec.action_space.shape)
        actions = np.clip(actions, low, high)
    return actions[0] if single else actions


def _check_frames(obs: Any) -> None:
    """Image observations are the env's uint8 frames (0..255); float frames are refused
    unless they hold whole numbers in 0..255 (a [0, 1] float frame cast to uint8 would be
    black)."""
    try:
        array = np.asarray(obs)
    except (ValueError, TypeError):  # predict's own check names it
        return
    if array.dtype.kind != "f" or not array.size:
        return
    low, high = float(np.min(array)), float(np.max(array))
    if not (low >= 0 and high <= 255 and bool(np.all(array == np.round(array)))):
        raise ConfigError(f"image observations are uint8 frames 0..255, as the env gives "
                          f"them; got {array.dtype} values in [{low:g}, {high:g}]: pass the "
                          "env's frames (frames scaled to [0, 1]: (x * 255).round() as uint8)")


def _indices_of_discrete_obs(env: Any, obs: Any) -> bool:
    """Whether ``obs`` holds integer indices of a Discrete observation space (the env's
    own observations, which predict one-hot encodes; float rows are taken as encoded)."""
    gym = find_gym_env(env)
    if gym is None or not gym.discrete_obs:
        return False
    try:
        return np.asarray(obs).dtype.kind in "iu"
    except (ValueError, TypeError):  # ragged rows: predict's own check names them
        return False


def _gym_env(env: Any) -> Any:
    """:func:`find_gym_env`, or ``ConfigError`` for an env that is none."""
    gym = find_gym_env(env)
    if gym is None:
        raise ConfigError(f"predict takes a Dict observation only from a Gymnasium env, "
                          f"not a {type(env).__name__}; pass the flattened row instead")
    return gym
