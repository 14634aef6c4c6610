"""CrossQ equals sb3-contrib's CrossQ on identical inputs (float64): six updates of
``CrossQ.train`` against rlloop's learner from the same weights, batches and policy noise,
compared update by update (critic, actor and temperature losses, every batch
renormalisation's running statistics) and in the weights after; the comparison catches
planted errors; config refusals; CLI and Python API."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import pytest
import torch
from cli_runs import train_then_load
from peer_equality import assert_equal_to_peer
from sb3_contrib import CrossQ as PeerCrossQ
from sb3_contrib.common.torch_layers import BatchRenorm1d
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from torch import Tensor, nn
from torch.distributions import Normal

import rlloop.algorithms.crossq as crossq_module
from rlloop.algorithms.crossq import CrossQLearner, CrossQModule
from rlloop.config.crossq import CrossQConfig
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.modules.batch_renorm import RenormMLP

BATCH = 32
HIDDEN = [32, 32]
UPDATES = 6  # policy_delay 3: the actor steps at updates 3 and 6
SEED = 123


class _Float64Flatten(FlattenExtractor):
    """SB3 casts Box observations to float32; this feeds its float64 networks float64."""

    def forward(self, observations: Tensor) -> Tensor:
        return super().forward(observations).double()


def _parts(seq: nn.Module) -> tuple[list[BatchRenorm1d], list[nn.Linear]]:
    return ([m for m in seq.modules() if isinstance(m, BatchRenorm1d)],
            [m for m in seq.modules() if isinstance(m, nn.Linear)])


@torch.no_grad()
def _copy(ours: RenormMLP, peer_members: list[tuple[list[BatchRenorm1d], list[nn.Linear]]]
          ) -> None:
    for member, (norms, linears) in enumerate(peer_members):
        for layer, (norm, linear) in enumerate(zip(norms, linears, strict=True)):
            ours.norms[layer].scale[member] = norm.scale
            ours.norms[layer].bias[member] = norm.bias
            ours.weights[layer][member] = linear.weight.t()
            ours.biases[layer][member, 0] = linear.bias


def _peer_actor_layers(actor: nn.Module) -> tuple[list[BatchRenorm1d], list[nn.Linear]]:
    norms, linears = _parts(actor.latent_pi)
    head = nn.Linear(linears[-1].out_features, 2)
    with torch.no_grad():
        head.weight.copy_(torch.cat([actor.mu.weight, actor.log_std.weight]))
        head.bias.copy_(torch.cat([actor.mu.bias, actor.log_std.bias]))
    return norms, [*linears, head]


def _running(ours: RenormMLP, member: int) -> list[Tensor]:
    return [t for n in ours.norms for t in (n.running_mean[member], n.running_var[member])]


def _peer_running(norms: list[BatchRenorm1d]) -> list[Tensor]:
    return [t for n in norms for t in (n.ra_mean, n.ra_var)]


def _batches() -> list[ReplayBufferSamples]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(UPDATES):
        obs = torch.randn(BATCH, 3, generator=g).float().double()
        next_obs = (obs + 0.3 * torch.randn(BATCH, 3, generator=g)).float().double()
        action = (2 * torch.rand(BATCH, 1, generator=g) - 1).float().double()
        reward = 3 * torch.randn(BATCH, 1, generator=g)
        done = (torch.rand(BATCH, 1, generator=g) < 0.25).double()
        discount = torch.where(torch.rand(BATCH, 1, generator=g) < 0.5, 0.99, 0.99**2)
        out.append(ReplayBufferSamples(obs, action, next_obs, done, reward, discount))
    return out


def _noise() -> list[Tensor]:
    """The standard normal draws sb3-contrib makes: next actions each update, then the
    batch's actions at each actor update."""
    torch.manual_seed(SEED)
    unit = Normal(torch.zeros(BATCH, 1), torch.ones(BATCH, 1))
    draws = []
    for update in range(1, UPDATES + 1):
        draws.append(unit.rsample())
        if update % 3 == 0:
            draws.append(unit.rsample())
    return draws


