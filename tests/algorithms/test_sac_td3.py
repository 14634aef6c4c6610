"""SAC and TD3 inside the algorithms: one backward pass that gives each optimiser exactly
its own loss's gradient, target cadences, delayed actor updates, the networks, action
scaling."""

from __future__ import annotations

import copy
import math
from typing import cast

import pytest
import torch
from torch.testing import assert_close

from rlloop.algorithms.offpolicy_base import OffPolicyAlgorithmBase
from rlloop.algorithms.offpolicy_loop import box_rescaler
from rlloop.config.loading import build_config
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Box
from rlloop.errors import ConfigError
from rlloop.losses.sac import sac_actor_loss, sac_alpha_loss, sac_critic_loss, sac_target
from rlloop.losses.td3 import td3_actor_loss
from rlloop.modules.q_networks import TanhGaussianActor, TwinQ
from rlloop.runs.build import build_algorithm

QUIET = ["mlflow=false", "progress=false", "num_envs=1"]


def _algo(name: str, *sets: str):
    small = [f"{name}.hidden=[32,32]", f"{name}.batch_size=16", f"{name}.learning_starts=20",
             f"{name}.buffer_size=1000"]
    algo = cast(OffPolicyAlgorithmBase, build_algorithm(
        build_config(name, "Pendulum-v1", sets=[*QUIET, *small, *sets])))
    for _ in range(30):
        algo.env_step()
    return algo


def _batch(algo, seed: int = 0) -> Transitions:
    return algo.loop.replay.sample(16, torch.Generator().manual_seed(seed)).for_update()


def _grads(params) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in params]


# ---------------------------------------------------------------- networks


def test_twin_q_members_are_independent_critics():
    torch.manual_seed(0)
    critic = TwinQ(3, 1, [8, 8])
    obs, act = torch.randn(5, 3), torch.randn(5, 1)
    q = critic(obs, act)
    assert q.shape == (2, 5)
    assert not torch.equal(q[0], q[1])
    assert_close(critic(obs, act, member=1)[0], q[1])
    # Member 0 by hand: a plain ReLU MLP on [obs, act] with its own weights.
    x = torch.cat([obs, act], 1)
    for i, (w, b) in enumerate(zip(critic.weights, critic.biases, strict=True)):
        x = x @ w[0] + b[0]
        x = x.relu() if i < 2 else x
    assert_close(x.squeeze(-1), q[0])


def test_twin_q_runs_each_member_as_2d_matmuls_forward_and_backward():
    """The stacked weights are read as per-member 2-D matmuls: on a CPU, bmm's backward
    copies its transposed operands and a width-1 layer runs as slow matrix-vector
    products (a SAC update was 12% slower). Gradients still reach both members."""
    critic = TwinQ(3, 1, [8, 8])
    with torch.profiler.profile() as prof:
        critic(torch.randn(4, 3), torch.randn(4, 1)).sum().backward()
    ops = {event.key for event in prof.key_averages()}
    assert {"aten::addmm", "aten::mm"} <= ops
    assert not {"aten::bmm", "aten::baddbmm"} & ops
    for p in critic.parameters():  # both members get their gradient
        assert p.grad is not None and bool(p.grad.flatten(1).abs().sum(1).gt(0).all())


def test_detached_critic_passes_gradient_to_the_action_only():
    critic = TwinQ(3, 1, [8, 8])
    act = torch.randn(4, 1, requires_grad=True)
    critic(torch.randn(4, 3), act, detach_params=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())


def test_tanh_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    actor = TanhGaussianActor(3, 2, [16])
    obs = torch.randn(7, 3)
    action, log_prob = actor(obs, torch.Generator().manual_seed(1))
    mean, log_std = actor.net(obs).chunk(2, -1)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.clamp(-20, 2).exp()),
        [torch.distributions.TanhTransform()])
    assert action.abs().max() < 1
    assert_close(log_prob, dist.log_prob(action).sum(-1), rtol=1e-4, atol=1e-4)
    assert_close(actor.mode(obs), torch.tanh(mean))
    # Acting samples without the log-probability: the same action from the same draw.
    assert torch.equal(actor.sample(obs, torch.Generator().manual_seed(1)), action)


