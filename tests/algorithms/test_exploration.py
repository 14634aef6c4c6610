"""Exploration aids: Gaussian and Ornstein-Uhlenbeck action noise (TD3) and gSDE (SAC,
PPO). The math is pinned against direct computations and Stable-Baselines3's own
distribution; the cadences and checkpointed state are pinned inside the algorithms."""

from __future__ import annotations

import math
from typing import cast

import pytest
import torch
from torch.testing import assert_close

from rlloop.algorithms.ppo import PPO
from rlloop.algorithms.sac import SAC
from rlloop.algorithms.td3 import TD3
from rlloop.checkpoint import load_checkpoint, save_checkpoint
from rlloop.config.loading import build_config
from rlloop.envs.core import Box
from rlloop.errors import ConfigError
from rlloop.modules.action_noise import OrnsteinUhlenbeckNoise
from rlloop.modules.actor_critic import ActorCritic
from rlloop.modules.distributions import DiagGaussian
from rlloop.modules.gsde import StateDependentNoise, TanhGSDEActor
from rlloop.modules.q_networks import tanh_log_det
from rlloop.runs.build import build_algorithm

QUIET = ["mlflow=false", "progress=false"]


def _build(algo: str, *sets: str, num_envs: int = 2):
    small = [f"{algo}.hidden=[16,16]"]
    if algo != "ppo":
        small += [f"{algo}.batch_size=8", f"{algo}.buffer_size=500"]
    return build_algorithm(build_config(algo, "Pendulum-v1", sets=[
        *QUIET, f"num_envs={num_envs}", *small, *sets]))


# ---------------------------------------------------------------- action noise


def test_ou_noise_follows_the_euler_maruyama_step_and_restarts_finished_envs():
    gen = torch.Generator().manual_seed(0)
    replay = torch.Generator().manual_seed(0)
    ou = OrnsteinUhlenbeckNoise((3, 2), std=0.5, generator=gen, theta=0.15, dt=0.01)
    x = torch.zeros(3, 2)
    for _ in range(5):
        x = x + 0.15 * (0.0 - x) * 0.01 + 0.5 * math.sqrt(0.01) * torch.randn(
            (3, 2), generator=replay)
        assert_close(ou.sample(), x)
    ou.episode_end(torch.tensor([False, True, False]))
    assert_close(ou.state[1], torch.zeros(2))
    assert_close(ou.state[[0, 2]], x[[0, 2]])
    # The restarted env's next value starts from 0, the others continue their path.
    eps = torch.randn((3, 2), generator=replay)
    nxt = ou.sample()
    assert_close(nxt[1], 0.5 * 0.1 * eps[1])
    assert_close(nxt[0], x[0] * (1 - 0.15 * 0.01) + 0.05 * eps[0])


def test_td3_explores_with_the_configured_noise():
    for kind, scale in (("none", 0.0), ("normal", 0.3), ("ornstein_uhlenbeck", 0.03)):
        td3 = cast(TD3, _build("td3", f"td3.action_noise={kind}", "td3.action_noise_std=0.3"))
        obs = td3.runner.obs
        replay = torch.Generator().set_state(td3.generator.get_state())
        with torch.no_grad():
            mu = td3.module.actor(obs)
            action = td3._explore(obs)
        # Gaussian: std * N(0, 1); OU's first step from 0: sigma * sqrt(dt) * N(0, 1).
        expected = (mu + scale * torch.randn(mu.shape, generator=replay)).clamp(-1, 1)
        assert_close(action, expected)
        td3.close()


def test_td3_ou_noise_takes_its_theta_and_dt():
    td3 = cast(TD3, _build("td3", "td3.action_noise=ornstein_uhlenbeck",
                           "td3.action_noise_std=0.3", "td3.ou_theta=0.5", "td3.ou_dt=0.04"))
    replay = torch.Generator().set_state(td3.generator.get_state())
    shape = td3.runner.obs.shape[0], 1
    first, second = td3.noise.sample(), td3.noise.sample()
    # sigma * sqrt(dt) = 0.3 * 0.2; each step keeps (1 - theta * dt) = 0.98 of the last.
    eps1, eps2 = torch.randn(shape, generator=replay), torch.randn(shape, generator=replay)
    assert_close(first, 0.06 * eps1)
    assert_close(second, 0.98 * first + 0.06 * eps2)
    td3.close()


