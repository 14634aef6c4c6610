"""DQN's updates of an optimisation step in one scripted call
(:mod:`rlloop.learners.update_loop`) against the same updates made one by one, eager: the
parameters, Adam's moments and step counts, and the skip count agree to the bit, with and
without clipping and across a skipped update; a changed input is seen; and the updates run
eager where the scripted call cannot."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

from rlloop.algorithms.dqn import DQNLearner
from rlloop.algorithms.offpolicy_base import OffPolicyAlgorithmBase
from rlloop.config.loading import build_config
from rlloop.learners import update_loop
from rlloop.runs.build import build_algorithm

QUIET = ["mlflow=false", "progress=false", "num_envs=1"]


def _learner(*sets: str) -> tuple[DQNLearner, Any]:
    config = build_config("dqn", "CartPole-v1", sets=[
        *QUIET, "dqn.hidden=[32,32]", "dqn.batch_size=16", "dqn.buffer_size=500",
        "dqn.learning_starts=10", "dqn.target_update_interval=1000", *sets])
    algo = cast(OffPolicyAlgorithmBase, build_algorithm(config))
    for _ in range(60):
        algo.env_step()
    batch = algo.loop.replay.sample(6 * 16, torch.Generator().manual_seed(3))
    return cast(DQNLearner, algo.learner), batch


def _state(learner: DQNLearner) -> list[torch.Tensor]:
    """Parameters, Adam's moments and step counts, and the skip count."""
    optimizer = learner.step.optims[0].optimizer
    params = list(learner.module().online.parameters())
    moments = [t for p in params for t in optimizer.state[p].values()]
    assert learner.step.skipped is not None
    return [*params, *moments, learner.step.skipped]


def _one_by_one(learner: DQNLearner, batch: Any, targets: torch.Tensor, k: int) -> None:
    for o, a, y in zip(batch.obs.chunk(k), batch.action.chunk(k), targets.chunk(k),
                       strict=True):
        learner.update_towards(o, a, y)


@pytest.mark.parametrize("clip", ["10", "0.05"])
def test_scripted_updates_equal_eager_updates_to_the_bit(clip):
    learner, batch = _learner(f"dqn.max_grad_norm={clip}")
    assert learner._update_loop() is not None  # the scripted call runs here
    twin = _learner(f"dqn.max_grad_norm={clip}")[0]
    for phase in range(3):  # the flat layout and Adam's steps carry over between calls
        targets = learner.targets(batch) + phase
        stats = learner.updates_towards(batch.obs, batch.action, targets, 6, stats=True)
        _one_by_one(twin, batch, targets, 6)
    assert all(torch.equal(a, b) for a, b in zip(_state(learner), _state(twin), strict=True))
    assert learner.updates == twin.updates == 18
    assert learner.td_errors is not None and twin.td_errors is not None
    assert torch.equal(learner.td_errors, twin.td_errors)
    eager_stats = twin.update_towards(batch.obs[-16:], batch.action[-16:], targets[-16:])
    assert set(stats) == set(eager_stats)


def test_a_skipped_update_is_skipped_as_eager():
    learner, batch = _learner("dqn.max_grad_norm=0.05")
    twin = _learner("dqn.max_grad_norm=0.05")[0]
    targets = learner.targets(batch)
    targets[20] = float("inf")  # the second update's TD errors are not finite
    learner.updates_towards(batch.obs, batch.action, targets, 6, stats=False)
    _one_by_one(twin, batch, targets, 6)
    assert all(torch.equal(a, b) for a, b in zip(_state(learner), _state(twin), strict=True))
    assert float(learner.skipped_updates) == 1.0


def test_the_comparison_sees_a_changed_target():
    # The planted error: one target moved by a float32 step in one update of six.
    learner, batch = _learner()
    twin = _learner()[0]
    targets = learner.targets(batch)
    learner.updates_towards(batch.obs, batch.action, targets, 6, stats=False)
    planted = targets.clone()
    planted[50] = torch.nextafter(planted[50], torch.tensor(float("inf")))
    _one_by_one(twin, batch, planted, 6)
    assert not all(torch.equal(a, b) for a, b in zip(_state(learner), _state(twin),
                                                     strict=True))


def test_updates_run_eager_where_the_scripted_call_cannot(monkeypatch):
    learner, _ = _learner("on_nonfinite=raise")
    assert learner._update_loop() is None  # the guard must read the flag after each update
    learner, _ = _learner("dqn.manual_backward=false")
    assert learner._update_loop() is None  # autograd, not the hand-derived pass
    monkeypatch.setattr(update_loop, "_scripted", lambda: None)  # a torch without script
    learner, batch = _learner()
    assert learner._update_loop() is None
    twin = _learner()[0]
    targets = learner.targets(batch)
    learner.updates_towards(batch.obs, batch.action, targets, 6, stats=False)
    _one_by_one(twin, batch, targets, 6)
    assert all(torch.equal(a, b) for a, b in zip(_state(learner), _state(twin), strict=True))


def test_a_torch_that_cannot_script_warns_once_and_runs_eager(monkeypatch):
    def broken(fn):
        raise RuntimeError("TorchScript was removed\nmore detail")

    update_loop._scripted.cache_clear()
    monkeypatch.setattr(torch.jit, "script", broken)
    try:
        with pytest.warns(UserWarning, match=r"TorchScript was removed\); DQN's updates run"):
            assert update_loop._scripted() is None
        learner, _ = _learner()
        assert learner._update_loop() is None  # cached: no second warning
    finally:
        update_loop._scripted.cache_clear()
