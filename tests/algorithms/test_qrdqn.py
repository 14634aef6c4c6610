"""QR-DQN equals sb3-contrib's QR-DQN on identical inputs (float64), and the comparison
catches a planted error; config refusals; acting on the quantiles' mean."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import pytest
import torch
from cli_runs import train_then_load
from sb3_contrib import QRDQN as PeerQRDQN
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from torch import Tensor

import rlloop.algorithms.qrdqn as qrdqn_module
import rlloop.losses.quantile as quantile_module
from rlloop.algorithms.dqn import DQNModule
from rlloop.algorithms.qrdqn import QRDQNLearner
from rlloop.config.quantile import QRDQNConfig
from rlloop.data.transitions import Transitions
from rlloop.errors import ConfigError
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.modules.q_networks import QuantileQNetwork

#: (i + 0.5) / 16 is exact in float32: sb3-contrib builds its midpoints in float32 even
#: for float64 networks, so with 200 quantiles the two differ by float32's rounding.
N_QUANTILES = 16
BATCH = 32
HIDDEN = [32, 32]


class _Float64Flatten(FlattenExtractor):
    """SB3 casts Box observations to float32; this feeds its float64 network float64
    (the observations are float32 values, so the cast loses nothing)."""

    def forward(self, observations: Tensor) -> Tensor:
        return super().forward(observations).double()


def _copy_into(dst: QuantileQNetwork, src: torch.nn.Module) -> None:
    with torch.no_grad():
        for d, s in zip(dst.parameters(), src.parameters(), strict=True):
            d.copy_(s)


def _peer_and_ours() -> tuple[float, list[Tensor], float, list[Tensor]]:
    """One update's loss and gradients from sb3-contrib's ``QRDQN.train`` and from
    rlloop's learner, on identical networks (target differing from online) and batch."""
    torch.manual_seed(0)
    peer = PeerQRDQN("MlpPolicy", gym.make("CartPole-v1"), learning_starts=0, batch_size=BATCH,
                     device="cpu", seed=0, policy_kwargs={
                         "n_quantiles": N_QUANTILES, "net_arch": HIDDEN,
                         "features_extractor_class": _Float64Flatten})
    with torch.no_grad():  # a target network unlike the online one
        for p in peer.quantile_net_target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = QuantileQNetwork(4, 2, N_QUANTILES, HIDDEN)
    _copy_into(ours, peer.quantile_net)
    module = DQNModule(ours)
    _copy_into(module.target, peer.quantile_net_target)  # type: ignore[arg-type]

    g = torch.Generator().manual_seed(1)
    obs = torch.randn(BATCH, 4, generator=g).float().double()
    next_obs = torch.randn(BATCH, 4, generator=g).float().double()
    action = torch.randint(0, 2, (BATCH,), generator=g)
    reward = 3 * torch.randn(BATCH, generator=g)  # large TD errors: both Huber branches
    terminated = torch.rand(BATCH, generator=g) < 0.25
    discount = torch.where(torch.rand(BATCH, generator=g) < 0.5, 0.99, 0.99**2)  # n-step rows

    sample = ReplayBufferSamples(obs, action.unsqueeze(1), next_obs,
                                 terminated.double().unsqueeze(1), reward.unsqueeze(1),
                                 discount.unsqueeze(1))
    peer.replay_buffer.sample = lambda *args, **kwargs: sample  # type: ignore[method-assign]
    peer.set_logger(Logger(folder=None, output_formats=[]))
    # Plain SGD: the gradients stay in .grad after train()'s step (which moves the peer's
    # weights, after ours were copied).
    peer.policy.optimizer = torch.optim.SGD(peer.quantile_net.parameters(), lr=0.0)
    peer.train(gradient_steps=1, batch_size=BATCH)
    peer_grads = [p.grad.clone() for p in peer.quantile_net.parameters()]  # type: ignore[union-attr]

    config = QRDQNConfig(n_quantiles=N_QUANTILES, hidden=HIDDEN, batch_size=BATCH)
    learner = QRDQNLearner({DEFAULT_MODULE_ID: module}, config)
    batch = Transitions(obs, action, reward, next_obs, terminated, discount)
    loss, _ = learner.compute_loss_for_module(DEFAULT_MODULE_ID, config, batch)
    loss.backward()
    ours_grads = [p.grad.clone() for p in ours.parameters()]  # type: ignore[union-attr]
    return peer.logger.name_to_value["train/loss"], peer_grads, loss.item(), ours_grads


