"""Atari envs stepped by envpool's C++ thread pool (``backend="envpool"``).

envpool does rl-zoo's preprocessing itself (no-op reset, frame skip 4 with max-pooling,
84x84 grayscale with area resize, 4 stacked frames, fire reset), so this module only
adapts its batch to rlloop's ``VecEnv`` contract, the way :mod:`rlloop.envs.atari` and
:class:`rlloop.envs.gym.GymVecEnv` do for the gymnasium backends:

* Episodic life is done here, not by envpool: a lost life (``0 < lives < before``)
  ends the learner's episode (``terminated``) while the game goes on, as
  :class:`rlloop.envs.atari.EpisodicLife` does; only a game over or the time limit
  resets the game. Logged returns are therefore per life on both backends. The next
  life starts as there too: a no-op, then FIRE and RIGHT in games that wait for FIRE
  (:class:`rlloop.envs.atari.FireReset`), their rewards dropped.
* envpool resets a finished env on the *next* step (ignoring its action); rlloop wants
  the reset in the same step, so finished envs are reset at once (envpool steps and
  resets any subset of its envs) and their last observation goes to ``final_obs``.
* Rewards are not clipped (the algorithms' ``clip_rewards`` does that).
* ``ALE/...-v5`` ids keep v5's sticky actions (``repeat_action_probability=0.25``);
  ``...NoFrameskip-v4`` ids have none; ``env_kwargs.repeat_action_probability`` wins.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlloop.envs.atari import EPISODIC_LIFE, FRAME_STACK, is_atari_id
from rlloop.envs.core import Discrete, EnvSpec, StepResult
from rlloop.errors import EnvError
from rlloop.system.devices import arrays_to_device

INSTALL = "pip install 'rlloop[envpool]'"

#: env_kwargs passed on to envpool under the same name (as ale-py's ``gymnasium.make``
#: takes them), with ``max_episode_steps`` counted in agent steps (4 frames each).
PASSED_KWARGS = ("repeat_action_probability", "max_episode_steps", "full_action_space",
                 "mode", "difficulty")

#: ALE v5's frame limit (108,000 frames) in agent steps of 4 frames.
MAX_EPISODE_STEPS = 27_000


def envpool_task(env_id: str) -> tuple[str, float]:
    """envpool's task id for an ale-py id and its default sticky-action probability,
    or ``EnvError`` for an id that is not Atari."""
    name = env_id.rpartition(":")[2]
    if not is_atari_id(name):
        raise EnvError(f"backend 'envpool' runs only Atari ids (ALE/Pong-v5, "
                       f"PongNoFrameskip-v4), not {env_id!r}; use backend='auto'")
    if name.endswith("NoFrameskip-v4"):
        return name.removesuffix("NoFrameskip-v4") + "-v5", 0.0
    game = name.removeprefix("ALE/").rpartition("-")[0]
    return f"{game}-v5", 0.25


def check_envpool(env_id: str) -> str:
    """envpool's task id for ``env_id`` once envpool is importable (else ``EnvError``)."""
    task, _ = envpool_task(env_id)
    try:
        found = importlib.util.find_spec("envpool") is not None
    except ImportError:  # a finder that refuses it
        found = False
    if not found:
        raise EnvError(f"backend 'envpool' needs the envpool package, which is not "
                       f"installed; {INSTALL} (or use backend='auto')")
    return task


