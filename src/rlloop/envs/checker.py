"""``check_env``: what a Gymnasium env must get right before rlloop (or any trainer) can
learn on it, each problem one line that names the fix (``rlloop check-env ID``).

It checks the spaces (types, finite bounds), ``reset``'s and ``step``'s signatures and
return values against the spaces (shapes, dtypes, bounds, NaN/inf), seeding (``reset(seed=s)``
twice gives the same start) and rendering (``metadata["render_modes"]``, ``render_mode``, and
an ``rgb_array`` frame's shape and dtype). It runs on numpy and Gymnasium alone: no torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from rlloop.envs.rendering import offscreen_rendering
from rlloop.errors import EnvError

#: Env steps taken per check of ``step`` (enough to see a few rewards and flags).
STEPS = 20


@dataclass(frozen=True)
class Finding:
    """One problem: ``message`` names it and its fix; a warning does not stop training."""

    message: str
    warning: bool = False

    def __str__(self) -> str:
        return f"{'warning' if self.warning else 'error'}: {self.message}"


def check_env(env: Any, *, render: bool = True) -> list[Finding]:
    """The problems of ``env`` (a ``gymnasium.Env``, a class or a function making one, or a
    registered id), one :class:`Finding` each; an empty list when it passes. An id is made
    without Gymnasium's own checker and, for the render check, again with
    ``render_mode="rgb_array"``."""
    offscreen_rendering()
    made = _made(env)
    if not isinstance(made, gymnasium.Env):
        return [Finding(f"{type(made).__name__} is not a gymnasium.Env; subclass "
                        "gymnasium.Env (the old gym package is not supported)")]
    try:
        findings = _check_instance(made)
        if render and not findings:  # frames come from an env that resets and steps right
            findings += _check_rendering(env, made)
        return findings
    finally:
        if made is not env:
            made.close()


def _made(env: Any) -> Any:
    if isinstance(env, str):
        try:
            return gymnasium.make(env, disable_env_checker=True)
        except (gymnasium.error.Error, ImportError) as e:
            raise EnvError(f"cannot make {env!r}: {' '.join(str(e).split())}") from e
    if isinstance(env, type) or (callable(env) and not isinstance(env, gymnasium.Env)):
        return env()
    return env


def _check_instance(env: gymnasium.Env[Any, Any]) -> list[Finding]:
    found = _check_spaces(env)
    if found:  # the rest reads the spaces
        return found
    found += _check_reset_signature(env)
    if found:
        return found
    try:
        obs = _reset_obs(env, seed=0, found=found)
        if obs is None:
            return found
        found += _check_obs(env.observation_space, obs, "reset()")
        if found:  # the steps would repeat it
            return found
        found += _check_steps(env, found)
        found += _check_seeding(env, obs)
    except Exception as e:  # an env that raises is a finding, not a crash of the checker
        found.append(Finding(f"the env raised {type(e).__name__}: {' '.join(str(e).split())}"
                             "; fix the env (run its reset() and step() alone to see where)"))
    return found


def _check_spaces(env: gymnasium.Env[Any, Any]) -> list[Finding]:
    found = []
    for name in ("observation_space", "action_space"):
        space = getattr(env, name, None)
        if not isinstance(space, spaces.Space):
            found.append(Finding(f"{name} is {type(space).__name__}, not a gymnasium.spaces."
                                 f"Space; set self.{name} in __init__ (e.g. spaces.Box(...))"))
    if found:
        return found
    for name, box in _boxes(env.observation_space, "observation_space"):
        if np.any(box.low > box.high):
            found.append(Finding(f"{name} has low > high; swap the bounds"))
    action = env.action_space
    if isinstance(action, spaces.Box) and not (np.all(np.isfinite(action.low))
                                               and np.all(np.isfinite(action.high))):
        found.append(Finding("action_space Box has infinite bounds; give it finite low and "
                             "high (actions are scaled to them)"))
    if isinstance(action, spaces.Discrete) and int(action.start) != 0:
        found.append(Finding(f"action_space is Discrete(start={int(action.start)}); use "
                             "Discrete(n) and add the offset inside step()"))
    return found


def _boxes(space: spaces.Space[Any], name: str) -> list[tuple[str, spaces.Box]]:
    if isinstance(space, spaces.Box):
        return [(name, space)]
    if isinstance(space, spaces.Dict):
        return [b for key, sub in space.spaces.items() for b in _boxes(sub, f"{name}[{key!r}]")]
    return []


def _check_reset_signature(env: gymnasium.Env[Any, Any]) -> list[Finding]:
    params = inspect.signature(env.reset).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [k for k in ("seed", "options") if k not in params and not takes_any]
    if missing:
        return [Finding(f"reset() takes no {' or '.join(missing)} argument; define it as "
                        "reset(self, *, seed=None, options=None) and call "
                        "super().reset(seed=seed)")]
    return []


def _reset_obs(env: gymnasium.Env[Any, Any], seed: int, found: list[Finding]) -> Any:
    out = env.reset(seed=seed)
    if not (isinstance(out, tuple) and len(out) == 2):
        found.append(Finding("reset() must return (obs, info), got "
                             f"{_shape_of(out)}; return obs, {{}} (Gymnasium's API)"))
        return None
    obs, info = out
    if not isinstance(info, dict):
        found.append(Finding(f"reset()'s info is {type(info).__name__}; return a dict"))
    return obs


def _shape_of(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__


def _check_obs(space: spaces.Space[Any], obs: Any, where: str) -> list[Finding]:
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict) or set(obs) != set(space.spaces):
            return [Finding(f"{where} returned {type(obs).__name__} for a Dict space with keys "
                            f"{sorted(space.spaces)}; return a dict with exactly those keys")]
        return [f for key, sub in space.spaces.items()
                for f in _check_obs(sub, obs[key], f"{where}[{key!r}]")]
    if isinstance(space, spaces.Box):
        array = np.asarray(obs)
        if not isinstance(obs, np.ndarray):
            return [Finding(f"{where} returned a {type(obs).__name__}; return a numpy array "
                            f"(np.asarray(obs, dtype=np.{space.dtype}))")]
        if array.shape != space.shape:
            return [Finding(f"{where} returned shape {array.shape} for observation_space shape "
                            f"{space.shape}; make them agree")]
        if array.dtype != space.dtype:
            return [Finding(f"{where} returned {array.dtype} for a {space.dtype} space; cast "
                            f"with .astype(np.{space.dtype})")]
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            return [Finding(f"{where} returned NaN or inf; fix the env's state update")]
    if not space.contains(obs):
        return [Finding(f"{where} returned an observation outside observation_space; widen "
                        "the bounds or clip the observation")]
    return []


def _check_steps(env: gymnasium.Env[Any, Any], found: list[Finding]) -> list[Finding]:
    env.action_space.seed(0)
    for _ in range(STEPS):
        out = env.step(env.action_space.sample())
        if not (isinstance(out, tuple) and len(out) == 5):
            return [Finding(f"step() must return (obs, reward, terminated, truncated, info), "
                            f"got {_shape_of(out)}; split the old done flag into terminated "
                            "and truncated (Gymnasium's API)")]
        obs, reward, terminated, truncated, info = out
        problems = _check_obs(env.observation_space, obs, "step()")
        if not isinstance(reward, int | float | np.integer | np.floating) or isinstance(
                reward, bool):
            problems.append(Finding(f"step()'s reward is {type(reward).__name__}; return a "
                                    "float (float(reward))"))
        elif not np.isfinite(reward):
            problems.append(Finding("step()'s reward is NaN or inf; fix the reward"))
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(flag, bool | np.bool_):
                problems.append(Finding(f"step()'s {name} is {type(flag).__name__}; return a "
                                        f"bool (bool({name}))"))
        if not isinstance(info, dict):
            problems.append(Finding(f"step()'s info is {type(info).__name__}; return a dict"))
        if problems:
            return problems
        if terminated or truncated:
            env.reset()
    return []


def _check_seeding(env: gymnasium.Env[Any, Any], first: Any) -> list[Finding]:
    again = env.reset(seed=0)[0]
    if not _same(first, again):
        return [Finding("reset(seed=0) twice gave different observations; call "
                        "super().reset(seed=seed) and draw randomness from self.np_random")]
    return []


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _check_rendering(env: Any, made: Any) -> list[Finding]:
    """``metadata["render_modes"]`` and an ``rgb_array`` frame; a warning only, since
    training needs no frames (videos are skipped: ``--set save_video=false``)."""
    metadata = getattr(made, "metadata", None)
    modes = metadata.get("render_modes") if isinstance(metadata, dict) else None
    if not isinstance(modes, list | tuple):
        return [Finding("metadata['render_modes'] is missing or not a list; set "
                        "metadata = {'render_modes': ['rgb_array'], 'render_fps': 30}",
                        warning=True)]
    if "rgb_array" not in modes:
        return [Finding("no 'rgb_array' in metadata['render_modes'], so runs cannot be filmed; "
                        "add it and render frames, or train with --set save_video=false",
                        warning=True)]
    no_argument = Finding("the env takes no render_mode argument; accept render_mode=None in "
                          "__init__ and keep it as self.render_mode", warning=True)
    maker: Callable[[], Any]
    if isinstance(env, str):
        maker = partial(gymnasium.make, env, render_mode="rgb_array", disable_env_checker=True)
    elif isinstance(env, gymnasium.Env):
        if made.render_mode != "rgb_array":  # frames need an env made for them: not guessed
            return [] if _takes_render_mode(type(made.unwrapped)) else [no_argument]
        maker = partial(lambda: made)
    elif not _takes_render_mode(env):
        return [no_argument]
    else:
        maker = partial(env, render_mode="rgb_array")
    try:
        filmed = maker()
    except TypeError as e:
        if "render_mode" in str(e):
            return [no_argument]
        raise
    try:
        if getattr(filmed, "render_mode", None) != "rgb_array":
            return [Finding("render_mode='rgb_array' was not kept; set self.render_mode = "
                            "render_mode in __init__", warning=True)]
        filmed.reset(seed=0)
        frame = filmed.render()
    finally:
        if filmed is not made:
            filmed.close()
    array = np.asarray(frame) if frame is not None else None
    if array is None or array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3:
        got = "None" if array is None else f"{array.dtype} {array.shape}"
        return [Finding(f"render() in 'rgb_array' mode returned {got}; return an [H, W, 3] "
                        "uint8 array", warning=True)]
    return []


def _takes_render_mode(maker: Any) -> bool:
    try:
        params = inspect.signature(maker).parameters
    except (TypeError, ValueError):
        return True  # cannot tell: do not claim it does not
    return "render_mode" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
