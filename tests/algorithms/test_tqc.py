"""TQC equals sb3-contrib's TQC on identical inputs (float64): target, critic, actor and
alpha losses and every gradient; the comparison catches planted errors; config refusals;
CLI and Python API."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import pytest
import torch
from cli_runs import train_then_load
from peer_equality import assert_equal_to_peer
from sb3_contrib import TQC as PeerTQC
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from torch import Tensor, nn
from torch.distributions import Normal

import rlloop.algorithms.tqc as tqc_module
from rlloop.algorithms.tqc import TQCLearner, TQCModule
from rlloop.config.quantile import TQCConfig
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.losses.quantile import tqc_actor_loss, tqc_target

#: (i + 0.5) / 16 is exact in float32, where sb3-contrib builds its quantile fractions.
N_QUANTILES = 16
BATCH = 32
HIDDEN = [32, 32]
SEED = 123


class _Float64Flatten(FlattenExtractor):
    """SB3 casts Box observations to float32; this feeds its float64 networks float64
    (the observations are float32 values, so the cast loses nothing)."""

    def forward(self, observations: Tensor) -> Tensor:
        return super().forward(observations).double()


class _Record(torch.optim.SGD):
    """Keeps the gradients each step sees (sb3-contrib's actor backward later adds to the
    critics' .grad, so reading them after train() would mix two losses)."""

    grads: list[Tensor]

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]
        super().step(closure)


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


@torch.no_grad()
def _copy_critic(ours: nn.Module, peer_q_networks: nn.ModuleList) -> None:
    per_member = [_linears(q) for q in peer_q_networks]
    for layer, (w, b) in enumerate(zip(ours.weights, ours.biases, strict=True)):  # type: ignore[arg-type]
        w.copy_(torch.stack([m[layer].weight.t() for m in per_member]))
        b.copy_(torch.stack([m[layer].bias.unsqueeze(0) for m in per_member]))


@torch.no_grad()
def _copy_actor(ours: nn.Module, peer_actor: nn.Module) -> None:
    layers = _linears(ours.net)
    hidden = _linears(peer_actor.latent_pi)
    for mine, theirs in zip(layers[:-1], hidden, strict=True):
        mine.weight.copy_(theirs.weight)
        mine.bias.copy_(theirs.bias)
    layers[-1].weight.copy_(torch.cat([peer_actor.mu.weight, peer_actor.log_std.weight]))
    layers[-1].bias.copy_(torch.cat([peer_actor.mu.bias, peer_actor.log_std.bias]))


def _peer_and_ours() -> tuple[dict[str, float], dict[str, list[Tensor]],
                              dict[str, float], dict[str, list[Tensor]]]:
    """One update's losses and per-optimiser gradients from sb3-contrib's ``TQC.train``
    and from rlloop's learner, on identical networks, batch and policy noise."""
    torch.manual_seed(0)
    peer = PeerTQC("MlpPolicy", gym.make("Pendulum-v1"), learning_starts=0, batch_size=BATCH,
                   device="cpu", seed=0, top_quantiles_to_drop_per_net=2, policy_kwargs={
                       "n_quantiles": N_QUANTILES, "n_critics": 3, "net_arch": HIDDEN,
                       "features_extractor_class": _Float64Flatten})
    # SB3 adds 1e-6 inside the tanh correction's log; rlloop's is exact (docs/algorithms/
    # sac.md). The peer's epsilon set to 0 compares the rest.
    peer.actor.action_dist.epsilon = 0.0
    with torch.no_grad():  # target critics unlike the online ones
        for p in peer.critic_target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    config = TQCConfig(n_quantiles=N_QUANTILES, n_critics=3, hidden=HIDDEN, batch_size=BATCH)
    module = TQCModule(3, 1, config)
    _copy_actor(module.actor, peer.actor)
    _copy_critic(module.critic, peer.critic.q_networks)
    _copy_critic(module.critic_target, peer.critic_target.q_networks)

    g = torch.Generator().manual_seed(1)
    obs = torch.randn(BATCH, 3, generator=g).float().double()
    next_obs = torch.randn(BATCH, 3, generator=g).float().double()
    action = (2 * torch.rand(BATCH, 1, generator=g) - 1).float().double()
    reward = 3 * torch.randn(BATCH, generator=g)
    terminated = torch.rand(BATCH, generator=g) < 0.25
    discount = torch.where(torch.rand(BATCH, generator=g) < 0.5, 0.99, 0.99**2)
    sample = ReplayBufferSamples(obs, action, next_obs, terminated.double().unsqueeze(1),
                                 reward.unsqueeze(1), discount.unsqueeze(1))
    peer.replay_buffer.sample = lambda *args, **kwargs: sample  # type: ignore[method-assign]
    peer.set_logger(Logger(folder=None, output_formats=[]))
    peer.lr_schedule = lambda _: 0.0  # the three losses see the same weights, as rlloop's
    peer.actor.optimizer = _Record(peer.actor.parameters(), lr=0.0)
    peer.critic.optimizer = _Record(peer.critic.parameters(), lr=0.0)
    peer.ent_coef_optimizer = _Record([peer.log_ent_coef], lr=0.0)
    # The policy noise the peer draws (at obs, then at next_obs), drawn again for rlloop.
    torch.manual_seed(SEED)
    unit = Normal(torch.zeros(BATCH, 1), torch.ones(BATCH, 1))
    noise, next_noise = unit.rsample(), unit.rsample()
    torch.manual_seed(SEED)
    peer.train(gradient_steps=1, batch_size=BATCH)
    logged = peer.logger.name_to_value
    peer_losses = {k: logged[f"train/{k}_loss"] for k in ("critic", "actor", "ent_coef")}
    peer_grads = {"critic": peer.critic.optimizer.grads, "actor": peer.actor.optimizer.grads,
                  "alpha": peer.ent_coef_optimizer.grads}

    learner = TQCLearner({DEFAULT_MODULE_ID: module}, config, target_entropy=-1.0,
                         generator=torch.Generator().manual_seed(0))
    batch = Transitions(obs, action, reward, next_obs, terminated, discount)
    loss, stats = learner._loss(module, batch, next_noise, noise)
    loss.backward()
    ours = {"critic": stats["losses/critic"].item(), "actor": stats["losses/actor"].item(),
            "ent_coef": stats["losses/alpha"].item()}
    critic_grads = []
    for w, b in zip(module.critic.weights, module.critic.biases, strict=True):
        critic_grads += [(w.grad[c].t(), b.grad[c, 0]) for c in range(3)]  # type: ignore[index]
    # sb3-contrib's order: critic 0's layers, then critic 1's, ...
    n_layers = len(module.critic.weights)
    by_member = [critic_grads[layer * 3 + c] for c in range(3) for layer in range(n_layers)]
    actor_linears = _linears(module.actor.net)
    actor_grads = [g for lin in actor_linears[:-1] for g in (lin.weight.grad, lin.bias.grad)]
    last = actor_linears[-1]
    actor_grads += [last.weight.grad[:1], last.bias.grad[:1],  # type: ignore[index]
                    last.weight.grad[1:], last.bias.grad[1:]]  # type: ignore[index]
    our_grads = {"critic": [t for pair in by_member for t in pair], "actor": actor_grads,
                 "alpha": [module.log_alpha.grad.view(1)]}  # type: ignore[union-attr]
    return peer_losses, peer_grads, ours, our_grads


