"""Flush-to-zero around trainer steps (rlloop.system.numerics)."""

from __future__ import annotations

import torch

from rlloop.system.numerics import flushed_denormals, flushing_denormals

SUBNORMAL = 1e-39  # below float32's smallest normal number (about 1.18e-38)


def test_subnormals_flush_inside_the_block_and_the_mode_is_restored() -> None:
    x = torch.tensor([SUBNORMAL])
    assert not flushing_denormals()
    assert float(x * 1.0) > 0  # subnormals survive by default
    with flushed_denormals():
        assert flushing_denormals()
        assert float(x * 1.0) == 0.0
    assert not flushing_denormals()
    assert float(x * 1.0) > 0


def test_disabled_block_and_a_mode_set_by_the_caller_are_left_alone() -> None:
    with flushed_denormals(enabled=False):
        assert not flushing_denormals()
    torch.set_flush_denormal(True)
    try:
        with flushed_denormals():
            assert flushing_denormals()
        assert flushing_denormals()  # the caller's setting stays
    finally:
        torch.set_flush_denormal(False)


def test_trainer_steps_run_flushed_and_restore_the_mode() -> None:
    from rlloop.config.loading import build_config
    from rlloop.runs.build import build_algorithm
    from rlloop.trainers.loop import Trainer

    seen: list[bool] = []

    class Probe:
        def on_step(self, trainer: Trainer, stats: dict[str, float]) -> None:
            seen.append(flushing_denormals())

        def on_eval(self, trainer: Trainer, stats: dict[str, float]) -> None:
            pass

    config = build_config("ppo", "CartPole-v1", flags={"seed": 0},
                          sets=["mlflow=false", "progress=false", "num_envs=2",
                                "ppo.rollout_steps=8", "ppo.minibatch_size=16"])
    algorithm = build_algorithm(config)
    Trainer(algorithm, callbacks=[Probe()]).step()
    Trainer(algorithm, callbacks=[Probe()], flush_denormal=False).step()
    algorithm.close()
    assert seen == [True, False]
    assert not flushing_denormals()
