"""The hand-derived DQN backward (the default on a CPU) matches autograd, and any network
it does not derive falls back to autograd: quietly by default, with one warning when asked
for."""

from __future__ import annotations

import copy
import warnings
from typing import cast

import pytest
import torch
from torch.testing import assert_close

from rlloop.algorithms.offpolicy_base import OffPolicyAlgorithmBase
from rlloop.config.loading import build_config
from rlloop.data.transitions import Transitions
from rlloop.learners.mlp_backprop import MLPBackprop, dqn_loss_grad, huber_loss
from rlloop.losses.dqn import dqn_loss, dqn_stats
from rlloop.modules.q_networks import MLP, QNetwork
from rlloop.runs.build import build_algorithm


@pytest.mark.parametrize("hidden", [[8], [16, 16], [9, 12, 5]])
def test_backward_equals_autograd(hidden):
    torch.manual_seed(1)
    mlp = MLP(4, hidden, 3)
    twin = copy.deepcopy(mlp)
    x = torch.randn(32, 4)
    grad_out = torch.randn(32, 3)
    twin(x).backward(grad_out)
    backprop = MLPBackprop(mlp)
    out, _ = backprop.forward(x)
    assert_close(out, twin(x))
    for _ in range(2):  # the second pass overwrites the gradients, it does not add
        out, inputs = backprop.forward(x)
        backprop.backward(inputs, grad_out)
    for p, q in zip(mlp.parameters(), twin.parameters(), strict=True):
        assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_dqn_loss_grad_is_the_gradient_of_dqn_loss(weighted):
    torch.manual_seed(2)
    q_values = (3 * torch.randn(16, 4)).requires_grad_()  # TD errors both sides of +-1
    actions = torch.randint(0, 4, (16,))
    target = 3 * torch.randn(16)
    weights = torch.rand(16) if weighted else None
    loss, stats, td = dqn_loss(q_values, actions, target, weights)
    loss.backward()
    grad, q, td_errors = dqn_loss_grad(q_values.detach(), actions, target, weights)
    assert_close(grad, q_values.grad)
    assert_close(td_errors, td)
    mine = dqn_stats(huber_loss(td_errors, weights), q, td_errors)
    assert mine.keys() == stats.keys()
    for key in stats:
        assert_close(mine[key], stats[key])


QUIET = ["mlflow=false", "progress=false", "num_envs=1", "dqn.hidden=[16,16]",
         "dqn.batch_size=8", "dqn.buffer_size=500", "dqn.learning_starts=20",
         "dqn.gradient_steps=1", "dqn.opt_interval=1"]


def _dqn(manual: bool, *sets: str):
    config = build_config("dqn", "CartPole-v1", flags={"seed": 3},
                          sets=[*QUIET, f"dqn.manual_backward={str(manual).lower()}", *sets])
    algo = cast(OffPolicyAlgorithmBase, build_algorithm(config))
    for _ in range(60):
        algo.env_step()
    return algo


@pytest.mark.parametrize("sets", [(), ("dqn.double_q=true",), ("dqn.replay=prioritized",)])
def test_manual_updates_follow_the_autograd_updates(sets):
    fused, plain = _dqn(True, *sets), _dqn(False, *sets)
    assert fused.learner.backprop is not None and plain.learner.backprop is None
    for _ in range(30):  # same seeds: same batches; the parameters stay together
        fused.optimize(60)
        plain.optimize(60)
    for p, q in zip(fused.q.parameters(), plain.q.parameters(), strict=True):
        assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert fused.learner.updates == plain.learner.updates == 30


def test_manual_learner_state_round_trips():
    a, b = _dqn(True), _dqn(True)
    for _ in range(5):
        a.optimize(60)
    b.optimize(60)  # b's parameters and Adam moments now differ from a's
    b.learner.set_state(a.learner.get_state())
    batch = a.loop.replay.sample(8, torch.Generator().manual_seed(0)).for_update()
    a.learner.update(batch)
    b.learner.update(batch)  # same parameters, Adam moments and learning rate: same step
    for p, q in zip(a.q.parameters(), b.q.parameters(), strict=True):
        assert torch.equal(p, q)


def test_manual_update_skips_a_non_finite_loss():
    algo = _dqn(True)
    batch = algo.loop.replay.sample(8, torch.Generator().manual_seed(0)).for_update()
    bad = Transitions(batch.obs, batch.action, batch.reward * float("nan"), batch.next_obs,
                      batch.terminated, batch.discount)
    assert algo.learner.backprop is not None
    before = [p.clone() for p in algo.q.parameters()]
    algo.learner.update(bad)
    assert algo.learner.skipped_updates == 1
    assert all(torch.equal(p, q) for p, q in zip(before, algo.q.parameters(), strict=True))


# ---- the structure check: anything but a plain ReLU MLP falls back to autograd


def _learner_for(online: torch.nn.Module, manual: bool | str = True, **settings):
    from rlloop.algorithms.dqn import DQNLearner, DQNModule
    from rlloop.config.offpolicy import DQNConfig

    config = DQNConfig(manual_backward=manual, hidden=[16, 16], batch_size=8,  # type: ignore[arg-type]
                       lr=1e-2, **settings)
    return DQNLearner({"default_policy": DQNModule(online)}, config)  # type: ignore[arg-type]


def _layernorm_tanh_q() -> QNetwork:
    q = QNetwork(4, 2, [16])
    q.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.LayerNorm(16),  # type: ignore[assignment]
                                torch.nn.Tanh(), torch.nn.Linear(16, 2))
    return q


def test_plain_relu_q_network_takes_the_manual_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _learner_for(QNetwork(4, 2, [16, 16])).backprop is not None


@pytest.mark.parametrize(("make", "reason"), [
    (_layernorm_tanh_q, "body is a Sequential"),
    (lambda: QNetwork(4, 2, [16, 16], dueling=True), "dueling head"),
    (lambda: _hooked(QNetwork(4, 2, [16, 16])), "has hooks"),
])
def test_other_networks_warn_once_and_train_with_autograd(make, reason):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=f"manual_backward: .*{reason}.*using autograd") as w:
        learner = _learner_for(make())
    assert len(w) == 1 and len(str(w[0].message).splitlines()) == 1
    assert learner.backprop is None
    g = torch.Generator().manual_seed(0)
    obs, action = torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)
    target = obs.sum(1)  # a fixed regression target: the Huber loss must fall
    online = learner.module().online
    with torch.no_grad():
        first = float(dqn_loss(online(obs), action, target)[0])
    for _ in range(100):
        learner.update_towards(obs, action, target)
    with torch.no_grad():
        assert float(dqn_loss(online(obs), action, target)[0]) < 0.5 * first


def test_default_takes_the_manual_path_where_it_applies_quietly():
    from rlloop.config.offpolicy import DQNConfig

    assert DQNConfig().manual_backward == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto never warns
        assert _learner_for(QNetwork(4, 2, [16, 16]), "auto").backprop is not None
        assert _learner_for(QNetwork(4, 2, [16, 16], dueling=True), "auto").backprop is None
        assert _learner_for(QNetwork(4, 2, [16, 16]), "auto", compile=True).backprop is None
        assert _learner_for(QNetwork(4, 2, [16, 16]), False).backprop is None


def _hooked(q: QNetwork) -> QNetwork:
    q.net.layers[0].register_forward_hook(lambda *args: None)
    return q
