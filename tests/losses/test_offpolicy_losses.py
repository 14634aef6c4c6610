"""DQN, SAC and TD3 losses on hand-computed batches; gradient isolation; target updates."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn
from torch.testing import assert_close

from rlloop.losses.dqn import dqn_loss, dqn_target
from rlloop.losses.polyak import hard_update, polyak_update
from rlloop.losses.sac import sac_actor_loss, sac_alpha_loss, sac_critic_loss, sac_target
from rlloop.losses.td3 import (
    smoothed_target_action,
    td3_actor_loss,
    td3_critic_loss,
    td3_target,
)

REWARD = torch.tensor([1.0, 2.0])
DISCOUNT = torch.tensor([0.9, 0.81])  # gamma=0.9 with 1 and 2 summed rewards
TERMINATED = torch.tensor([False, True])


# ---------------------------------------------------------------- DQN


def test_dqn_target_and_double_dqn_target() -> None:
    next_q_target = torch.tensor([[1.0, 3.0], [2.0, 5.0]])
    next_q_online = torch.tensor([[4.0, 0.0], [0.0, 1.0]])
    # max_a Q_targ = [3, 5]; the terminated row keeps only its reward.
    assert_close(dqn_target(REWARD, DISCOUNT, TERMINATED, next_q_target), torch.tensor([3.7, 2.0]))
    # argmax_a Q_online = [0, 1] -> Q_targ = [1, 5]
    double = dqn_target(REWARD, DISCOUNT, TERMINATED, next_q_target, next_q_online)
    assert_close(double, torch.tensor([1.9, 2.0]))


def test_dqn_target_ignores_non_finite_values_after_termination() -> None:
    next_q = torch.tensor([[1.0, 3.0], [float("nan"), float("inf")]])
    assert_close(dqn_target(REWARD, DISCOUNT, TERMINATED, next_q), torch.tensor([3.7, 2.0]))


def test_dqn_huber_loss_weights_and_td_errors() -> None:
    q_values = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    actions = torch.tensor([1, 0])
    target = torch.tensor([4.0, 3.2])  # td = [2.0, 0.2]: one linear, one quadratic
    loss, stats, td = dqn_loss(q_values, actions, target)
    assert_close(td, torch.tensor([2.0, 0.2]))
    assert_close(loss, torch.tensor((1.5 + 0.02) / 2))
    assert_close(stats["q/mean"], torch.tensor(2.5))
    assert set(stats) == {"losses/q", "q/mean", "q/td_abs_mean"}

    weighted, _, _ = dqn_loss(q_values, actions, target, weights=torch.tensor([0.5, 1.0]))
    assert_close(weighted, torch.tensor((0.5 * 1.5 + 0.02) / 2))
    weighted.backward()
    assert q_values.grad is not None
    # d/dq of Huber: -clip(td, -1, 1), weighted and averaged; only taken actions get it.
    assert_close(q_values.grad, torch.tensor([[0.0, -0.25], [-0.1, 0.0]]))


# ---------------------------------------------------------------- SAC


def test_sac_target() -> None:
    q1, q2 = torch.tensor([5.0, 7.0]), torch.tensor([4.0, 9.0])
    log_prob = torch.tensor([-1.0, -2.0])
    target = sac_target(REWARD, DISCOUNT, TERMINATED, q1, q2, log_prob, alpha=0.2)
    # row 0: 1 + 0.9 * (min(5, 4) - 0.2 * -1) = 1 + 0.9 * 4.2
    assert_close(target, torch.tensor([1 + 0.9 * 4.2, 2.0]))
    tensor_alpha = sac_target(REWARD, DISCOUNT, TERMINATED, q1, q2, log_prob, torch.tensor(0.2))
    assert_close(tensor_alpha, target)


def test_sac_critic_actor_and_alpha_losses() -> None:
    q1, q2, target = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0]), torch.tensor([3.0, 2.0])
    loss, stats = sac_critic_loss(q1, q2, target)
    assert_close(loss, torch.tensor(0.5 * ((4 + 0) / 2 + (1 + 0) / 2)))
    assert_close(stats["q/mean"], torch.tensor(1.75))

    log_prob = torch.tensor([-1.0, 0.5])
    loss, stats = sac_actor_loss(q1, q2, log_prob, alpha=0.1)
    # mean(0.1 * logp - min(q1, q2)) = mean([-0.1 - 1, 0.05 - 2])
    assert_close(loss, torch.tensor((-1.1 - 1.95) / 2))
    assert_close(stats["policy/entropy"], torch.tensor(0.25))

    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    loss, stats = sac_alpha_loss(log_alpha, log_prob, target_entropy=-1.0)
    # -(log_alpha * mean(logp + H)) with mean(logp - 1) = -1.25
    assert_close(loss, log_alpha.detach() * 1.25)
    assert_close(stats["alpha/value"], torch.tensor(0.5))
    loss.backward()
    # Entropy above target (0.25 > -1) lowers alpha: positive gradient.
    assert log_alpha.grad is not None and log_alpha.grad > 0


# ---------------------------------------------------------------- TD3


def test_td3_target_critic_and_actor_losses() -> None:
    target = td3_target(
        REWARD, DISCOUNT, TERMINATED, torch.tensor([5.0, 7.0]), torch.tensor([4.0, 9.0])
    )
    assert_close(target, torch.tensor([1 + 0.9 * 4.0, 2.0]))
    q1, q2 = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0])
    loss, _ = td3_critic_loss(q1, q2, torch.tensor([3.0, 2.0]))
    assert_close(loss, torch.tensor((4 + 0) / 2 + (1 + 0) / 2))
    loss, stats = td3_actor_loss(torch.tensor([1.0, 3.0]))
    assert_close(loss, torch.tensor(-2.0))
    assert set(stats) == {"losses/actor"}


def test_smoothed_target_action_is_clipped_and_reproducible() -> None:
    action = torch.tensor([[0.0, 0.9], [-0.95, 0.2]]).repeat(500, 1)
    low, high = torch.tensor([-1.0, -1.0]), 1.0
    out = smoothed_target_action(action, 10.0, 0.5, low, high, torch.Generator().manual_seed(0))
    assert out.shape == action.shape
    assert (out >= -1).all() and (out <= 1).all()
    assert ((out - action).abs() <= 0.5 + 1e-6).all()
    # With std 10 almost every noise sample hits the clip.
    assert ((out[0::2, 0].abs() - 0.5).abs() < 1e-6).float().mean() > 0.9
    again = smoothed_target_action(action, 10.0, 0.5, low, high, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    small = smoothed_target_action(action, 0.1, 0.5, -1.0, 1.0, torch.Generator().manual_seed(1))
    assert_close((small - action)[0::2, 0].std(), torch.tensor(0.1), atol=0.01, rtol=0)


# ---------------------------------------------------------------- gradient isolation


class Actor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 2)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Tanh-squashed action and a stand-in log-prob that depends on the params."""
        mean = self.net(obs)
        return torch.tanh(mean), -(mean**2).sum(-1)


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q1, self.q2 = nn.Linear(5, 1), nn.Linear(5, 1)

    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat([obs, action], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def _batch() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "obs": torch.randn(8, 3, generator=g),
        "action": torch.rand(8, 2, generator=g) * 2 - 1,
        "reward": torch.randn(8, generator=g),
        "next_obs": torch.randn(8, 3, generator=g),
        "terminated": torch.rand(8, generator=g) < 0.3,
        "discount": torch.full((8,), 0.99),
    }