def _run_both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per update: the losses and running statistics of the peer's and of rlloop's."""
    torch.manual_seed(0)
    bn = {"batch_norm_momentum": 0.05, "renorm_warmup_steps": 0}  # renorm from pass 2 on
    peer = PeerCrossQ("MlpPolicy", gym.make("Pendulum-v1"), learning_starts=0,
                      batch_size=BATCH, device="cpu", seed=0, policy_kwargs={
                          "net_arch": HIDDEN, "features_extractor_class": _Float64Flatten,
                          **bn})
    peer.actor.action_dist.epsilon = 0.0  # rlloop's tanh correction is exact (sac.md)
    # sb3-contrib makes its BatchRenorm's parameters and statistics float32 whatever the
    # default dtype (in place: the optimisers keep their parameters)
    peer.policy.double()
    config = CrossQConfig(hidden=HIDDEN, critic_hidden=HIDDEN, batch_size=BATCH,
                          renorm_warmup_steps=0, batch_norm_momentum=0.05)
    module = CrossQModule(3, 1, config)
    critic_members = [_parts(q) for q in peer.critic.q_networks]
    actor_layers = _peer_actor_layers(peer.actor)
    _copy(module.critic.net, critic_members)
    _copy(module.actor.net, [actor_layers])
    learner = CrossQLearner({DEFAULT_MODULE_ID: module}, config, target_entropy=-1.0,
                            generator=torch.Generator().manual_seed(0))

    batches = _batches()
    samples = iter(batches)
    peer.replay_buffer.sample = lambda *args, **kwargs: next(samples)  # type: ignore[method-assign]
    peer.set_logger(Logger(folder=None, output_formats=[]))
    draws = _noise()
    peer_rows, our_rows = [], []
    torch.manual_seed(SEED)
    for _ in range(UPDATES):
        peer.train(gradient_steps=1, batch_size=BATCH)
        logged = dict(peer.logger.name_to_value)
        peer.logger.name_to_value.clear()
        peer_rows.append({
            **{k: logged[f"train/{k}_loss"] for k in ("critic", "actor", "ent_coef")
               if f"train/{k}_loss" in logged},
            "critic_stats": [_peer_running(_parts(q)[0]) for q in peer.critic.q_networks],
            "actor_stats": _peer_running(actor_layers[0])})

    supply: Iterator[Tensor] = iter(draws)

    def drawn(*args: object, **kwargs: object) -> Tensor:
        draw = next(supply, None)
        assert draw is not None, "rlloop drew more policy noise than sb3-contrib"
        return draw

    original = crossq_module.standard_normal
    crossq_module.standard_normal = drawn  # type: ignore[assignment]
    try:
        for b in batches:
            batch = Transitions(b.observations, b.actions, b.rewards.squeeze(1),
                                b.next_observations, b.dones.squeeze(1).bool(),
                                b.discounts.squeeze(1))
            stats = learner.update(batch)
            names = {"critic": "losses/critic", "actor": "losses/actor",
                     "ent_coef": "losses/alpha"}
            our_rows.append({
                **{k: stats[v].item() for k, v in names.items() if v in stats},
                "critic_stats": [_running(module.critic.net, m) for m in range(2)],
                "actor_stats": _running(module.actor.net, 0)})
    finally:
        crossq_module.standard_normal = original
    # The weights after six updates: Adam's betas and the step order in them.
    peer_weights = [lin.weight.t() for _, lins in critic_members for lin in lins]
    ours = [module.critic.net.weights[i][m] for m in range(2) for i in range(3)]
    peer_rows.append({"weights": [*peer_weights, peer.log_ent_coef.view(())]})
    our_rows.append({"weights": [*ours, module.log_alpha.detach()]})
    return peer_rows, our_rows


def _assert_equal_to_peer() -> None:
    peer_rows, our_rows = _run_both()
    for update, (theirs, mine) in enumerate(zip(peer_rows, our_rows, strict=True), 1):
        assert theirs.keys() == mine.keys(), (update, theirs.keys(), mine.keys())
        assert_equal_to_peer(mine, theirs, f"update {update}")


@pytest.mark.parametrize(("warmup", "offset"), [(10, 0.0), (0, 0.3), (0, 40.0)],
                         ids=["batch", "renorm", "renorm-clipped"])
def test_batch_renorm_layer_equals_sb3_contribs(float64_default: None, warmup: int,
                                                offset: float) -> None:
    """One training pass of rlloop's layer (its backward written by hand) and of
    sb3-contrib's ``BatchRenorm1d`` (autograd): output, gradients, running statistics."""
    from rlloop.modules.batch_renorm import BatchRenorm

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(16, 5, generator=g) * 2 + 1).requires_grad_(True)
    peer = BatchRenorm1d(5, eps=0.001, momentum=0.05, warmup_steps=warmup).double()
    ours = BatchRenorm(5, 1, momentum=0.05, eps=0.001)
    with torch.no_grad():
        for mine, theirs, value in ((ours.scale[0], peer.scale, torch.rand(5, generator=g)),
                                    (ours.bias[0], peer.bias, torch.randn(5, generator=g)),
                                    (ours.running_mean[0], peer.ra_mean,
                                     torch.randn(5, generator=g) + offset),
                                    (ours.running_var[0], peer.ra_var,
                                     torch.rand(5, generator=g) + 0.5)):
            mine.copy_(value)
            theirs.copy_(value)
        peer.steps.fill_(1)
    weights = torch.randn(16, 5, generator=g)
    outputs = []
    for layer, run in ((peer, lambda: peer(x)),
                       (ours, lambda: ours([x], "batch" if warmup else "renorm")[0])):
        y = run()
        grads = torch.autograd.grad((y * weights).sum(), [x, layer.scale, layer.bias])
        outputs.append([y, *[t.view(-1) for t in grads]])
    for mine, theirs in zip(outputs[1], outputs[0], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.running_mean[0], peer.ra_mean, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(ours.running_var[0], peer.ra_var, rtol=1e-14, atol=1e-14)


def test_crossq_updates_equal_sb3_contrib(float64_default: None) -> None:
    _assert_equal_to_peer()


def _separate_next_pass(self: CrossQLearner, batch: Transitions, next_noise: Tensor,
                        norm: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """The naive form: (s', a') in its own pass, so the statistics never see both."""
    m = self.module()
    alpha = m.log_alpha.detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = m.actor(batch.next_obs, noise=next_noise)
        next_q = m.critic(batch.next_obs, next_action, norm)
    q = m.critic(batch.obs, batch.action.to(next_action.dtype), norm)
    target = crossq_module.sac_target(batch.reward, batch.discount, batch.terminated,
                                      next_q[0], next_q[1], next_log_prob, alpha)
    return crossq_module.sac_critic_loss(q[0], q[1], target)


def _jax_momentum(monkeypatch: pytest.MonkeyPatch) -> None:
    """flax's convention (the weight of the old statistics, 1 - momentum) read as torch's."""
    original = CrossQModule.__init__

    def init(self: CrossQModule, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for norm in self.modules():
            if hasattr(norm, "momentum"):
                norm.momentum = 1 - norm.momentum  # type: ignore[operator]

    monkeypatch.setattr(CrossQModule, "__init__", init)


def _plant(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    if name == "separate-next-pass":
        return lambda mp: mp.setattr(CrossQLearner, "critic_loss", _separate_next_pass)
    if name == "jax-momentum":
        return _jax_momentum
    # the actor updated every update (no policy delay)
    return lambda mp: mp.setattr(CrossQLearner, "actor_update_due", lambda self: True)


@pytest.mark.parametrize("planted", ["separate-next-pass", "jax-momentum", "no-policy-delay"])
def test_the_comparison_catches_a_planted_error(
        float64_default: None, monkeypatch: pytest.MonkeyPatch, planted: str) -> None:
    _plant(planted)(monkeypatch)
    with pytest.raises(AssertionError):
        _assert_equal_to_peer()


@pytest.mark.parametrize(("sets", "match"), [
    ({"tau": 0.005}, r"crossq.tau=0.005: CrossQ has no target networks .* drop crossq.tau"),
    ({"target_update_interval": 1}, "CrossQ has no target networks"),
    ({"use_sde": True}, "crossq.use_sde is not supported yet"),
    ({"policy_delay": 0}, "crossq.policy_delay must be > 0"),
    ({"batch_norm_momentum": 0.0}, "crossq.batch_norm_momentum must be in"),
    ({"critic_hidden": []}, "crossq.hidden must be a non-empty list")])
def test_config_refuses_target_networks_and_what_crossq_lacks(sets: dict[str, object],
                                                              match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        CrossQConfig(**sets)  # type: ignore[arg-type]


def test_a_target_network_setting_is_refused_before_torch_is_imported() -> None:
    import subprocess
    import sys

    code = ("import sys; from rlloop.config.loading import build_config\n"
            "try:\n    build_config('crossq', 'Pendulum-v1', sets=['crossq.tau=0.01'])\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0].startswith("ConfigError crossq.tau=0.01: CrossQ has no target networks")
    assert out[1] == "False"


def test_trains_from_the_cli_and_loads_into_the_python_api(tmp_path, cli_in_process) -> None:
    from rlloop import CrossQ

    model = train_then_load(cli_in_process, tmp_path / "run", "crossq", "Pendulum-v1", 150,
                            "crossq.learning_starts=100", "crossq.hidden=[32,32]",
                            "crossq.critic_hidden=[32,32]", "crossq.batch_size=32")
    assert isinstance(model, CrossQ)
    action = model.predict(torch.zeros(3).numpy())
    assert action.shape == (1,) and -2 <= float(action[0]) <= 2
    assert model.learn(30).env_steps >= 180  # the same run continues
    model.close()


def test_an_update_skipped_in_both_its_steps_counts_once() -> None:
    config = CrossQConfig(hidden=HIDDEN, critic_hidden=HIDDEN, batch_size=4)
    learner = CrossQLearner({DEFAULT_MODULE_ID: CrossQModule(3, 1, config)}, config,
                            target_entropy=-1.0, generator=torch.Generator().manual_seed(0))
    obs = torch.full((4, 3), float("nan"))  # both the critic's and the actor's loss
    done = torch.zeros(4, dtype=torch.bool)
    batch = Transitions(obs, torch.zeros(4, 1), torch.zeros(4), obs, done, torch.full((4,), 0.99))
    for _ in range(config.policy_delay):  # the last one steps the actor as well
        learner.update(batch)
    assert learner.skipped_updates == config.policy_delay == learner.updates
