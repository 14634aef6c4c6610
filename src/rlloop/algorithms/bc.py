"""Behaviour cloning: a policy fitted to a dataset's actions by supervised learning.

Discrete actions: a categorical policy trained by cross-entropy, acting greedily
(:func:`~rlloop.losses.offline.bc_discrete_loss`). Continuous actions: a deterministic
policy ``tanh(MLP(s))`` in ``[-1, 1]^d`` trained by squared error against the dataset's
actions rescaled there (:func:`~rlloop.losses.offline.bc_continuous_loss`). It runs on the
offline cadence (:mod:`rlloop.algorithms.offline_base`).
"""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from rlloop.algorithms.base import EnvSettings
from rlloop.algorithms.offline_base import OfflineAlgorithmBase, OfflineLearnerBase
from rlloop.config.offline import BCConfig as BCConfig
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Discrete
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.losses.offline import bc_continuous_loss, bc_discrete_loss
from rlloop.modules.networks import flat_dim
from rlloop.modules.offline_actors import CategoricalPolicy
from rlloop.modules.q_networks import DeterministicActor
from rlloop.system.devices import build_module


class BCModule(nn.Module):
    """The cloned policy: logits for ``n_actions > 0``, else a ``tanh`` actor of ``act_dim``."""

    def __init__(self, obs_dim: int, n_actions: int, act_dim: int, config: BCConfig) -> None:
        super().__init__()
        self.discrete = n_actions > 0
        self.policy: nn.Module = (CategoricalPolicy(obs_dim, n_actions, config.hidden)
                                  if self.discrete else
                                  DeterministicActor(obs_dim, act_dim, config.hidden))


class BCLearner(OfflineLearnerBase):
    """One ``"policy"`` optimiser; no target networks."""

    config: BCConfig

    def module(self, module_id: str = DEFAULT_MODULE_ID) -> BCModule:
        return cast(BCModule, self.modules[module_id])

    def configure_optimizers_for_module(self, module_id: str, config: BCConfig) -> None:
        self.add_adam(module_id, "policy", list(self.module(module_id).parameters()), config.lr)

    def compute_loss_for_module(self, module_id: str, config: BCConfig, batch: Transitions,
                                fwd_out: object = None) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.module(module_id)
        out = m.policy(batch.obs)
        return (bc_discrete_loss(out, batch.action) if m.discrete else
                bc_continuous_loss(out, batch.action))



class BC(OfflineAlgorithmBase):
    """Behaviour cloning of a dataset's actions, evaluated in the env."""

    name = "bc"
    takes_discrete = True
    config: BCConfig
    learner: BCLearner
    module: BCModule

    def __init__(self, config: BCConfig, env: EnvSettings) -> None:
        super().__init__(config, env)
        space = env.spec.action_space
        n_actions = space.n if isinstance(space, Discrete) else 0
        act_dim = 0 if isinstance(space, Discrete) else space.dim  # type: ignore[union-attr]
        obs_dim = flat_dim(env.spec.obs_shape)
        self.module = build_module(lambda: BCModule(obs_dim, n_actions, act_dim, config),
                                   self.device)
        self.learner = BCLearner({DEFAULT_MODULE_ID: self.module}, config,
                                 on_nonfinite=env.on_nonfinite)

    def act_unit(self, obs: Tensor, deterministic: bool) -> Tensor:
        out = self.module.policy(obs)
        if not self.module.discrete:
            return cast(Tensor, out)
        if deterministic:
            return out.argmax(-1)
        return out.softmax(-1).multinomial(1, generator=self._eval_generator).squeeze(-1)
