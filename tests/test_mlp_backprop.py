"""The hand-derived MLP backward and DQN's fused update match autograd."""

from __future__ import annotations

import copy
from typing import cast

import pytest
import torch
from torch.testing import assert_close

from rlloop.algorithms.offpolicy import ReplayBatch
from rlloop.algorithms.offpolicy_algorithm import OffPolicyAlgorithmBase
from rlloop.config import build_config
from rlloop.learners.mlp_backprop import MLPBackprop
from rlloop.losses.dqn import dqn_loss, dqn_loss_grad, dqn_stats, huber_loss
from rlloop.modules.q_networks import MLP
from rlloop.run import build_algorithm


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


def _dqn(fused: bool, *sets: str):
    config = build_config("dqn", "CartPole-v1", flags={"seed": 3},
                          sets=[*QUIET, f"dqn.fused_update={str(fused).lower()}", *sets])
    algo = cast(OffPolicyAlgorithmBase, build_algorithm(config))
    for _ in range(60):
        algo.env_step()
    return algo


@pytest.mark.parametrize("sets", [(), ("dqn.double_q=true",), ("dqn.replay=prioritized",)])
def test_fused_updates_follow_the_autograd_updates(sets):
    fused, plain = _dqn(True, *sets), _dqn(False, *sets)
    assert fused.learner.backprop is not None and plain.learner.backprop is None
    for _ in range(30):  # same seeds: same batches; the parameters stay together
        fused.optimize(60)
        plain.optimize(60)
    for p, q in zip(fused.q.parameters(), plain.q.parameters(), strict=True):
        assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert fused.learner.updates == plain.learner.updates == 30


def test_fused_learner_state_round_trips():
    a, b = _dqn(True), _dqn(True)
    for _ in range(5):
        a.optimize(60)
    b.optimize(60)  # b's parameters and Adam moments now differ from a's
    b.learner.set_state(a.learner.get_state())
    batch = ReplayBatch.of(a.loop.replay.sample(8, torch.Generator().manual_seed(0)))
    a.learner.update(batch)
    b.learner.update(batch)  # same parameters, Adam moments and learning rate: same step
    for p, q in zip(a.q.parameters(), b.q.parameters(), strict=True):
        assert torch.equal(p, q)


def test_fused_update_skips_a_non_finite_loss():
    algo = _dqn(True)
    batch = ReplayBatch.of(algo.loop.replay.sample(8, torch.Generator().manual_seed(0)))
    bad = ReplayBatch(batch.obs, batch.action, batch.reward * float("nan"), batch.next_obs,
                      batch.terminated, batch.discount)
    assert algo.learner.backprop is not None
    before = [p.clone() for p in algo.q.parameters()]
    algo.learner.update(bad)
    assert algo.learner.skipped_updates == 1 and algo.learner.updates == 0
    assert all(torch.equal(p, q) for p, q in zip(before, algo.q.parameters(), strict=True))


# ---- SAC: twin critics, the tanh-Gaussian head, the loss gradients, whole updates


def test_twin_backprop_equals_autograd():
    from rlloop.learners.mlp_backprop import TwinMLPBackprop
    from rlloop.modules.q_networks import TwinQ

    torch.manual_seed(4)
    twin = TwinQ(3, 2, [16, 12])
    ref = copy.deepcopy(twin)
    obs, action = torch.randn(10, 3), torch.randn(10, 2).requires_grad_()
    grad_q = torch.randn(2, 10)
    ref(obs, action).backward(grad_q)
    bp = TwinMLPBackprop(twin)
    q, inputs = bp.forward(obs, action.detach())
    assert_close(q, ref(obs, action).detach())
    grad_in = bp.backward(inputs, grad_q, input_grad=True)
    assert grad_in is not None and action.grad is not None
    assert_close(grad_in[:, 3:], action.grad, rtol=1e-5, atol=1e-6)
    for p, r in zip(twin.parameters(), ref.parameters(), strict=True):
        assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-6)


