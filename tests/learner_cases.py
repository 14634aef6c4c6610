"""One PPO update, computed by a single in-process learner, that several learner ranks
must reproduce (tests of torch.distributed learners, spawned or on Ray)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from rlloop.algorithms.ppo import PPOLearner
from rlloop.config.ppo import PPOConfig
from rlloop.data.rollout import RolloutBatch
from rlloop.envs.core import Discrete
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.modules.actor_critic import ActorCritic


@dataclass
class PPOUpdateCase:
    cfg: PPOConfig
    module: ActorCritic  # the starting weights
    one: PPOLearner  # the single learner, after its update
    batch: RolloutBatch
    kwargs: dict[str, Any]
    expected: dict[str, float]  # the single learner's stats


def ppo_update_case(**config: Any) -> PPOUpdateCase:
    """2 epochs of 2 uneven minibatches (75 rows: shards of 18/19 rows on 2 ranks)."""
    torch.manual_seed(0)
    cfg = PPOConfig(minibatch_size=38, max_grad_norm=0.3, ent_coef=0.01, **config)
    module = ActorCritic((4,), Discrete(2), cfg.hidden, cfg.activation, 0.0)
    one = PPOLearner({DEFAULT_MODULE_ID: copy.deepcopy(module)}, cfg)
    batch = ppo_batch(75, seed=1)
    kwargs = {"num_epochs": 2, "minibatch_size": 38, "env_steps": 1000}
    expected = one.update_from_batch({DEFAULT_MODULE_ID: batch},
                                     generator=torch.Generator().manual_seed(5), **kwargs)
    return PPOUpdateCase(cfg, module, one, batch, kwargs, expected)


def ppo_batch(n: int, seed: int) -> RolloutBatch:
    """``n`` rows of CartPole-shaped PPO data: observations, actions, old log-probs,
    advantages (mean 1, std 3: standardising them matters), returns and values."""
    g = torch.Generator().manual_seed(seed)
    return RolloutBatch(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g),
                        -torch.rand(n, generator=g) - 0.5, 3 * torch.randn(n, generator=g) + 1,
                        torch.randn(n, generator=g), torch.randn(n, generator=g))