@pytest.mark.parametrize("algo", ["sac", "ppo"])
def test_gsde_settings_reach_the_policy(algo):
    built = _build(algo, f"{algo}.use_sde=true", f"{algo}.use_expln=true",
                   f"{algo}.full_std=false", f"{algo}.init_log_std=-1.5")
    module = built.learner.modules["default_policy"]
    sde = module.actor.sde if algo == "sac" else module.sde
    assert sde.use_expln
    assert sde.log_std.shape == (16, 1)  # one sigma per feature, not per (feature, action)
    assert bool((sde.log_std == -1.5).all())
    built.close()


def test_ou_state_restarts_at_episode_ends_inside_the_loop():
    td3 = cast(TD3, _build("td3", "td3.action_noise=ornstein_uhlenbeck",
                           "td3.learning_starts=0", "env_kwargs={max_episode_steps: 5}"))
    for _ in range(4):
        td3.env_step()
    assert bool((td3.noise.state != 0).all())  # type: ignore[attr-defined]
    td3.env_step()  # the 5th step truncates every episode: the noise restarts at 0
    assert torch.equal(td3.noise.state, torch.zeros_like(td3.noise.state))  # type: ignore[attr-defined]
    td3.close()


@pytest.mark.parametrize("algo,sets", [
    ("td3", ["td3.action_noise=ornstein_uhlenbeck", "td3.learning_starts=0"]),
    ("sac", ["sac.use_sde=true", "sac.learning_starts=0", "sac.sde_sample_freq=3",
             "sac.opt_interval=4"]),
])
def test_exploration_state_resumes_exactly(tmp_path, algo, sets):
    """A checkpoint taken mid-rollout continues with the same actions: the OU state and
    gSDE's noise matrices and their age are in it."""
    first = _build(algo, *sets)
    for _ in range(6):
        first.env_step()
        first.optimize(first.loop.env_steps)
    first.env_step()  # mid-rollout: the noise matrices are one step old
    save_checkpoint(tmp_path / "ckpt", {"algorithm": first.get_state()})
    second = _build(algo, *sets, "seed=7")
    second.set_state(load_checkpoint(tmp_path / "ckpt").components["algorithm"])
    for _ in range(5):
        with torch.no_grad():
            a, b = first._explore(first.runner.obs), second._explore(second.runner.obs)
        assert torch.equal(a, b)
        first.env_step()
        second.env_step()
    first.close()
    second.close()


def test_bad_noise_settings_are_refused():
    for sets, match in ((["td3.action_noise=pink"], "td3.action_noise must be one of"),
                        (["td3.ou_dt=0"], "td3.ou_dt must be > 0"),
                        (["sac.sde_sample_freq=0"], "sac.sde_sample_freq must be > 0 or -1"),
                        (["ma_ppo.use_sde=true"], "ma_ppo supports neither gSDE")):
        algo = sets[0].split(".")[0]
        with pytest.raises(ConfigError, match=match):
            build_config(algo, "Pendulum-v1", sets=sets)


# ---------------------------------------------------------------- gSDE math


def _sde(full_std: bool = True, use_expln: bool = False) -> StateDependentNoise:
    torch.manual_seed(0)
    sde = StateDependentNoise(5, 3, -1.0, full_std=full_std, use_expln=use_expln)
    with torch.no_grad():
        sde.log_std.add_(torch.randn_like(sde.log_std))
    return sde


@pytest.mark.parametrize("full_std,use_expln", [(True, False), (False, False), (True, True)])
def test_sde_variance_is_the_sum_over_features_of_phi_times_sigma_squared(full_std, use_expln):
    sde = _sde(full_std, use_expln)
    phi = torch.randn(4, 5)
    log_std = sde.log_std.detach()
    for b in range(4):
        for i in range(3):
            var = 0.0
            for j in range(5):
                raw = float(log_std[j, i if full_std else 0])
                sigma = (math.exp(raw) if not use_expln or raw <= 0
                         else math.log1p(raw) + 1.0)
                var += (float(phi[b, j]) * sigma) ** 2
            got = float(sde.log_std_of(phi)[b, i].detach())
            assert got == pytest.approx(0.5 * math.log(var + 1e-6), rel=1e-5)