def test_tanh_gaussian_grad_equals_autograd():
    from rlloop.modules.q_networks import TanhGaussianActor, tanh_gaussian_grad

    torch.manual_seed(5)
    actor = TanhGaussianActor(3, 2, [8])
    out = torch.randn(64, 4) * 3  # some raw log sigmas outside [-20, 2] after scaling
    out[:5, 2:] = 4.0
    out = out.requires_grad_()
    action, log_prob, sample = actor.head(out, torch.Generator().manual_seed(0))
    g_action, g_log_prob = torch.randn(64, 2), torch.randn(64)
    (action * g_action).sum().add((log_prob * g_log_prob).sum()).backward()
    mine = tanh_gaussian_grad(sample, g_action, g_log_prob)
    assert_close(mine, out.grad, rtol=1e-4, atol=1e-5)
    assert torch.all(mine[:5, 2:] == 0)  # clamped log sigma: no gradient


def test_sac_loss_grads_equal_autograd():
    from rlloop.losses.sac import (
        sac_actor_loss,
        sac_actor_loss_grad,
        sac_alpha_loss,
        sac_alpha_loss_grad,
        sac_critic_loss,
        sac_critic_loss_grad,
    )

    torch.manual_seed(6)
    q, target = torch.randn(2, 32).requires_grad_(), torch.randn(32)
    q_pi, log_prob = torch.randn(2, 32), torch.randn(32).requires_grad_()
    q_pi[1, :3] = q_pi[0, :3]  # ties split the gradient
    q_pi.requires_grad_()
    alpha, log_alpha = torch.tensor(0.3), torch.tensor(-1.2, requires_grad=True)
    sac_critic_loss(q[0], q[1], target)[0].backward()
    assert_close(sac_critic_loss_grad(q.detach(), target), q.grad)
    sac_actor_loss(q_pi[0], q_pi[1], log_prob, alpha)[0].backward()
    grad_q, grad_log_prob = sac_actor_loss_grad(q_pi.detach(), alpha)
    assert_close(grad_q, q_pi.grad)
    assert_close(grad_log_prob, log_prob.grad)
    sac_alpha_loss(log_alpha, log_prob, -2.0)[0].backward()
    assert_close(sac_alpha_loss_grad(log_prob.detach(), -2.0), log_alpha.grad)


def _sac(fused: bool, *sets: str):
    config = build_config("sac", "Pendulum-v1", flags={"seed": 3},
                          sets=["mlflow=false", "progress=false", "sac.hidden=[32,32]",
                                "sac.batch_size=16", "sac.learning_starts=20",
                                f"sac.fused_update={str(fused).lower()}", *sets])
    algo = cast(OffPolicyAlgorithmBase, build_algorithm(config))
    for _ in range(40):
        algo.env_step()
    return algo


@pytest.mark.parametrize("sets", [(), ("sac.autotune_alpha=false",)])
def test_sac_fused_updates_follow_the_autograd_updates(sets):
    fused, plain = _sac(True, *sets), _sac(False, *sets)
    assert fused.learner.backprop is not None and plain.learner.backprop is None
    for _ in range(25):
        a, b = fused.optimize(40), plain.optimize(40)
        assert a is not None and b is not None and a.keys() == b.keys()
    for p, q in zip(fused.module.parameters(), plain.module.parameters(), strict=True):
        assert_close(p, q, rtol=1e-4, atol=1e-5)
    for p, q in zip(fused.module.critic_target.parameters(),
                    plain.module.critic_target.parameters(), strict=True):
        assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert fused.learner.updates == plain.learner.updates == 25


def test_sac_fused_update_skips_a_non_finite_loss():
    algo = _sac(True)
    batch = ReplayBatch.of(algo.loop.replay.sample(16, torch.Generator().manual_seed(0)))
    bad = ReplayBatch(batch.obs, batch.action, batch.reward * float("nan"), batch.next_obs,
                      batch.terminated, batch.discount)
    before = [p.clone() for p in algo.module.parameters()]
    algo.learner.update(bad)
    assert algo.learner.skipped_updates == 1 and algo.learner.updates == 0
    assert all(torch.equal(p, q)
               for p, q in zip(before, algo.module.parameters(), strict=True))
