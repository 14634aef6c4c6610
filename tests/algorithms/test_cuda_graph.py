"""``ppo.cuda_graph``: the rollout captured as a CUDA graph collects what eager code does.

The settings it cannot capture are one-line errors everywhere; the graph itself needs a
GPU (skipped without one): a graphed run must equal an eager one step for step, and a
graphed run restored from a checkpoint must continue as the uninterrupted one.
"""

from __future__ import annotations

import pytest
import torch

from rlloop.config.loading import build_config
from rlloop.errors import ConfigError
from rlloop.runs.build import build_algorithm
from rlloop.trainers.loop import Trainer

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _config(*sets: str, device: str = "cuda", algo: str = "ppo", env: str = "CartPole-v1"):
    return build_config(algo, env, flags={"seed": 3}, sets=[
        "mlflow=false", "progress=false", "num_envs=64", f"device={device}",
        f"{algo}.rollout_steps=16", f"{algo}.minibatch_size=256", f"{algo}.num_epochs=2",
        *sets])


@pytest.mark.parametrize(("sets", "message"), [
    (["device=cpu"], r"ppo\.cuda_graph needs a CUDA device"),
    (["ppo.recurrent=lstm", "ppo.seq_len=8"], r"cannot capture a rollout with ppo\.recurrent"),
    (["ppo.normalize_obs=true"], r"cannot capture a rollout with ppo\.normalize_obs"),
])
def test_settings_it_cannot_capture_are_one_line_errors(sets, message):
    with pytest.raises(ConfigError, match=message):
        build_algorithm(_config("ppo.cuda_graph=true", *sets, device="cpu"))


def test_gsde_env_runners_and_ma_ppo_are_refused():
    with pytest.raises(ConfigError, match=r"cannot capture a rollout with ppo\.use_sde"):
        build_algorithm(_config("ppo.cuda_graph=true", "ppo.use_sde=true", device="cpu",
                                env="Pendulum-v1"))
    with pytest.raises(ConfigError, match="set num_env_runners=0"):
        build_algorithm(_config("ppo.cuda_graph=true", "num_env_runners=1", device="cpu"))
    with pytest.raises(ConfigError, match=r"ma_ppo\.cuda_graph"):
        _config("ma_ppo.cuda_graph=true", "ma_ppo.policy_mapping=independent", device="cpu",
                algo="ma_ppo", env="pettingzoo:classic.tictactoe_v3")


@CUDA
def test_a_host_env_is_refused_on_cuda():
    with pytest.raises(ConfigError, match="needs a native env"):
        build_algorithm(_config("ppo.cuda_graph=true", "backend=gymnasium"))


def _trace(trainer: Trainer, iterations: int) -> list[dict[str, torch.Tensor]]:
    """What each iteration collected and the weights after its update."""
    algo, out = trainer.algorithm, []
    for _ in range(iterations):
        trainer.step()
        buf = algo.buffer
        out.append({"obs": buf.obs.clone(), "actions": buf.actions.clone(),
                    "log_probs": buf.log_probs.clone(), "rewards": buf.rewards.clone(),
                    "done": (buf.terminated | buf.truncated).clone(),
                    "runner_obs": algo.runner.obs.clone(),
                    **{f"param/{k}": v.detach().clone()
                       for k, v in algo.policy.state_dict().items()}})
    return out


def _assert_same(a: list[dict], b: list[dict]) -> None:
    """Actions, rewards, episode ends and observations equal; log-probabilities and
    weights equal to float rounding (cuBLAS may pick other matmul kernels on the stream a
    graph is captured on)."""
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in x:
            if key.startswith("param/") or key == "log_probs":
                torch.testing.assert_close(x[key], y[key], rtol=1e-4, atol=1e-6,
                                           msg=lambda m, i=i, key=key: f"iteration {i}: "
                                                                       f"{key}: {m}")
            else:
                assert torch.equal(x[key], y[key]), f"iteration {i}: {key} differs"


@CUDA
def test_a_graphed_rollout_equals_the_eager_one():
    """Warm-up (eager), capture + first replay, then replays: all equal eager collects."""
    eager = Trainer(build_algorithm(_config()))
    graphed = Trainer(build_algorithm(_config("ppo.cuda_graph=true")))
    _assert_same(_trace(eager, 5), _trace(graphed, 5))
    assert graphed.algorithm._graphed.graph is not None  # it did capture and replay
    assert eager.step()["episode/return_mean"] == pytest.approx(
        graphed.step()["episode/return_mean"])


@CUDA
def test_a_restored_graphed_run_continues_exactly():
    whole = _trace(_graphed_trainer(), 5)
    first = _graphed_trainer()
    _trace(first, 3)  # warm-up, capture, one more replay
    second = _graphed_trainer()
    second.algorithm.set_state(first.algorithm.get_state())
    second.set_state(first.get_state())
    _assert_same(whole[3:], _trace(second, 2))  # restored: a warm-up and a capture again


def _graphed_trainer(graphed: bool = True) -> Trainer:
    return Trainer(build_algorithm(_config(f"ppo.cuda_graph={str(graphed).lower()}")))