def test_box_rescaler_maps_unit_box_to_bounds():
    scale = box_rescaler("sac", Box((-2.0, 0.0), (2.0, 1.0), (2,)))
    assert_close(scale(torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]])),
                 torch.tensor([[-2.0, 0.0], [2.0, 1.0], [0.0, 0.5]]))
    with pytest.raises(ConfigError, match="bounded action space"):
        box_rescaler("sac", Box((-math.inf,), (math.inf,), (1,)))


# ---------------------------------------------------------------- SAC


def test_sac_registers_three_optimisers_on_one_module():
    learner = _algo("sac").learner
    assert set(learner.get_optimizers_for_module("default_policy")) == {
        "actor", "critic", "alpha"}


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_linear_lr_schedule_decays_every_optimiser_on_the_env_step_timeline(name):
    # rl-zoo's lin_7.3e-4 (SAC on LunarLanderContinuous): from lr to 0 over lr_decay_steps
    algo = _algo(name, f"{name}.lr=0.001", f"{name}.lr_schedule=linear",
                 f"{name}.lr_decay_steps=100")
    assert algo.optimize(30) is not None
    optimizers = algo.learner.get_optimizers_for_module("default_policy")
    assert len(optimizers) >= 2
    for optimizer in optimizers.values():
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.001 * (1 - 30 / 100))
    algo.optimize(150)  # past the decay: 0, not negative
    assert all(o.param_groups[0]["lr"] == 0.0 for o in optimizers.values())
    constant = _algo(name, f"{name}.lr=0.001")
    constant.optimize(30)
    assert all(o.param_groups[0]["lr"] == 0.001
               for o in constant.learner.get_optimizers_for_module("default_policy").values())


def test_sac_single_backward_gives_each_optimiser_its_own_gradient():
    algo = _algo("sac")
    learner, m = algo.learner, algo.learner.module()
    batch = _batch(algo)
    gen_state = learner.generator.get_state()
    loss, _ = learner.compute_loss_for_module("default_policy", learner.config, batch)
    for p in m.parameters():
        p.grad = None
    loss.backward()
    combined = {name: _grads(part) for name, part in (
        ("actor", m.actor.parameters()), ("critic", m.critic.parameters()),
        ("alpha", [m.log_alpha]), ("target", m.critic_target.parameters()))}

    # The same three losses, each differentiated on its own (same noise draws).
    learner.generator.set_state(gen_state)
    alpha = m.log_alpha.detach().exp()
    with torch.no_grad():
        next_a, next_logp = m.actor(batch.next_obs, learner.generator)
        next_q = m.critic_target(batch.next_obs, next_a)
        y = sac_target(batch.reward, batch.discount, batch.terminated, next_q[0], next_q[1],
                       next_logp, alpha)
    q = m.critic(batch.obs, batch.action)
    critic_loss, _ = sac_critic_loss(q[0], q[1], y)
    critic_grads = torch.autograd.grad(critic_loss, list(m.critic.parameters()))
    action, logp = m.actor(batch.obs, learner.generator)
    frozen = copy.deepcopy(m.critic).requires_grad_(False)
    q_pi = frozen(batch.obs, action)
    actor_loss, _ = sac_actor_loss(q_pi[0], q_pi[1], logp, alpha)
    actor_grads = torch.autograd.grad(actor_loss, list(m.actor.parameters()), retain_graph=True)
    alpha_loss, _ = sac_alpha_loss(m.log_alpha, logp, learner.target_entropy)
    (alpha_grad,) = torch.autograd.grad(alpha_loss, [m.log_alpha])

    for got, want in zip(combined["critic"], critic_grads, strict=True):
        assert_close(got, want)
    for got, want in zip(combined["actor"], actor_grads, strict=True):
        assert_close(got, want)
    assert_close(combined["alpha"][0], alpha_grad)
    assert all(g is None for g in combined["target"])


def test_sac_polyak_target_after_every_update_and_alpha_moves():
    algo = _algo("sac", "sac.tau=0.1")
    m = algo.learner.module()
    target_before = [p.clone() for p in m.critic_target.parameters()]
    alpha_before = m.log_alpha.detach().clone()
    assert algo.optimize(30) is not None
    for t, old, c in zip(m.critic_target.parameters(), target_before, m.critic.parameters(),
                         strict=True):
        assert_close(t, old + 0.1 * (c - old))
    assert not torch.equal(m.log_alpha.detach(), alpha_before)