def test_sde_noise_has_that_variance_and_a_matrix_per_row():
    sde = _sde()
    phi = torch.randn(1, 5)
    gen = torch.Generator().manual_seed(1)
    eps = sde.sample_eps((20000,), gen)
    with torch.no_grad():
        noise = sde.noise(phi.expand(20000, 5), eps)
        expected = sde.log_std_of(phi).exp().square()[0]
    assert_close(noise.var(0), expected, rtol=0.05, atol=0.0)
    # One shared matrix: the same as that matrix given to every row.
    rows = torch.randn(6, 5)
    with torch.no_grad():
        assert_close(sde.noise(rows, eps[0]), sde.noise(rows, eps[0].expand(6, 5, 3)))


def test_sde_log_prob_equals_a_direct_gaussian_and_sac_adds_the_tanh_term():
    torch.manual_seed(0)
    actor = TanhGSDEActor(4, 2, [16, 16], init_log_std=-1.0, use_expln=True)
    obs = torch.randn(7, 4)
    eps = torch.randn(16, 2)
    action, log_prob = actor(obs, noise=eps)
    phi, mean = actor.features(obs)
    std = actor.sde.std()
    u = mean + phi @ (eps * std)
    direct = torch.distributions.Normal(mean, ((phi ** 2) @ std ** 2 + 1e-6).sqrt())
    tanh = torch.distributions.transforms.TanhTransform()
    expected = direct.log_prob(u).sum(-1) - tanh.log_abs_det_jacobian(u, torch.tanh(u)).sum(-1)
    assert_close(action, torch.tanh(u))
    assert_close(log_prob, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(actor.sample(obs, noise=eps), action)  # acting: no log-probability
    # The gradient reaches sigma through the noise (the reparameterised matrix).
    log_prob.sum().backward()
    assert actor.sde.log_std.grad is not None and actor.sde.log_std.grad.abs().sum() > 0


def test_sde_equals_stable_baselines3_on_identical_inputs():
    sb3 = pytest.importorskip("stable_baselines3.common.distributions")
    torch.manual_seed(0)
    for squash in (True, False):
        sde = StateDependentNoise(6, 2, -0.5, full_std=True, use_expln=squash,
                                  learn_features=squash)
        with torch.no_grad():
            sde.log_std.add_(0.3 * torch.randn_like(sde.log_std))
        ref = sb3.StateDependentNoiseDistribution(2, full_std=True, use_expln=squash,
                                                  squash_output=squash, learn_features=squash)
        ref.latent_sde_dim = 6
        phi, mean = torch.randn(5, 6), 0.3 * torch.randn(5, 2)
        eps = torch.randn(5, 6, 2)
        ref.exploration_matrices = eps * ref.get_std(sde.log_std.detach())
        ref.exploration_mat = ref.exploration_matrices[0]
        ref.proba_distribution(mean, sde.log_std.detach(), phi)
        with torch.no_grad():
            ours_u = mean + sde.noise(phi, eps)
            log_std = sde.log_std_of(phi)
        assert_close(ours_u, ref.distribution.mean + ref.get_noise(phi))
        assert_close(log_std.exp(), ref.distribution.stddev)
        if squash:  # SB3 inverts tanh and adds 1e-6 inside its log: equal to ~1e-3
            gauss = DiagGaussian(mean, log_std).log_prob(ours_u)
            assert_close(gauss - tanh_log_det(ours_u), ref.log_prob(torch.tanh(ours_u)),
                         rtol=1e-3, atol=1e-3)
        else:
            d = DiagGaussian(mean, log_std)
            assert_close(d.log_prob(ours_u), ref.log_prob(ours_u))
            assert_close(d.entropy(), ref.entropy())


# ---------------------------------------------------------------- gSDE cadences


def _eps_changes(step, get_eps, steps: int) -> list[int]:
    """The steps (from 0) at which ``get_eps()`` holds a new matrix after ``step(k)``."""
    changed, last = [], None
    for k in range(steps):
        step(k)
        eps = get_eps()
        if last is None or not torch.equal(eps, last):
            changed.append(k)
        last = eps.clone()
    return changed


def test_sac_sde_resamples_every_sample_freq_and_at_each_rollout_start():
    sac = cast(SAC, _build("sac", "sac.use_sde=true", "sac.learning_starts=0",
                           "sac.sde_sample_freq=3", "sac.opt_interval=10", num_envs=1))

    def step(k: int) -> None:
        sac.env_step()
        if sac.loop.env_steps % 10 == 0:
            sac.optimize(sac.loop.env_steps)

    # Rollouts are 10 env steps: new matrices at 0, 3, 6, 9 of each.
    assert _eps_changes(step, lambda: cast(torch.Tensor, sac._sde_eps), 25) == [
        0, 3, 6, 9, 10, 13, 16, 19, 20, 23]
    sac.close()


def test_sac_sde_default_resamples_once_per_rollout():
    sac = cast(SAC, _build("sac", "sac.use_sde=true", "sac.learning_starts=0",
                           "sac.opt_interval=4", num_envs=1))

    def step(k: int) -> None:
        sac.env_step()
        if sac.loop.env_steps % 4 == 0:
            sac.optimize(sac.loop.env_steps)

    assert _eps_changes(step, lambda: cast(torch.Tensor, sac._sde_eps), 12) == [0, 4, 8]
    sac.close()


def test_ppo_sde_resamples_at_rollout_start_and_every_sample_freq():
    ppo = cast(PPO, _build("ppo", "ppo.use_sde=true", "ppo.sde_sample_freq=3",
                           "ppo.rollout_steps=5", "ppo.minibatch_size=10"))
    seen: list[torch.Tensor] = []
    behaviour = ppo._behaviour

    def spy(obs: torch.Tensor):
        out = behaviour(obs)
        seen.append(cast(torch.Tensor, ppo._sde_eps).clone())
        return out

    ppo._behaviour = spy  # type: ignore[method-assign]
    ppo.collect()
    ppo.collect()
    changes = [k for k in range(len(seen)) if k == 0 or not torch.equal(seen[k], seen[k - 1])]
    assert changes == [0, 3, 5, 8]  # per rollout of 5 steps: at 0 and 3
    assert seen[0].shape == (2, 16, 1)  # one matrix per env
    assert not torch.equal(seen[0][0], seen[0][1])
    ppo.close()


def test_ppo_sde_log_prob_of_rollout_actions_is_the_state_dependent_gaussian():
    torch.manual_seed(0)
    policy = ActorCritic((3,), Box((-2.0,), (2.0,), (1,)), (8, 8), init_log_std=-1.0,
                         sde=(True, False))
    obs = torch.randn(4, 3)
    eps = torch.randn(4, 8, 1)
    actions, log_prob = policy.act(obs, sde_eps=eps)
    latent = policy.actor[:-1](obs)
    mean = policy.actor[-1](latent)
    sigma = policy.sde.std()  # type: ignore[union-attr]
    noise = torch.stack([latent[b] @ (eps[b] * sigma) for b in range(4)])
    assert_close(actions, mean + noise)
    std = ((latent ** 2) @ sigma ** 2 + 1e-6).sqrt()
    assert_close(log_prob, torch.distributions.Normal(mean, std).log_prob(actions).sum(-1))
    # PPO's loss reads the same log-probability from dist() (no noise matrix needed).
    assert_close(policy.dist(obs).log_prob(actions), log_prob)
    # Deterministic acting is the mean.
    assert_close(policy.act(obs, deterministic=True)[0], mean)


def test_ppo_sde_needs_box_actions():
    with pytest.raises(ConfigError, match=r"ppo\.use_sde needs continuous"):
        build_algorithm(build_config("ppo", "CartPole-v1", sets=[*QUIET, "ppo.use_sde=true"]))