def _assert_equal_to_peer() -> None:
    peer_losses, peer_grads, losses, grads = _peer_and_ours()
    assert_equal_to_peer(losses, peer_losses, "losses")
    assert_equal_to_peer(grads, peer_grads, "gradients", rtol=0.0)


def test_tqc_losses_and_gradients_equal_sb3_contrib(float64_default: None) -> None:
    _assert_equal_to_peer()


def _keeps_one_more(*args: object) -> Tensor:
    *head, kept = args
    return tqc_target(*head, kept + 1)  # type: ignore[arg-type, operator]


def _min_over_critics(quantiles_pi: Tensor, log_prob: Tensor, alpha: Tensor
                      ) -> tuple[Tensor, dict[str, Tensor]]:
    return tqc_actor_loss(quantiles_pi.min(1, keepdim=True).values, log_prob, alpha)


@pytest.mark.parametrize(("name", "planted"), [("tqc_target", _keeps_one_more),
                                               ("tqc_actor_loss", _min_over_critics)],
                         ids=["one-quantile-too-many", "actor-min-over-critics"])
def test_the_comparison_catches_a_planted_error(
        float64_default: None, monkeypatch: pytest.MonkeyPatch, name: str,
        planted: Callable[..., object]) -> None:
    monkeypatch.setattr(tqc_module, name, planted)
    with pytest.raises(AssertionError):
        _assert_equal_to_peer()


@pytest.mark.parametrize(("sets", "match"), [
    ({"n_critics": 0}, "tqc.n_critics must be > 0"),
    ({"top_quantiles_to_drop_per_net": 25}, r"tqc.top_quantiles_to_drop_per_net must be in"),
    ({"compile": True}, "tqc.compile is not supported yet"),
    ({"lr": 0.0}, "tqc.lr and tqc.init_alpha must be > 0")])
def test_config_refuses_what_tqc_lacks(sets: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TQCConfig(**sets)  # type: ignore[arg-type]


def test_trains_from_the_cli_and_loads_into_the_python_api(tmp_path, cli_in_process) -> None:
    from rlloop import TQC

    model = train_then_load(cli_in_process, tmp_path / "run", "tqc", "Pendulum-v1", 200,
                            "tqc.learning_starts=100", "tqc.hidden=[32,32]",
                            "tqc.batch_size=32")
    assert isinstance(model, TQC)
    action = model.predict(torch.zeros(3).numpy())
    assert action.shape == (1,) and -2 <= float(action[0]) <= 2
    assert model.learn(50).env_steps >= 250  # the same run continues
    model.close()


@pytest.mark.parametrize(("env", "extra"), [
    ("rlloop-test/SidePixelsBox-v0", []), ("rlloop-test/DictReach-v0", []),
    ("Pendulum-v1", ["tqc.use_sde=true"])], ids=["pixels", "dict", "gsde"])
def test_trains_on_pixels_dict_observations_and_gsde(env: str, extra: list[str]) -> None:
    import dict_envs
    import pixel_envs
    from stepping import run_iterations

    from rlloop.config.loading import build_config
    from rlloop.runs.build import build_algorithm

    pixel_envs.register_box()
    dict_envs.register()
    a = build_algorithm(build_config("tqc", env, flags={"seed": 0, "num_envs": 2}, sets=[
        "mlflow=false", "progress=false", "tqc.learning_starts=8", "tqc.batch_size=8",
        "tqc.buffer_size=64", "tqc.n_quantiles=4", "tqc.hidden=[16,16]", *extra]))
    try:
        run_iterations(a, 12)
        assert a.learner.updates > 0  # type: ignore[attr-defined]
        stats = a.learner.update(a.loop.replay.sample(8, torch.Generator()).for_update())  # type: ignore[attr-defined]
        assert torch.isfinite(stats["losses/critic"]) and torch.isfinite(stats["losses/actor"])
    finally:
        a.close()  # type: ignore[attr-defined]
