"""One Ray env runner: the config it builds its algorithm from, and the actor itself.

Each actor holds M envs and its own copy of the algorithm, built with the run layer's
builder from :func:`runner_config` (its envs, its seed, the CPU, no tracking), and samples
fragments with the weights the learner hands it. The learner's side, which launches,
feeds, restarts and reads the actors, is :mod:`rlloop.runners.ray_runners`.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from rlloop.runners.fragments import Fragment, FragmentSampler
from rlloop.system.seeding import derive_seed

if TYPE_CHECKING:
    from rlloop.config.run_config import RunConfig

#: ``build(config) -> AlgorithmBase``: how a runner makes its algorithm (``runs.build``'s).
#: Algorithms are typed loosely here: they sit above this package.
BuildAlgorithm = Callable[["RunConfig"], Any]
#: Fragment length of off-policy runners when ``fragment_steps`` is not set.
OFF_POLICY_FRAGMENT_STEPS = 32


def envs_per_runner(config: RunConfig) -> int:
    """M: ``num_envs_per_runner``, else ``num_envs`` split over the runners (rounded up)."""
    if config.num_envs_per_runner is not None:
        return int(config.num_envs_per_runner)
    return max(1, math.ceil(config.num_envs / config.num_env_runners))


def fragment_steps(config: RunConfig) -> int:
    """T: PPO's ``rollout_steps``; off-policy ``fragment_steps`` (default 32)."""
    rollout = getattr(config.hparams, "rollout_steps", None)
    if rollout is not None:
        return int(rollout)
    return int(config.fragment_steps or OFF_POLICY_FRAGMENT_STEPS)


def runner_config(config: RunConfig, index: int) -> RunConfig:
    """The config runner ``index`` builds its algorithm from: its M envs, its own seed,
    no runners of its own, no tracking, a replay buffer of one fragment (it keeps no
    transitions: the learner's buffer does), and the CPU: runners reserve no GPU from
    Ray, which hides the GPUs from such actors (or places them on CPU-only nodes)."""
    hparams, m = config.hparams, envs_per_runner(config)
    if hasattr(hparams, "buffer_size"):
        hparams = dataclasses.replace(hparams, buffer_size=max(
            fragment_steps(config) * m, hparams.batch_size))
    if hasattr(hparams, "minibatch_size"):  # it trains nothing: PPO's batch rule is moot
        hparams = dataclasses.replace(hparams, minibatch_size=min(
            hparams.minibatch_size, hparams.rollout_steps * m))
    seed = derive_seed(config.seed, f"env-runner-{index}") % 2**32
    return dataclasses.replace(config, num_env_runners=0, num_envs=envs_per_runner(config),
                               seed=seed, mlflow=False, tensorboard=False, hparams=hparams,
                               device="cpu")


class EnvRunnerActor:
    """One runner (a Ray actor): an algorithm built for M envs that samples fragments."""

    def __init__(self, config: RunConfig, index: int, build: BuildAlgorithm,
                 nets: dict[str, Any] | None = None) -> None:
        """``build``: makes the runner's algorithm from its config (the learner's own
        builder, handed down so that this layer imports no run code); ``nets``: the run's
        network if the training script defines it (see
        :func:`~rlloop.modules.custom.script_nets`)."""
        from rlloop.envs.ids import resolve_env_id
        from rlloop.modules.custom import register_nets

        torch.set_num_threads(1)
        register_nets(nets or {})
        self.index = index
        self.instance = secrets.randbits(62)
        # The learner accepted this id (typed by the user, or allowed for a resumed run):
        # import its module here too.
        resolve_env_id(config.env, allow_import=True)
        self.algorithm = build(runner_config(config, index))
        self.sampler = FragmentSampler(self.algorithm, fragment_steps(config))
        self.weights_seq_no = -1

    def sample(self, weights: list[Any], weights_seq_no: int, env_steps: int) -> Fragment:
        """One fragment with the weights numbered ``weights_seq_no`` (``weights`` holds
        their object reference, fetched only if this runner's copy is older)."""
        import ray  # here: the runner config helpers above serve runner processes too

        if weights_seq_no != self.weights_seq_no:
            self.algorithm.set_policy_state(ray.get(weights[0]))
            self.weights_seq_no = weights_seq_no
        return self.sampler.sample(env_steps).tagged(weights_seq_no, self.index, self.instance)

    def reset(self, seed: int) -> None:
        self.algorithm.runner.reset(seed=seed)

    def restart(self, seed: int) -> None:
        """New episodes and a new sampling stream, both from ``seed`` (a resumed run's: not
        the first sitting's again)."""
        self.algorithm.generator.manual_seed(derive_seed(seed, "sampling"))
        self.algorithm.runner.reset(seed=seed)

    def current_weights_seq_no(self) -> int:
        return self.weights_seq_no
