"""A goal-conditioned env's reward function as a batched tensor function.

Gymnasium-Robotics' goal envs (Fetch, ...) and the ``GoalEnv`` convention give a Dict
observation with ``achieved_goal`` and ``desired_goal`` entries and a method
``compute_reward(achieved_goal, desired_goal, info)`` that scores batches of goals (numpy
arrays ``[B, G]`` in, ``[B]`` out). Hindsight replay calls it on relabelled goals; this
module finds it on the env and wraps it for tensors, and reads each step's info dicts
from the env for a reward that reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlloop.envs.gym import find_gym_env
from rlloop.errors import ConfigError


def goal_reward(env: Any, section: str, *, with_infos: bool = False
                ) -> Callable[..., Tensor]:
    """``env``'s ``compute_reward`` over tensors: ``(achieved [B, G], desired [B, G]) ->
    [B]`` float32 on their device, called with an empty ``info`` per row (as
    Stable-Baselines3 does by default). ``with_infos``: ``(achieved, desired, infos)``,
    ``infos`` a ``[B]`` object array of the steps' info dicts, passed on as they are
    (Stable-Baselines3's ``copy_info_dict=True``); its output is then checked at the first
    call, since no step's info exists yet to probe it with.

    Raises:
        ConfigError: ``env`` is no Gymnasium env, or has no batched ``compute_reward``.
    """
    gym_env = find_gym_env(env)
    one = gym_env.one_env().unwrapped if gym_env is not None else None
    compute = getattr(one, "compute_reward", None)
    if not callable(compute):
        raise ConfigError(f"{section}.replay=her recomputes rewards for new goals with the "
                          f"env's compute_reward(achieved_goal, desired_goal, info), which "
                          f"{env.spec.env_id} lacks; give the env that method or use "
                          f"{section}.replay=uniform")
    checked = not with_infos

    def reward(achieved: Tensor, desired: Tensor, infos: Any = None) -> Tensor:
        nonlocal checked
        given = [{} for _ in range(len(achieved))] if infos is None else infos
        out = np.asarray(compute(achieved.cpu().numpy(), desired.cpu().numpy(), given),
                         dtype=np.float32)
        if not checked:
            _check_batched(env, section, out.shape, len(achieved))
            checked = True
        return torch.as_tensor(out).to(achieved.device)

    if not with_infos:
        probe = torch.zeros((2, *_goal_shape(env)), device="cpu")
        try:
            got: Any = tuple(reward(probe, probe).shape)
        except Exception as e:
            raise ConfigError(
                f"{section}.replay=her calls {env.spec.env_id}'s compute_reward on batches "
                f"of goals ([B, G] arrays, an empty info per row), and for B=2 it raised "
                f"{type(e).__name__}: {e}; set {section}.her_copy_info=true if it reads "
                "info, else make it vectorised, as Gymnasium-Robotics' are") from None
        _check_batched(env, section, got, 2)
    return reward


def _check_batched(env: Any, section: str, got: Any, rows: int) -> None:
    if got != (rows,):
        raise ConfigError(f"{section}.replay=her calls {env.spec.env_id}'s compute_reward on "
                          f"batches of goals ([B, G] arrays, returning [B]), and for "
                          f"B={rows} it gave {got}; make it vectorised, as "
                          "Gymnasium-Robotics' are")


def step_infos(env: Any, section: str) -> Callable[[], list[dict[str, Any]]]:
    """A function that returns the info dict each sub-env's last step gave, one per env:
    for an env whose episode ended in that step, the info of its last step (Gymnasium's
    ``final_info``), not that of the reset that followed.

    Raises:
        ConfigError: ``env`` is no Gymnasium env (rlloop's native envs give no infos).
    """
    gym_env = find_gym_env(env)
    if gym_env is None:
        raise ConfigError(f"{section}.her_copy_info=true stores each step's info, and "
                          f"{env.spec.env_id} is no Gymnasium env, which gives none; set "
                          f"{section}.her_copy_info=false")
    return lambda: unbatch_infos(gym_env.last_infos, gym_env.num_envs)


def unbatch_infos(infos: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Each sub-env's own info from Gymnasium's vector ``infos`` (arrays with ``_key``
    masks of the envs that gave ``key``), for a same-step autoreset: an env whose
    episode ended gets its ``final_info``."""
    out = [_own_info(infos, i) for i in range(num_envs)]
    for i in np.flatnonzero(infos.get("_final_info", ())).tolist():
        out[i] = _own_info(infos["final_info"], i)
    return out


def _own_info(infos: Mapping[str, Any], i: int) -> dict[str, Any]:
    own: dict[str, Any] = {}
    for key, value in infos.items():
        if (key.startswith("_") and key[1:] in infos) or key in _AUTORESET_KEYS:
            continue  # a mask, or the ended episode's last step
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        own[key] = _own_info(value, i) if isinstance(value, Mapping) else value[i]
    return own


#: What a same-step autoreset adds to the infos of the env whose episode ended.
_AUTORESET_KEYS = ("final_obs", "final_info")


def _goal_shape(env: Any) -> tuple[int, ...]:
    parts = {key: shape for key, shape, _ in env.spec.obs_parts}
    return parts["achieved_goal"]