class EnvpoolAtariVecEnv:
    """``num_envs`` Atari games in one envpool pool, as a ``VecEnv`` (see the module doc).

    ``get_state`` holds no game state (envpool exposes none): resume with ``set_state``
    then ``reset()``, which starts new games from the saved seed.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None,
                 env_kwargs: dict[str, Any] | None = None,
                 device: str | torch.device = "cpu") -> None:
        if num_envs < 1:
            raise EnvError(f"num_envs must be >= 1, got {num_envs}")
        task = check_envpool(env_id)
        kwargs = dict(env_kwargs or {})
        self._per_life = bool(kwargs.pop(EPISODIC_LIFE, True))  # rlloop's, not envpool's
        unknown = sorted(set(kwargs) - set(PASSED_KWARGS))
        if unknown:
            raise EnvError(f"backend 'envpool' does not take env_kwargs {unknown} (it takes "
                           f"{', '.join(PASSED_KWARGS)}); drop them or use backend='gymnasium'")
        _, sticky = envpool_task(env_id)
        self._options: dict[str, Any] = {
            "repeat_action_probability": sticky, "max_episode_steps": MAX_EPISODE_STEPS,
            **kwargs,
            "frame_skip": 4, "noop_max": 30, "img_height": 84, "img_width": 84,
            "gray_scale": True, "stack_num": FRAME_STACK, "episodic_life": False,
            "reward_clip": False, "use_fire_reset": True, "use_inter_area_resize": True,
        }
        self._task = task
        self.num_envs = num_envs
        self.device = torch.device(device)
        self._seed = 0 if seed is None else seed
        self._pool = self._make_pool(self._seed)
        n = int(self._pool.action_space.n)
        self._restart = (0, 1, 2) if _waits_for_fire(env_id, kwargs) else (0,)
        self.spec = EnvSpec(env_id=env_id, obs_shape=(FRAME_STACK, 84, 84),
                            action_space=Discrete(n),
                            max_episode_steps=kwargs.get("max_episode_steps"),
                            image_obs=True)
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self._ids = np.arange(num_envs, dtype=np.int32)

    def _make_pool(self, seed: int) -> Any:
        import envpool

        try:
            return envpool.make_gymnasium(self._task, num_envs=self.num_envs, seed=seed,
                                          **self._options)
        except (TypeError, ValueError, RuntimeError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise EnvError(f"envpool.make_gymnasium({self._task!r}) failed: {first}; check "
                           "env_kwargs or use backend='gymnasium'") from e

    def reset(self, seed: int | None = None) -> Tensor:
        """Start new games; a ``seed`` other than the current one rebuilds the pool (envpool
        seeds env ``i`` with ``seed + i`` when it is made)."""
        if seed is not None and seed != self._seed:
            self._pool.close()
            self._seed = seed
            self._pool = self._make_pool(seed)
        obs, info = self._pool.reset()
        self._lives = np.asarray(info["lives"], dtype=np.int64).copy()
        return arrays_to_device((np.asarray(obs, dtype=np.uint8),), self.device)[0]

    def step(self, actions: Tensor) -> StepResult:
        array = actions.detach().cpu().numpy()
        if array.shape != (self.num_envs,):
            raise EnvError(f"expected Discrete actions of shape ({self.num_envs},), "
                           f"got {array.shape}")
        obs, reward, terminated, truncated, info = self._pool.step(
            array.astype(np.int32), self._ids)
        obs = np.asarray(obs, dtype=np.uint8)
        game_over = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        lives = np.asarray(info["lives"], dtype=np.int64)
        life_lost = (lives > 0) & (lives < self._lives)
        terminated_np = np.asarray(terminated, dtype=bool) | (life_lost & self._per_life)
        truncated_np = np.asarray(truncated, dtype=bool) & ~terminated_np
        self._lives = lives.copy()
        arrays = [obs, np.asarray(reward, dtype=np.float32), terminated_np, truncated_np]
        ended = np.flatnonzero(game_over)
        next_life = np.flatnonzero(life_lost & ~game_over)
        if ended.size or next_life.size:
            final = obs
            obs = obs.copy()
            if next_life.size:
                # envpool's frame stack runs on through the game: a new life's first
                # stacks still hold frames of the life lost (the gymnasium backend's
                # start with its first frame repeated).
                ended = np.union1d(ended, self._next_life(obs, next_life))
            if ended.size:
                new_obs, new_info = self._pool.reset(self._ids[ended])
                rows = np.asarray(new_info["env_id"], dtype=np.int64)
                obs[rows] = new_obs
                self._lives[rows] = np.asarray(new_info["lives"], dtype=np.int64)
            arrays[0] = obs
            arrays.append(final)
        tensors = arrays_to_device(tuple(arrays), self.device)
        return StepResult(obs=tensors[0], reward=tensors[1], terminated=tensors[2],
                          truncated=tensors[3],
                          final_obs=tensors[4] if len(tensors) > 4 else tensors[0])

    def _next_life(self, obs: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """Step ``envs`` (after a lost life) through the restart actions into ``obs``;
        returns those whose game ended meanwhile (to be reset)."""
        over = np.zeros(self.num_envs, dtype=bool)
        for action in self._restart:
            live = envs[~over[envs]]
            if not live.size:
                break
            step_obs, _, terminated, truncated, info = self._pool.step(
                np.full(live.size, action, dtype=np.int32), self._ids[live])
            rows = np.asarray(info["env_id"], dtype=np.int64)
            obs[rows] = step_obs
            self._lives[rows] = np.asarray(info["lives"], dtype=np.int64)
            over[rows] = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        return np.flatnonzero(over)

    def get_state(self) -> dict[str, Any]:
        return {"envpool_seed": self._seed}

    #: envpool keeps no state it can give back: a resumed run's episodes restart.
    state_restored = False

    def set_state(self, state: dict[str, Any]) -> None:
        seed = state.get("envpool_seed")
        if isinstance(seed, int) and seed != self._seed:
            self.reset(seed)  # a rebuilt pool must be reset before it steps

    def close(self) -> None:
        self._pool.close()


def _waits_for_fire(env_id: str, kwargs: dict[str, Any]) -> bool:
    """Whether the game's action 1 is FIRE (of 3 or more), as :func:`make_atari` asks."""
    import gymnasium

    from rlloop.envs.atari import waits_for_fire
    from rlloop.envs.ids import resolve_env_id

    keep = {k: kwargs[k] for k in ("full_action_space", "mode", "difficulty") if k in kwargs}
    env = gymnasium.make(resolve_env_id(env_id.rpartition(":")[2]), **keep)
    try:
        return waits_for_fire(env.unwrapped.get_action_meanings())  # type: ignore[attr-defined]
    finally:
        env.close()
