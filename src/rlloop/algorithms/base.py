"""What every algorithm shares: env construction, the runner, RNG, eval envs, state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from rlloop.envs.atari import EPISODIC_LIFE, is_atari_id
from rlloop.envs.core import EnvSpec, VecEnv
from rlloop.envs.normalizer import RunningMeanStd
from rlloop.envs.registry import NATIVE_ENVS, make_env
from rlloop.envs.wrappers import NormalizeObservation
from rlloop.errors import ConfigError, saved_count
from rlloop.runners.env_runner import EnvRunner
from rlloop.runners.evaluation import evaluate
from rlloop.system.devices import new_generator, resolve_device, set_generator_state
from rlloop.system.seeding import derive_seed, seed_global_rngs
from rlloop.system.signals import StopInterrupted, stop_requested_since

if TYPE_CHECKING:
    from rlloop.learners.learner import Learner

__all__ = ["AlgorithmBase", "ConfigError", "EnvSettings"]

#: Eval envs are seeded apart from training envs so they never share episodes.
EVAL_SEED_OFFSET = 1_000_003
#: Eval envs at most: Gymnasium envs, native envs (see `AlgorithmBase._eval_batch`).
EVAL_ENVS = 32
NATIVE_EVAL_ENVS = 1024


@dataclass
class EnvSettings:
    """Where an algorithm gets its experience from, and run-level settings it needs
    (resolved from the run config)."""

    env_id: str
    spec: EnvSpec
    num_envs: int
    backend: str = "auto"
    seed: int = 0
    total_env_steps: int = 100_000
    horizons_per_env_reset: int = -1
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    on_nonfinite: str = "skip"
    device: str | torch.device = "cpu"
    """Where the algorithm's envs, storage, modules and generators live (see
    :func:`rlloop.system.devices.resolve_device`; ``"auto"`` picks CUDA when present)."""
    step_timeout: float | None = 60.0


def horizon_starts(collects: int, horizons_per_env_reset: int) -> bool:
    """Whether the training envs are reset before collect number ``collects`` (from 0):
    every k collects for k > 0, only before the first for k < 0 (rl8's rule)."""
    k = horizons_per_env_reset
    return not ((k < 0 and collects) or (k > 0 and collects % k))


class AlgorithmBase:
    """Owns the training env, its runner, the algorithm's RNG and cached eval envs.

    Subclasses add modules, a learner and storage, and implement ``collect``,
    ``update`` and ``act``. All randomness of an algorithm flows from
    ``self.generator`` (and torch's global RNG only for network initialisation), so a
    checkpoint of ``get_state()`` continues bit-exactly.

    Everything lives on ``self.device``; modules are built on the host and moved there
    (:func:`~rlloop.system.devices.build_module`), so a seed gives the same initial weights on
    every device.
    """

    name = "base"
    #: Whether the algorithm encodes Dict observations (EnvSpec.obs_parts) key by key.
    supports_dict_obs: ClassVar[bool] = False
    #: Set by every subclass: the learner that owns the algorithm's modules and optimisers.
    learner: Learner[Any]
    #: With ``obs_stats``, the training env's wrapper updates them and hands the runner
    #: standardised observations (PPO's rollouts hold what the policy saw). Off-policy
    #: loops keep raw ones, for a replay normalised when sampled.
    standardize_train_env: ClassVar[bool] = True

    def __init__(self, settings: EnvSettings, obs_stats: RunningMeanStd | None = None) -> None:
        if settings.spec.obs_parts and not self.supports_dict_obs:
            raise ConfigError(f"{self.name} does not take Dict observations ({settings.env_id});"
                              " use feed-forward ppo, dqn, sac or td3, or register a variant "
                              "wrapped in gymnasium.wrappers.FlattenObservation")
        self.settings = settings
        self.device = resolve_device(settings.device)
        seed_global_rngs(settings.seed)
        self.generator = new_generator(self.device, derive_seed(settings.seed, "algorithm"))
        self.obs_stats = obs_stats
        self.env_config: dict[str, Any] = {}
        self.env = self._make_train_env(settings.env_kwargs)
        self.runner = EnvRunner(self.env, seed=settings.seed, device=self.device)
        self._eval_envs: dict[str, VecEnv] = {}
        self.evals = 0

    @property
    def horizons_per_env_reset(self) -> int:
        return self.settings.horizons_per_env_reset

    def _make_train_env(self, env_kwargs: dict[str, Any]) -> VecEnv:
        s = self.settings
        env = make_env(s.env_id, s.num_envs, s.backend, seed=s.seed, env_kwargs=env_kwargs,
                       device=self.device,
                       step_timeout=s.step_timeout)
        if self.obs_stats is None or not self.standardize_train_env:
            return env
        return NormalizeObservation(env, self.obs_stats)

    def begin_horizon(self, collects: int, env_config: dict[str, Any] | None) -> None:
        """Reset training envs at ``horizons_per_env_reset`` boundaries (rl8 semantics).

        With a positive k, envs are reset (and ``env_config`` applied) every k collects;
        with a negative k they are reset only once, at the start of training.
        """
        if not horizon_starts(collects, self.horizons_per_env_reset):
            return
        config = dict(env_config or {})
        rebuilt = config != self.env_config
        if rebuilt:
            self._rebuild_env(config)
        if collects or rebuilt:  # a new env has not been reset yet
            self.runner.reset(seed=self.settings.seed + collects)
            self.episodes_restarted()

    def _rebuild_env(self, env_config: dict[str, Any]) -> None:
        """The training envs made again with ``env_config`` over the run's env_kwargs (not
        reset yet)."""
        if getattr(self.env, "remote", False):  # the runners' envs (RemoteEnvs)
            raise ConfigError("env_config cannot reach envs that run in env runners; "
                              "pass the settings as env_kwargs, or use num_env_runners=0")
        self.env.close()
        self.env = self._make_train_env({**self.settings.env_kwargs, **env_config})
        self.runner.env = self.env
        self.env_config = env_config

    def start_rollout(self) -> None:
        """The env steps that follow make a new rollout (a collect, an off-policy
        optimisation step, or an env runner's next fragment): exploration drawn once per
        rollout is drawn anew."""

    def episodes_restarted(self) -> None:
        """Every training env began a new episode (a horizon reset, or a resume that could
        not continue the episodes): state carried along the old ones is dropped here."""

    def evaluate(self, episodes: int, env_config: dict[str, Any] | None = None,
                 deterministic: bool = True) -> dict[str, float]:
        """Run ``episodes`` whole episodes on an eval env; returns ``return_mean`` etc."""
        env = self._eval_env(env_config or {}, min(episodes, self._eval_batch()))
        with counted_once_made(self) as seed:
            return evaluate(lambda obs: self.act(obs, deterministic), env, episodes,
                            seed=seed, begin_episodes=self.begin_episodes)

    def _eval_batch(self) -> int:
        """Eval envs stepped together. A native env steps its whole batch in one tensor op,
        so it gets an env per episode and an evaluation takes one episode's steps (100
        CartPole episodes on 32 envs took 4 episodes' worth, 4x the time); Gymnasium envs
        step one by one (or one process each), where more of them buy nothing."""
        s = self.settings
        native = s.backend in ("auto", "native") and s.env_id in NATIVE_ENVS
        return NATIVE_EVAL_ENVS if native else EVAL_ENVS

    def _eval_env(self, env_config: dict[str, Any], num_envs: int) -> VecEnv:
        key = json.dumps([env_config, num_envs], sort_keys=True, default=str)
        if key not in self._eval_envs:
            s = self.settings
            # Atari is evaluated on whole games (rl-zoo's scores), trained life by life.
            whole = {EPISODIC_LIFE: False} if is_atari_id(s.env_id) else {}
            env = make_env(s.env_id, num_envs, s.backend, seed=s.seed + EVAL_SEED_OFFSET,
                           env_kwargs={**s.env_kwargs, **env_config, **whole},
                           device=self.device, step_timeout=s.step_timeout)
            if self.obs_stats is not None:
                env = NormalizeObservation(env, self.obs_stats, update=False)
            self._eval_envs[key] = env
        return self._eval_envs[key]

    def collect(self) -> dict[str, float]:
        raise NotImplementedError

    def update(self, env_steps: int) -> dict[str, float]:
        raise NotImplementedError

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        raise NotImplementedError

    def begin_episodes(self, starts: Tensor) -> None:
        """Envs ``starts`` (``[N]`` bool) of the acting batch begin new episodes: a policy
        with memory forgets theirs before the next :meth:`act`. Nothing to do by default."""

    def pop_times(self) -> dict[str, float]:
        return self.runner.pop_times()

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "generator": self.generator.get_state(),
            "runner": self.runner.get_state(),
            "evals": self.evals,
            "env_config": self.env_config,
        }
        if self.obs_stats is not None:
            state["obs_norm"] = self.obs_stats.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        set_generator_state(self.generator, state["generator"],
                            derive_seed(self.settings.seed, "algorithm-resumed"))
        env_config = dict(state.get("env_config", {}))
        if env_config != self.env_config:  # made with the run's env_kwargs alone so far
            self._rebuild_env(env_config)
            self.runner.reset(seed=self.settings.seed)  # then the saved state goes in
        self.runner.set_state(state["runner"])
        self.evals = saved_count(state["evals"], "algorithm.evals")
        if self.obs_stats is not None and "obs_norm" in state:
            self.obs_stats.set_state(state["obs_norm"])
        if getattr(self.runner, "restart_due", False):
            self.runner.restart_episodes()
            self.episodes_restarted()

    def get_policy_state(self) -> dict[str, Any]:
        """What acting needs (weights, observation statistics): a policy snapshot, without
        optimiser moments or replay buffer, that :meth:`set_policy_state` loads."""
        state: dict[str, Any] = {"learner": self.learner.get_state(components="module")}
        if self.obs_stats is not None:
            state["obs_norm"] = self.obs_stats.get_state()
        return state

    def set_policy_state(self, state: dict[str, Any]) -> None:
        """Load only what acting needs (weights, observation statistics) from ``get_state()``."""
        self.learner.set_state({"module": state["learner"]["module"]})
        if self.obs_stats is not None and "obs_norm" in state:
            self.obs_stats.set_state(state["obs_norm"])

    def close(self) -> None:
        learner = getattr(self, "learner", None)
        if learner is not None:
            learner.close()  # other learner ranks, if any
        self.env.close()
        for env in self._eval_envs.values():
            env.close()
        self._eval_envs.clear()


@contextmanager
def counted_once_made(owner: Any) -> Iterator[int]:
    """The seed of ``owner``'s next evaluation's episodes (from ``owner.settings.seed`` and
    its eval count ``owner.evals``), counted once the evaluation is made, or once it
    failed (its episodes are not tried again); one a stop cut (a second signal, the grace
    of :func:`~rlloop.system.signals.check_eval_stop`, an error after a stop signal) is not
    counted: the resumed run makes it on the same episodes."""
    try:
        yield owner.settings.seed + EVAL_SEED_OFFSET + owner.evals + 1
    except (KeyboardInterrupt, StopInterrupted):
        raise
    except Exception:
        if stop_requested_since() is None:
            owner.evals += 1
        raise
    owner.evals += 1
