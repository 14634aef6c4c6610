"""What a Gymnasium env is, read without stepping it: its spaces checked and described.

A Gymnasium env's spaces become rlloop's :class:`~rlloop.envs.core.EnvSpec` here (action
spaces converted, observations flattened or kept as Dict parts, an action mask found in
the observation or the reset's info), and an env that cannot be built (a missing package,
keywords its constructor refuses, a space rlloop cannot encode) is refused in one line
naming the fix. The stepping of made envs is :mod:`rlloop.envs.gym`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

import rlloop.envs.atari as atari
from rlloop.envs.core import (
    ActionSpace,
    Box,
    Discrete,
    EnvSpec,
    MultiBinary,
    MultiDiscrete,
)
from rlloop.envs.objects import is_object_env
from rlloop.errors import EnvError, RlloopError


def _one_line(space: gymnasium.Space[Any]) -> str:
    return " ".join(str(space).split())


def convert_action_space(env_id: str, space: gymnasium.Space[Any]) -> ActionSpace:
    """rlloop's description of a Gymnasium action space, or ``EnvError`` if unsupported."""
    if isinstance(space, spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        return Box(
            low=tuple(float(v) for v in space.low.reshape(-1)),
            high=tuple(float(v) for v in space.high.reshape(-1)),
            shape=tuple(space.shape),
        )
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return MultiDiscrete(tuple(int(n) for n in space.nvec))
    if isinstance(space, spaces.MultiBinary) and len(space.shape) == 1:
        return MultiBinary(int(space.shape[0]))
    raise EnvError(
        f"{env_id}: action space {_one_line(space)} is not supported (only Discrete, Box and "
        "1-d MultiDiscrete/MultiBinary); register a wrapped variant of the env that exposes "
        "one of these"
    )


#: A Dict observation's entry that holds the legal-action mask (PettingZoo's convention):
#: taken out of the encoded entries and appended as ``EnvSpec.action_mask`` features.
MASK_KEY = "action_mask"


def obs_parts_of(space: gymnasium.Space[Any]) -> tuple[tuple[str, tuple[int, ...], bool], ...]:
    """``EnvSpec.obs_parts`` of a Dict space of Box and Discrete entries (else ``()``);
    the ``action_mask`` entry is not one of them (see :func:`dict_mask_dims`)."""
    if not isinstance(space, spaces.Dict) or not all(
            isinstance(v, spaces.Box | spaces.Discrete) or k == MASK_KEY
            for k, v in space.spaces.items()):
        return ()
    return tuple((str(k), obs_shape_of(str(k), v), is_image_space(v))
                 for k, v in space.spaces.items() if k != MASK_KEY)


def dict_mask_dims(env_id: str, obs_space: gymnasium.Space[Any],
                   action_space: gymnasium.Space[Any]) -> int:
    """Size of the ``action_mask`` entry of a Dict observation space, 0 if it has none;
    ``EnvError`` when it cannot be a mask over the actions."""
    if not isinstance(obs_space, spaces.Dict) or MASK_KEY not in obs_space.spaces:
        return 0
    entry = obs_space.spaces[MASK_KEY]
    if not isinstance(action_space, spaces.Discrete):
        raise EnvError(f"{env_id}: the observation's 'action_mask' entry needs Discrete "
                       f"actions but the env has {_one_line(action_space)}; drop the entry "
                       "(gymnasium.wrappers.FilterObservation)")
    n = int(action_space.n)
    if not isinstance(entry, spaces.Box | spaces.MultiBinary) or tuple(entry.shape) != (n,):
        raise EnvError(f"{env_id}: the observation's 'action_mask' entry is {_one_line(entry)} "
                       f"but the env has {n} actions; make it a Box or MultiBinary of shape "
                       f"({n},) with 1 for legal actions")
    return n


def obs_shape_of(env_id: str, space: gymnasium.Space[Any]) -> tuple[int, ...]:
    """Shape of one observation as rlloop returns it, or ``EnvError`` if unsupported."""
    if isinstance(space, spaces.Box):
        return tuple(space.shape)
    if isinstance(space, spaces.Discrete):
        return (int(space.n),)  # one-hot
    parts = obs_parts_of(space)
    if parts:
        return (sum(int(np.prod(shape)) for _, shape, _ in parts),)
    raise EnvError(f"{env_id}: observation space {describe_space(space)} is not supported (only "
                   f"Box, Discrete and Dicts of them); register a variant "
                   f"{_flattening_fix(space)}")


def is_image_space(space: gymnasium.Space[Any]) -> bool:
    """A uint8 Box of 2 (grayscale) or 3 (HWC or CHW colour) dims: pixels."""
    return (isinstance(space, spaces.Box) and space.dtype == np.uint8
            and len(space.shape) in (2, 3))


def _flattens(space: gymnasium.Space[Any]) -> bool:
    try:
        spaces.flatten_space(space)
    except (NotImplementedError, TypeError, ValueError):
        return False  # e.g. MiniGrid's MissionSpace (free text)
    return True


def describe_space(space: gymnasium.Space[Any]) -> str:
    if isinstance(space, spaces.Dict):  # its entries' full text can fill a screen
        inner = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in space.spaces.items())
        return f"Dict({inner})"
    return _one_line(space)


