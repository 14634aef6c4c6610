"""Atari envs (ale-py) with the preprocessing rl-zoo trains them with.

rl-zoo wraps every Atari env in Stable-Baselines3's ``AtariWrapper`` (no-op reset, frame
skip with max-pooling, episodic life, fire reset, 84x84 grayscale, reward clipping) and
stacks 4 frames. rlloop builds the same from Gymnasium's own ``AtariPreprocessing`` and
``FrameStackObservation`` plus the two wrappers Gymnasium lacks (:class:`EpisodicLife`,
:class:`FireReset`). Reward clipping is left to the algorithms (``clip_rewards``) so
that the logged episode returns are the game's score.

An ``ALE/...-v5`` id keeps v5's sticky actions (``repeat_action_probability=0.25``,
Machado et al. 2018); pass ``env_kwargs.repeat_action_probability=0`` for rl-zoo's
``NoFrameskip-v4`` setting. ``env_kwargs.obs_type=ram`` gives the 128-byte RAM vector
with no image preprocessing.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium
from gymnasium.envs.registration import EnvSpec
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TimeLimit

from rlloop.envs.dict_entries import keep_encoded_entries

FRAME_STACK = 4
#: rlloop's own Atari option (env_kwargs, every backend): true (training, the default) ends
#: an episode at every lost life; false plays whole games, as evaluation does.
EPISODIC_LIFE = "episodic_life"


def is_atari_id(env_id: str) -> bool:
    """Whether ``env_id`` (as resolved: ``ale_py:ALE/Pong-v5``) is an ale-py env."""
    name = env_id.rpartition(":")[2]
    return name.startswith("ALE/") or name.endswith("NoFrameskip-v4")


def _lives(env: gymnasium.Env[Any, Any]) -> int:
    return int(env.unwrapped.ale.lives())  # type: ignore[attr-defined]


class EpisodicLife(gymnasium.Wrapper[Any, Any, Any, Any]):
    """A lost life ends the episode (``terminated``) for the learner; the game goes on.

    ``reset`` after a lost life steps a no-op instead of restarting the game, so values
    are learned per life while the game state carries on (Mnih et al. 2015; SB3's
    ``EpisodicLifeEnv``).
    """

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = _lives(self.env)
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game after all
                obs, info = self.env.reset(options=options)
        self.game_over = False
        self.lives = _lives(self.env)
        return obs, info


class FullGames(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Whole games, for evaluation (``episodic_life: false``): a lost life ends no episode.
    The next life starts as the learner's does under :class:`EpisodicLife` and
    :class:`FireReset` (a no-op, then FIRE and another action where the game waits for
    FIRE), inside the step that lost it (their rewards dropped, as in training)."""

    def __init__(self, env: gymnasium.Env[Any, Any], restart: tuple[int, ...]) -> None:
        super().__init__(env)
        self.restart = restart
        self.lives = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        out = self.env.reset(seed=seed, options=options)
        self.lives = _lives(self.env)
        return out

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not (terminated or truncated) and 0 < _lives(self.env) < self.lives:
            for restart in self.restart:
                obs, _, terminated, truncated, info = self.env.step(restart)
                if terminated or truncated:
                    break
        self.lives = _lives(self.env)
        return obs, reward, terminated, truncated, info


class FireReset(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Press FIRE after every reset in games that wait for it (Breakout's ball)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        for action in (1, 2):  # FIRE, then another action, as SB3's FireResetEnv does
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        return obs, info


def make_atari(env_id: str | EnvSpec, **kwargs: Any) -> gymnasium.Env[Any, Any]:
    """``gymnasium.make(env_id)`` with rl-zoo's Atari preprocessing and a 4-frame stack:
    observations are ``[4, 84, 84]`` uint8."""
    if kwargs.get("obs_type", "rgb") == "ram":
        return gymnasium.make(env_id, **kwargs)
    # A time limit counts the agent's steps of a game (as on envpool), not raw frames:
    # it goes above the frame skip, below the life-by-life episodes.
    limit = kwargs.pop("max_episode_steps", None)
    per_life = bool(kwargs.pop(EPISODIC_LIFE, True))
    # AtariPreprocessing skips frames itself (max-pooling the last two).
    env = gymnasium.make(env_id, **{"frameskip": 1, **kwargs})
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                             terminal_on_life_loss=False, grayscale_obs=True)
    if limit is not None:
        env = TimeLimit(env, int(limit))
    fire = waits_for_fire(env.unwrapped.get_action_meanings())  # type: ignore[attr-defined]
    env = EpisodicLife(env) if per_life else FullGames(env, (0, 1, 2) if fire else (0,))
    if fire:
        env = FireReset(env)
    return FrameStackObservation(env, FRAME_STACK)


def waits_for_fire(action_meanings: list[str]) -> bool:
    """Whether a game waits for FIRE to start (action 1 is FIRE, of 3 or more): the games
    that get the fire reset, on every backend."""
    return len(action_meanings) > 2 and action_meanings[1] == "FIRE"


def make(env_id: str | EnvSpec, **kwargs: Any) -> gymnasium.Env[Any, Any]:
    """``gymnasium.make``, with the Atari preprocessing for ale-py ids (or their specs);
    Dict entries that no encoder reads (MiniGrid's ``mission``) are left out."""
    name = env_id if isinstance(env_id, str) else env_id.id
    if is_atari_id(name):
        return make_atari(env_id, **kwargs)
    return keep_encoded_entries(gymnasium.make(env_id, **kwargs), name)