def _no_grad(module: nn.Module) -> bool:
    return all(p.grad is None or not p.grad.any() for p in module.parameters())


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_critic_loss_sends_no_gradient_into_actor(algo: str) -> None:
    torch.manual_seed(0)
    actor, critic = Actor(), Critic()
    actor_targ, critic_targ = copy.deepcopy(actor), copy.deepcopy(critic)
    log_alpha = torch.zeros((), requires_grad=True)
    b = _batch()
    # The online actor computes next actions, as SAC does, to make leakage possible.
    next_action, next_log_prob = actor(b["next_obs"])
    if algo == "sac":
        next_q1, next_q2 = critic_targ(b["next_obs"], next_action)
        args = (b["reward"], b["discount"], b["terminated"], next_q1, next_q2)
        target = sac_target(*args, next_log_prob, log_alpha.exp())
        q1, q2 = critic(b["obs"], b["action"])
        loss, _ = sac_critic_loss(q1, q2, target)
    else:
        a_targ = smoothed_target_action(actor_targ(b["next_obs"])[0], 0.2, 0.5, -1.0, 1.0)
        next_q1, next_q2 = critic_targ(b["next_obs"], a_targ)
        target = td3_target(b["reward"], b["discount"], b["terminated"], next_q1, next_q2)
        q1, q2 = critic(b["obs"], b["action"])
        loss, _ = td3_critic_loss(q1, q2, target)
    assert not target.requires_grad
    loss.backward()
    assert _no_grad(actor) and _no_grad(actor_targ) and _no_grad(critic_targ)
    assert log_alpha.grad is None
    assert not _no_grad(critic)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_actor_step_leaves_critic_unchanged(algo: str) -> None:
    torch.manual_seed(0)
    actor, critic = Actor(), Critic()
    log_alpha = torch.zeros((), requires_grad=True)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=0.1)
    critic_before = copy.deepcopy(critic.state_dict())
    actor_before = copy.deepcopy(actor.state_dict())
    obs = _batch()["obs"]
    action, log_prob = actor(obs)
    q1_pi, q2_pi = critic(obs, action)
    if algo == "sac":
        loss, _ = sac_actor_loss(q1_pi, q2_pi, log_prob, log_alpha.exp())
        alpha_loss, _ = sac_alpha_loss(log_alpha, log_prob, target_entropy=-2.0)
        alpha_loss.backward(retain_graph=True)
        assert _no_grad(actor) and _no_grad(critic)  # the alpha loss only reaches log_alpha
        log_alpha.grad = None
    else:
        loss, _ = td3_actor_loss(q1_pi)
    actor_opt.zero_grad()
    loss.backward()
    assert log_alpha.grad is None  # alpha is a constant in the actor loss
    actor_opt.step()
    for name, value in critic.state_dict().items():
        assert torch.equal(value, critic_before[name]), name
    assert any(not torch.equal(v, actor_before[k]) for k, v in actor.state_dict().items())