def _flattening_fix(space: gymnasium.Space[Any]) -> str:
    if _flattens(space):
        return "wrapped in gymnasium.wrappers.FlattenObservation"
    if isinstance(space, spaces.Dict):
        keep = [k for k, v in space.spaces.items() if _flattens(v)]
        drop = [k for k in space.spaces if k not in keep]
        if keep:  # the rest of the Dict keeps its encoders (a CNN for an image)
            return (f"wrapped in gymnasium.wrappers.FilterObservation(env, {keep}) "
                    f"({', '.join(map(repr, drop))} has no encoder)")
    return "with a gymnasium.ObservationWrapper that returns a Box"


def spec_from_gym(
    env_id: str,
    gym_spec: gymnasium.envs.registration.EnvSpec | None,
    obs_space: gymnasium.Space[Any],
    action_space: gymnasium.Space[Any],
    mask_dims: int = 0,
) -> EnvSpec:
    """``EnvSpec`` from a made env's Gymnasium spec (which reflects ``max_episode_steps``
    overrides passed to ``gymnasium.make``) and its spaces; ``mask_dims`` action-mask
    features (see :func:`probe_action_mask`) follow the flattened observation."""
    shape = obs_shape_of(env_id, obs_space)
    mask_dims = mask_dims or dict_mask_dims(env_id, obs_space, action_space)
    if mask_dims:
        shape = (int(np.prod(shape)) + mask_dims,)
    return EnvSpec(
        env_id=env_id,
        obs_shape=shape,
        action_space=convert_action_space(env_id, action_space),
        max_episode_steps=None if gym_spec is None else gym_spec.max_episode_steps,
        reward_threshold=None if gym_spec is None else gym_spec.reward_threshold,
        image_obs=is_image_space(obs_space),
        action_mask=mask_dims,
        obs_parts=obs_parts_of(obs_space),
    )


def probe_action_mask(env_id: str, env: gymnasium.Env[Any, Any]) -> int:
    """Size of the ``info["action_mask"]`` that ``env`` returns from ``reset``, 0 if none.

    Only Discrete actions with vector (non-image) or Dict observations (without their own
    ``action_mask`` entry) are probed: that is where rlloop appends the mask to the
    flattened observation (see :mod:`rlloop.modules.masked`)."""
    act, obs = env.action_space, env.observation_space
    flat = (isinstance(obs, spaces.Box | spaces.Discrete) and not is_image_space(obs)) or (
        bool(obs_parts_of(obs)) and MASK_KEY not in obs.spaces)  # type: ignore[attr-defined]
    if not (isinstance(act, spaces.Discrete) and flat):
        return 0
    _, info = env.reset()
    if "action_mask" not in info:
        return 0
    mask = np.asarray(info["action_mask"])
    if mask.shape != (int(act.n),):
        raise EnvError(f"{env_id}: info['action_mask'] has shape {mask.shape} but the env has "
                       f"{int(act.n)} actions; return one 0/1 entry per action")
    return int(act.n)