def _assert_equal_to_peer() -> None:
    peer_loss, peer_grads, loss, grads = _peer_and_ours()
    assert abs(loss - peer_loss) <= 1e-10 * max(1.0, abs(peer_loss)), (loss, peer_loss)
    for ours, theirs in zip(grads, peer_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0.0, atol=1e-10)


def test_qrdqn_loss_and_gradients_equal_sb3_contrib(float64_default: None) -> None:
    _assert_equal_to_peer()


def _reversed_midpoints(n: int, like: Tensor) -> Tensor:
    return 1 - (torch.arange(n, dtype=like.dtype) + 0.5) / n


def _min_not_max(reward: Tensor, discount: Tensor, terminated: Tensor, next_z: Tensor,
                 next_q: Tensor) -> Tensor:
    return quantile_module.qrdqn_target(reward, discount, terminated, next_z, -next_q)


@pytest.mark.parametrize(("module", "name", "planted"), [
    (quantile_module, "quantile_midpoints", _reversed_midpoints),
    (qrdqn_module, "qrdqn_target", _min_not_max)], ids=["reversed-fractions", "argmin-target"])
def test_the_comparison_catches_a_planted_error(
        float64_default: None, monkeypatch: pytest.MonkeyPatch, module: object, name: str,
        planted: Callable[..., Tensor]) -> None:
    monkeypatch.setattr(module, name, planted)
    with pytest.raises(AssertionError):
        _assert_equal_to_peer()


def test_q_values_are_the_quantiles_mean_and_masks_apply() -> None:
    torch.manual_seed(0)
    net = QuantileQNetwork(3 + 2, 2, 5, [8], mask_dims=2)  # the last 2 features: the mask
    obs = torch.cat([torch.randn(4, 3), torch.tensor([[1.0, 0.0]] * 4)], 1)
    z, q = net.quantiles_and_q(obs)
    assert z.shape == (4, 5, 2)
    torch.testing.assert_close(q[:, 0], z.mean(1)[:, 0])
    assert (q[:, 1] < -1e8).all() and (net(obs).argmax(1) == 0).all()


@pytest.mark.parametrize(("sets", "match"), [
    ({"n_quantiles": 0}, "qrdqn.n_quantiles must be > 0"),
    ({"dueling": True}, "qrdqn.dueling is not supported yet"),
    ({"manual_backward": True}, "qrdqn.manual_backward is not supported yet"),
    ({"compile": True}, "qrdqn.compile is not supported yet")])
def test_config_refuses_what_qrdqn_lacks(sets: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        QRDQNConfig(**sets)  # type: ignore[arg-type]


def test_trains_from_the_cli_and_loads_into_the_python_api(tmp_path, cli_in_process) -> None:
    from rlloop import QRDQN

    model = train_then_load(cli_in_process, tmp_path / "run", "qrdqn", "CartPole-v1", 400,
                            "qrdqn.learning_starts=100", "qrdqn.n_quantiles=10", "num_envs=4")
    assert isinstance(model, QRDQN)
    assert int(model.predict(torch.zeros(4).numpy())) in (0, 1)
    assert model.learn(200).env_steps == 600  # the same run continues
    model.close()


@pytest.mark.parametrize(("env", "sets"), [
    ("rlloop-test/StackedSide-v0", ["qrdqn.replay=frames", "qrdqn.buffer_size=200"]),
    ("rlloop-test/DictCue-v0", [])], ids=["pixels-frame-replay", "dict"])
def test_trains_on_frame_replay_and_dict_observations(env: str, sets: list[str]) -> None:
    import dict_envs
    import pixel_envs
    from stepping import run_iterations

    from rlloop.config.loading import build_config
    from rlloop.runs.build import build_algorithm

    pixel_envs.register()
    dict_envs.register()
    a = build_algorithm(build_config("qrdqn", env, flags={"seed": 0, "num_envs": 2}, sets=[
        "mlflow=false", "progress=false", "qrdqn.learning_starts=16", "qrdqn.batch_size=8",
        "qrdqn.opt_interval=8", "qrdqn.n_quantiles=4", *sets]))
    try:
        run_iterations(a, 30)
        assert a.learner.updates > 0  # type: ignore[attr-defined]
        stats = a.learner.update(a.loop.replay.sample(8, torch.Generator()).for_update())  # type: ignore[attr-defined]
        assert torch.isfinite(stats["losses/q"])
    finally:
        a.close()  # type: ignore[attr-defined]