# ---------------------------------------------------------------- target networks


def test_polyak_update_math() -> None:
    source, target = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    with torch.no_grad():
        source.weight.fill_(4.0)
        source.bias.fill_(1.0)
        source.get_buffer("running_mean").fill_(7.0)
        target.weight.fill_(2.0)
        target.bias.fill_(0.0)
    polyak_update(target, source, tau=0.005)
    assert_close(target.weight, torch.full((3,), 0.995 * 2.0 + 0.005 * 4.0))  # 2.01
    assert_close(target.bias, torch.full((3,), 0.005))
    assert_close(target.running_mean, torch.full((3,), 7.0))  # buffers are copied
    assert_close(source.weight, torch.full((3,), 4.0))  # source untouched

    polyak_update(target, source, tau=0.0)
    assert_close(target.weight, torch.full((3,), 2.01))
    with pytest.raises(ValueError, match="tau"):
        polyak_update(target, source, tau=1.5)


def test_hard_update_copies_everything() -> None:
    norm = nn.BatchNorm1d(4)
    source = nn.Sequential(nn.Linear(3, 4), norm)
    target = copy.deepcopy(source)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    norm.get_buffer("running_var").fill_(3.0)
    hard_update(target, source)
    for (name, a), b in zip(target.state_dict().items(), source.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="copy"):
        hard_update(nn.Linear(3, 4), source)
