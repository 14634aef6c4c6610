"""The algorithms the reliability suite covers: every registered one, on a small setup."""

from __future__ import annotations

import dataclasses

from rlloop.config.loading import build_config
from rlloop.config.registry import ALGORITHMS
from rlloop.config.run_config import RunConfig

ENVS = {"ppo": "CartPole-v1", "a2c": "CartPole-v1", "dqn": "CartPole-v1",
        "qrdqn": "CartPole-v1", "sac": "Pendulum-v1", "td3": "Pendulum-v1",
        "tqc": "Pendulum-v1"}
QUIET = ["mlflow=false", "progress=false", "num_envs=4"]
#: Small enough to be fast, and every off-policy algorithm learns from its second trainer
#: step on (4 envs x 1 step for SAC and TD3, 32 env steps for DQN, past learning_starts):
#: a test that trains two steps compares trained weights and optimiser moments, not the
#: initial ones.
SMALL = {
    "ppo": ["ppo.rollout_steps=16", "ppo.minibatch_size=32"],
    "dqn": ["dqn.learning_starts=40", "dqn.batch_size=32", "dqn.opt_interval=32",
            "dqn.gradient_steps=4", "dqn.hidden=[64,64]"],
    "sac": ["sac.learning_starts=4", "sac.batch_size=32"],
    "td3": ["td3.learning_starts=4", "td3.batch_size=32"],
    "qrdqn": ["qrdqn.learning_starts=40", "qrdqn.batch_size=32", "qrdqn.opt_interval=32",
              "qrdqn.gradient_steps=4", "qrdqn.hidden=[64,64]", "qrdqn.n_quantiles=10"],
    "tqc": ["tqc.learning_starts=4", "tqc.batch_size=32"],
}

ALGOS = sorted(a for a in ALGORITHMS if a in ENVS)


def small_config(algo: str, seed: int = 0, extra: tuple[str, ...] = ()) -> RunConfig:
    """A fast config for ``algo`` (only keys the algorithm's config actually has)."""
    cls = ALGORITHMS[algo].config_cls
    names = {f.name for f in dataclasses.fields(cls)}
    sets = [s for s in SMALL.get(algo, []) if s.split("=")[0].split(".")[1] in names]
    return build_config(algo, ENVS[algo], flags={"seed": seed}, sets=[*QUIET, *sets, *extra])