def gym_env_spec(env_id: str, env_kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """Spec of a Gymnasium env without stepping it: make one instance, read it, close it."""
    kwargs = env_kwargs or {}
    with construction_errors(env_id, kwargs):
        env = atari.make(env_id, **kwargs)
    try:
        return spec_from_gym(env_id, env.spec, env.observation_space, env.action_space,
                             probe_action_mask(env_id, env))
    finally:
        env.close()


@contextlib.contextmanager
def construction_errors(env_id: str, kwargs: dict[str, Any]) -> Iterator[None]:
    """Constructing ``env_id``'s envs: a missing package, or keywords (``env_kwargs``) the
    constructor does not take or whose values it refuses, become one-line EnvErrors; with
    no keywords such errors are bugs of the env and pass through."""
    try:
        yield
    except TypeError as e:
        if not kwargs:  # then it is a bug in the env, not a user mistake
            raise
        raise _kwargs_error(env_id, kwargs, e) from e
    except gymnasium.error.DependencyNotInstalled as e:
        raise _dependency_error(env_id, e) from None
    except (AssertionError, ValueError) as e:
        if isinstance(e, AssertionError) and (line := _robotics_on_new_mujoco(env_id, e)):
            raise EnvError(line) from e
        if not kwargs or isinstance(e, EnvError | RlloopError):
            raise
        raise _kwargs_value_error(env_id, kwargs, e) from e


def _robotics_on_new_mujoco(env_id: str, error: AssertionError) -> str | None:
    """Gymnasium-Robotics 1.4's envs (Fetch, ...) fail a joint-type assertion on MuJoCo 3.12
    and later, whose enums no longer compare equal to numpy integers: the fix, or None
    for any other assertion."""
    import sys
    import traceback

    mujoco = sys.modules.get("mujoco")
    frames = traceback.extract_tb(error.__traceback__)
    if mujoco is None or not any("gymnasium_robotics" in f.filename for f in frames):
        return None
    version = tuple(int(x) for x in re.findall(r"\d+", mujoco.__version__)[:2])
    if version < (3, 12):
        return None
    return (f"{env_id} fails an assertion of gymnasium-robotics on mujoco "
            f"{mujoco.__version__} (from 3.12 on its joint-type enums no longer equal numpy "
            "integers); pip install 'rlloop[robotics]' (mujoco<3.12)")


def _kwargs_error(env_id: str, kwargs: dict[str, Any], error: TypeError) -> EnvError:
    hint = "check the env's constructor arguments"
    if is_object_env(env_id) and "render_mode" in kwargs:  # the run's video asks for frames
        hint = ("for videos the function must take render_mode, e.g. lambda render_mode=None: "
                "gymnasium.make(ID, render_mode=render_mode); or pass save_video=False")
    return EnvError(f"gymnasium.make({env_id!r}) rejected env_kwargs {sorted(kwargs)} "
                    f"({error}); {hint}")


def _kwargs_value_error(env_id: str, kwargs: dict[str, Any],
                        error: AssertionError | ValueError) -> EnvError:
    """The env's constructor took the keywords but refused a value (LunarLander's
    ``assert -12 < gravity < 0``): a bad setting, not a bug of the env."""
    detail = " ".join(str(error).split()) or type(error).__name__
    given = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
    keys = sorted(kwargs)
    change = (f"--set env.{keys[0]}=VALUE" if len(keys) == 1
              else "--set env.KEY=VALUE for " + ", ".join(keys))
    return EnvError(f"{env_id} refused its env_kwargs ({given}): {detail}; change the value "
                    f"in env_kwargs ({change}) or drop it")


#: rlloop's extra for each package Gymnasium names as missing ("Box2D is not installed").
_EXTRAS = {"box2d": ("Box2D", "box2d"), "mujoco": ("MuJoCo", "mujoco"),
           "opencv-python": ("OpenCV", "atari"), "ale-py": ("ale-py", "atari"),
           "ale_py": ("ale-py", "atari")}


_MISSING = re.compile(r"\s*([\w.-]+)(?: package)? (?:is )?not installed", re.IGNORECASE)


def _dependency_error(env_id: str, error: Exception) -> EnvError:
    detail = " ".join(str(error).split())
    named = _MISSING.match(detail)
    extra = _EXTRAS.get(named.group(1).lower()) if named else None
    if extra is None:  # Gymnasium's message names its own pip command (e.g. pygame's)
        return EnvError(f"{env_id} needs a package that is not installed: {detail}")
    package, name = extra
    return EnvError(f"{env_id} needs {package}, which is not installed: pip install "
                    f"'rlloop[{name}]'")


def made_spec(env_id: str, env_fn: Any
               ) -> tuple[gymnasium.envs.registration.EnvSpec | None, int]:
    env = env_fn()
    try:
        return env.spec, probe_action_mask(env_id, env)
    finally:
        env.close()
