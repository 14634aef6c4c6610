"""DQN and SAC learners train float64 modules, as a user builds them under
``torch.set_default_dtype(torch.float64)`` (issue 45, item 11: the guard's flag once took
the default dtype and the fused Adam refused it)."""

from __future__ import annotations

import torch

from rlloop.algorithms.dqn import DQNLearner, DQNModule
from rlloop.algorithms.sac import SACLearner, SACModule
from rlloop.config.offpolicy import DQNConfig, SACConfig
from rlloop.data.transitions import Transitions
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.modules.q_networks import QNetwork


def _batch(obs_dim: int, action: torch.Tensor) -> Transitions:
    g = torch.Generator().manual_seed(0)
    n = len(action)
    return Transitions(torch.randn(n, obs_dim, generator=g), action, torch.randn(n, generator=g),
                       torch.randn(n, obs_dim, generator=g), torch.zeros(n, dtype=torch.bool),
                       torch.full((n,), 0.99))


def _moved(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_dqn_learner_steps_float64_modules(float64_default: None) -> None:
    torch.manual_seed(0)
    online = QNetwork(4, 2, [16, 16])
    assert next(online.parameters()).dtype == torch.float64
    learner = DQNLearner({DEFAULT_MODULE_ID: DQNModule(online)}, DQNConfig())
    before = [p.detach().clone() for p in online.parameters()]
    stats = learner.update(_batch(4, torch.randint(0, 2, (16,))))
    assert torch.isfinite(stats["losses/q"])
    assert _moved(before, online)


def test_sac_learner_steps_float64_modules(float64_default: None) -> None:
    torch.manual_seed(0)
    module = SACModule(3, 1, SACConfig(hidden=[16, 16]))
    learner = SACLearner({DEFAULT_MODULE_ID: module}, SACConfig(hidden=[16, 16]),
                         target_entropy=-1.0, generator=torch.Generator().manual_seed(1))
    before = [p.detach().clone() for p in module.parameters()]
    learner.update(_batch(3, torch.rand(16, 1) * 2 - 1))
    assert _moved(before, module)
