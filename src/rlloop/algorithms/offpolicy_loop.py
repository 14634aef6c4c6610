"""What the off-policy family (DQN, SAC, TD3) shares: replaceable parts and the loop.

One env step, batched over ``N`` envs, flows through parts named in the config::

    policy (uniform random during warm-up) -> env.step -> StepProcessor -> Replay

and every ``opt_interval`` env steps the algorithm makes one optimisation step of
``gradient_steps`` updates on sampled batches.
:class:`~rlloop.trainers.offpolicy_schedule.OffPolicySchedule` counts evaluations,
records and saves in optimisation steps.

The parts are small Protocols with registries, so a config selects them by name and a
user may register more (:mod:`rlloop.algorithms.offpolicy_parts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from time import perf_counter as _clock
from typing import Any

import torch
from torch import Tensor

from rlloop.algorithms.offpolicy_parts import (
    REPLAY_BUFFERS,
    STEP_PROCESSORS,
    ExperienceSpec,
    Stats,
    StepProcessor,
)
from rlloop.config.offpolicy import OffPolicyConfig as OffPolicyConfig
from rlloop.config.offpolicy import check_hidden as check_hidden
from rlloop.config.schedules import Linear
from rlloop.data.hindsight_replay import HindsightReplayBuffer
from rlloop.data.info_storage import UnstorableInfo
from rlloop.data.obs_storage import ObsLayout
from rlloop.data.prioritized_replay import PrioritizedReplayBuffer
from rlloop.data.replay_normalization import ReplayNormalizer
from rlloop.data.transitions import Transitions
from rlloop.envs.core import ActionSpace, Box, Discrete, sample_random_actions
from rlloop.envs.normalizer import RunningMeanStd
from rlloop.errors import ConfigError, saved_count
from rlloop.runners.env_runner import EnvRunner

#: ``explore(obs [N, *obs]) -> actions [N, ...]``, the behaviour policy after warm-up.
ExploreFn = Callable[[Tensor], Tensor]


# ---------------------------------------------------------------- config


def check_env_settings(section: str, horizons_per_env_reset: int) -> None:
    if horizons_per_env_reset > 0:
        raise ConfigError(f"{section} keeps its envs running across optimisation steps; "
                          "horizons_per_env_reset must be < 0 (reset once)")


# ---------------------------------------------------------------- experience


class OffPolicyLoop:
    """Border's sampler and optimisation step, composed into each off-policy algorithm.

    Owns the step processor, the replay buffer and the env-step counter that drives
    warm-up and exploration schedules; the env, its current observation and episode
    statistics stay in the algorithm's ``EnvRunner``.

    Args:
        runner: The algorithm's runner.
        config: The algorithm's config.
        action_space: The *stored* action space (the unit box for continuous actors):
            warm-up actions are drawn from it, and it sets the replay's action shape.
        generator: The algorithm's generator (warm-up actions, replay sampling).
        to_env: Maps stored actions to env actions (continuous actions are rescaled).
        on_done: Called after every env step with its ``done`` flags ``[N]`` (on the
            device): exploration noise restarts there.
        random_warmup: Warm-up acts uniformly at random; False uses the behaviour
            policy from the first step (SB3's ``use_sde_at_warmup``).
        random_actions: Warm-up's random actions for the observations ``[N, *obs]``
            (None: uniform over the action space; DQN passes legal-only ones).
        obs_stats: ``normalize_obs``'s statistics (the algorithm's): the env's raw
            observations go into the replay, the policy and sampled batches see them
            standardised (see :mod:`~rlloop.data.replay_normalization`).
    """

    def __init__(self, runner: EnvRunner, config: OffPolicyConfig, action_space: ActionSpace,
                 generator: torch.Generator,
                 to_env: Callable[[Tensor], Tensor] | None = None,
                 on_done: Callable[[Tensor], None] | None = None,
                 random_warmup: bool = True,
                 random_actions: Callable[[Tensor, torch.Generator], Tensor] | None = None,
                 obs_stats: RunningMeanStd | None = None) -> None:
        self.runner, self.config, self.generator = runner, config, generator
        self.random_actions = random_actions
        self.action_space = action_space
        self.to_env = to_env
        self.on_done = on_done
        self.random_warmup = random_warmup
        env = runner.env
        shape = action_space.shape if isinstance(action_space, Box) else ()
        dtype = torch.int64 if isinstance(action_space, Discrete) else torch.float32
        #: What the step processor and replay buffer are built for.
        self.experience = ExperienceSpec(env.num_envs, tuple(env.spec.obs_shape),
                                         tuple(shape), dtype, runner.device,
                                         env.spec.obs_dtype, ObsLayout.of(env.spec), env)
        self.processor = self.step_processor(self.experience)
        self.replay = REPLAY_BUFFERS[config.replay](self.experience, config)
        #: Each env step's info dicts, one per env, for HER that keeps them
        #: (``her_copy_info``); None otherwise.
        self.step_infos: Callable[[], list[dict[str, Any]]] | None = None
        if isinstance(self.replay, HindsightReplayBuffer) and self.replay.infos is not None:
            from rlloop.envs.goal_env import step_infos  # Gymnasium, only for HER
            self.step_infos = step_infos(env, config.section)
        self.env_steps = 0
        self._due = 0  # optimisation steps made due by collect(), run by update()
        self.normalizer = ReplayNormalizer(env.num_envs, config.gamma, obs_stats,
                                           config.normalize_rewards, runner.device)
        self._beta = Linear(config.per_beta, 1.0, config.per_beta_steps)

    def step_processor(self, spec: ExperienceSpec) -> StepProcessor:
        """A new step processor of the config's kind for experience shaped as ``spec``."""
        return STEP_PROCESSORS[self.config.step_processor](spec, self.config)

    def env_step(self, explore: ExploreFn) -> int:
        """One batched env step into the replay buffer; returns the env steps taken (N)."""
        runner, clock = self.runner, _clock
        obs, n = runner.obs, runner.env.num_envs
        t0 = clock()
        action = self.choose_actions(obs, explore)
        t1 = clock()
        res = runner.env.step(action if self.to_env is None else self.to_env(action))
        t2 = clock()
        done = res.terminated | res.truncated
        batch = self.processor.process(obs, action,
                                       self.learning_reward(res.reward, done, res.obs),
                                       res.final_obs, res.terminated, res.truncated)
        if self.step_infos is None:
            self.replay.add(batch)
        else:
            self.add_with_infos(batch)
        runner.episodes.update(res.reward, done)
        self.episodes_ended(done)
        runner.obs = res.obs
        runner.time_inference += t1 - t0
        runner.time_env += t2 - t1
        self.env_steps += n
        return n

    def add_with_infos(self, batch: Transitions) -> None:
        """HER with ``her_copy_info``: the step's transitions and its infos, refused in
        one line where an info entry cannot be stored."""
        assert isinstance(self.replay, HindsightReplayBuffer) and self.step_infos is not None
        try:
            self.replay.add(batch, self.step_infos())
        except UnstorableInfo as e:
            s = self.config.section
            raise ConfigError(f"{s}.her_copy_info=true stores each step's info, but {e}; "
                              f"drop that entry from the env's info or set "
                              f"{s}.her_copy_info=false") from None

    def choose_actions(self, obs: Tensor, explore: ExploreFn) -> Tensor:
        """The actions for ``obs``: warm-up's random ones (legal ones where the algorithm
        masks), then the behaviour policy's."""
        if self.random_warmup and self.env_steps < self.config.learning_starts:
            if self.random_actions is not None:
                return self.random_actions(obs, self.generator)
            return sample_random_actions(self.action_space, self.runner.env.num_envs,
                                         self.generator)
        with torch.inference_mode():
            return explore(self.normalizer.policy_obs(obs))

    def learning_reward(self, reward: Tensor, done: Tensor, next_obs: Tensor) -> Tensor:
        """The reward ``[N]`` the replay stores: its sign with ``clip_rewards``, else the
        env's; the step (``done`` ``[N]``, ``next_obs`` ``[N, *obs]``) also moves the
        normalisation statistics, which sampled batches are scaled with."""
        reward = reward.sign() if self.config.clip_rewards else reward
        self.normalizer.observe(reward, done, next_obs)
        return reward

    def sample(self, batch_size: int, env_steps: int) -> Transitions:
        """``batch_size`` transitions from the replay (prioritized ones with the importance
        exponent at ``env_steps``), normalised with the current statistics."""
        replay = self.replay
        if isinstance(replay, PrioritizedReplayBuffer):
            t = replay.sample(batch_size, self.generator, beta=self._beta(env_steps))
        else:
            t = replay.sample(batch_size, self.generator)
        return self.normalizer.batch(t)

    def episodes_ended(self, done: Tensor) -> None:
        """After an env step: the exploration noise of envs whose episode ended restarts,
        and HER's replay closes their episodes."""
        if self.on_done is not None:
            self.on_done(done)
        if isinstance(self.replay, HindsightReplayBuffer):  # its episodes end here too
            self.replay.end_episodes(done)

    def learning(self, env_steps: int) -> bool:
        """Whether an optimisation step at ``env_steps`` runs (False during warm-up)."""
        return env_steps > self.config.learning_starts and len(self.replay) > 0

    def optimize(self, env_steps: int,
                 update: Callable[[Transitions, Tensor | None], Mapping[str, Tensor]]
                 ) -> dict[str, Tensor] | None:
        """One optimisation step: ``gradient_steps`` x (sample, ``update(batch, rows)``).

        ``update`` gets the sampled rows so prioritized replay can be updated. Returns
        the stats of the last update, or ``None`` while warming up (border's skip).
        """
        if not self.learning(env_steps):
            return None
        stats: Mapping[str, Tensor] = {}
        for _ in range(self.config.gradient_steps):
            t = self.sample(self.config.batch_size, env_steps)
            stats = update(t.for_update(), t.indices)
        return dict(stats)

    def collect(self, explore: ExploreFn) -> Stats:
        """rl8's collect: env steps until an optimisation step is due."""
        steps = 0
        while not self._due:
            n = self.env_step(explore)
            steps += n
            self._due = opts_due(self.env_steps, n, self.config.opt_interval)
        return {"env/steps": float(steps), **self.runner.episodes.stats()}

    def update(self, env_steps: int,
               optimize: Callable[[int], Mapping[str, Tensor | float] | None]) -> Stats:
        """rl8's update: the optimisation steps the last ``collect`` made due, each made
        by the algorithm's ``optimize``; returns the stats of the last one."""
        stats: Mapping[str, Tensor | float] = {}
        for _ in range(self._due):
            stats = optimize(env_steps) or stats
        self._due = 0
        return {k: float(v) for k, v in stats.items()}

    def restart_episodes(self) -> None:
        """The runner's episodes restarted (a resume that could not continue them): drop
        the step processor's pending steps of the old episodes (n-step windows) and
        restart the exploration noise."""
        self.processor.reset()
        n = self.runner.env.num_envs
        self.episodes_ended(torch.ones(n, dtype=torch.bool, device=self.runner.device))

    def get_state(self) -> dict[str, Any]:
        state = {"env_steps": self.env_steps, "processor": self.processor.get_state(),
                 "replay": self.replay.get_state()}
        if (reward_norm := self.normalizer.get_state()) is not None:
            state["reward_norm"] = reward_norm
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self.env_steps = saved_count(state["env_steps"], "algorithm.offpolicy.env_steps")
        self.processor.set_state(state["processor"])
        self.replay.set_state(state["replay"])
        self.normalizer.set_state(state.get("reward_norm"))


def unit_box(space: Box) -> Box:
    """``[-1, 1]`` in every dimension of ``space``: where continuous actors act."""
    return Box((-1.0,) * space.dim, (1.0,) * space.dim, space.shape)


def box_rescaler(section: str, space: Box, device: torch.device | str = "cpu"
                 ) -> Callable[[Tensor], Tensor]:
    """Maps actions in ``[-1, 1]`` to ``space``'s bounds (affine; one op per call), with
    the bounds on ``device``."""
    if not all(math.isfinite(b) for b in (*space.low, *space.high)):
        raise ConfigError(f"{section} needs a bounded action space, but its bounds are "
                          f"{space.low}..{space.high}; wrap the env to rescale its actions")
    low = torch.tensor(space.low, dtype=torch.float32, device=device)
    high = torch.tensor(space.high, dtype=torch.float32, device=device)
    half, mid = ((high - low) / 2).reshape(space.shape), ((high + low) / 2).reshape(space.shape)
    return lambda action: torch.addcmul(mid, action, half)


def opts_due(env_steps: int, new_steps: int, opt_interval: int) -> int:
    """Optimisation steps that fall due when ``new_steps`` env steps end at ``env_steps``."""
    return env_steps // opt_interval - (env_steps - new_steps) // opt_interval