def test_sac_target_update_interval_spaces_the_polyak_updates():
    algo = _algo("sac", "sac.tau=0.1", "sac.target_update_interval=2")
    m = algo.learner.module()
    target0 = [p.clone() for p in m.critic_target.parameters()]
    algo.optimize(30)  # update 1: the target stays
    assert all(torch.equal(t, old) for t, old in zip(m.critic_target.parameters(), target0,
                                                    strict=True))
    algo.optimize(30)  # update 2: it moves a tenth of the way
    for t, old, c in zip(m.critic_target.parameters(), target0, m.critic.parameters(),
                         strict=True):
        assert_close(t, old + 0.1 * (c - old))


def test_sac_fixed_alpha_has_no_alpha_optimiser():
    algo = _algo("sac", "sac.autotune_alpha=false", "sac.init_alpha=0.2")
    assert set(algo.learner.get_optimizers_for_module("default_policy")) == {"actor", "critic"}
    algo.optimize(30)
    assert algo.learner.module().log_alpha.exp().item() == pytest.approx(0.2)


def test_sac_acts_within_env_bounds():
    algo = _algo("sac")
    obs = torch.randn(64, 3)
    for deterministic in (True, False):
        action = algo.act(obs, deterministic)
        assert action.shape == (64, 1) and action.abs().max() <= 2.0


# ---------------------------------------------------------------- TD3


def test_td3_delays_actor_and_target_updates():
    algo = _algo("td3", "td3.policy_delay=2", "td3.tau=0.5")
    m = algo.learner.module()
    actor0 = [p.clone() for p in m.actor.parameters()]
    target0 = [p.clone() for p in m.critic_target.parameters()]
    actor_target0 = [p.clone() for p in m.actor_target.parameters()]
    critic0 = [p.clone() for p in m.critic.parameters()]
    algo.optimize(30)  # update 1: critics only
    assert all(torch.equal(a, b) for a, b in zip(m.actor.parameters(), actor0, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(m.critic_target.parameters(), target0,
                                                 strict=True))
    assert all(torch.equal(a, b) for a, b in zip(m.actor_target.parameters(), actor_target0,
                                                 strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(m.critic.parameters(), critic0,
                                                     strict=True))
    assert all(p.grad is None for p in m.actor.parameters())
    algo.optimize(30)  # update 2: actor too, then both targets move halfway
    assert not all(torch.equal(a, b) for a, b in zip(m.actor.parameters(), actor0,
                                                     strict=True))
    for t, old, c in zip(m.critic_target.parameters(), target0, m.critic.parameters(),
                         strict=True):
        assert_close(t, old + 0.5 * (c - old))
    for t, old, a in zip(m.actor_target.parameters(), actor_target0, m.actor.parameters(),
                         strict=True):
        assert_close(t, old + 0.5 * (a - old))


def test_td3_actor_loss_reads_q1_with_frozen_critic():
    algo = _algo("td3", "td3.policy_delay=1")
    learner, m = algo.learner, algo.learner.module()
    batch = _batch(algo)
    loss, stats = learner.compute_loss_for_module("default_policy", learner.config, batch)
    assert "losses/actor" in stats
    grads = torch.autograd.grad(loss, list(m.actor.parameters()), retain_graph=True)
    frozen = copy.deepcopy(m.critic).requires_grad_(False)
    expected, _ = td3_actor_loss(frozen(batch.obs, m.actor(batch.obs))[0])
    for got, want in zip(grads, torch.autograd.grad(expected, list(m.actor.parameters())),
                         strict=True):
        assert_close(got, want)


@pytest.mark.parametrize(
    ("algo", "sets", "message"),
    [
        ("sac", ["sac.tau=2"], "sac.tau must be in"),
        ("sac", ["sac.replay=prioritized"], "supported by dqn only"),
        ("td3", ["td3.policy_delay=0"], "td3.policy_delay must be > 0"),
        ("td3", ["td3.action_noise_std=-1"], "td3.action_noise_std must be >= 0"),
        ("sac", ["sac.lr_decay_steps=0"], "sac.lr_decay_steps must be > 0"),
    ],
)
def test_bad_config_is_a_config_error(algo, sets, message):
    with pytest.raises(ConfigError, match=message):
        build_config(algo, "Pendulum-v1", sets=[*QUIET, *sets])


def test_continuous_algorithms_reject_discrete_envs():
    for algo in ("sac", "td3"):
        with pytest.raises(ConfigError, match="needs continuous"):
            build_algorithm(build_config(algo, "CartPole-v1", sets=QUIET))
