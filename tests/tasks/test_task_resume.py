"""A task run cut and resumed trains as the uncut one does (sync workers, CPU): epochs
reseed their envs and minibatch order from the epoch's index, stops and checkpoints wait
for the epoch's end, and an update is never parted from its counter."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sign_task import SignTask, sign_policy
from torch import Tensor, nn
from worker_envs import SignEnv

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.envs.pool import WorkerError, WorkerPool
from rlloop.errors import ConfigError, RunDirError
from rlloop.tasks import TaskConfig, TaskTrainer
from rlloop.tasks.trainer import COMPONENTS, epoch_seeds

# 4 train steps per epoch (40 samples, minibatches of 10), one env on the training thread
BASE = {"num_env_workers": 0, "device": "cpu", "num_epoch_samples": 40, "batch_size": 10,
        "lr": 0.1, "seed": 3, "env_seed": 11}


class SignalAt(SignTask):
    """Sends itself SIGTERM at the ``at``-th loss (once, or ``times`` signals at once)."""

    def __init__(self, config: TaskConfig, at: int | None = None, times: int = 1) -> None:
        super().__init__(config)
        self.at, self.times, self.calls = at, times, 0

    def compute_loss(self, model: nn.Module, batch: Any, output: Tensor) -> Tensor:
        self.calls += 1
        if self.calls == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGTERM)
        return super().compute_loss(model, batch, output)


def _train(run_dir: Path, total: int, *, resume: bool = False, at: int | None = None,
           **extra: Any) -> tuple[Tensor, dict[str, int]]:
    model = sign_policy()
    trainer = TaskTrainer(SignalAt(TaskConfig(**BASE, **extra, total_steps=total), at),
                          model, run_dir=run_dir, resume=resume)
    trainer.run()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), dict(trainer.state)


def test_a_run_cut_at_an_epoch_end_resumes_bit_identically(tmp_path):
    """The resumed run replayed the run's first episodes (its workers were seeded again
    from env_seed) and drew its minibatch order from a generator the uncut run had moved
    on (a finished pass draws once more)."""
    uncut, counters = _train(tmp_path / "a", 16)
    _train(tmp_path / "b", 8)
    resumed, resumed_counters = _train(tmp_path / "b", 16, resume=True)
    assert torch.equal(uncut, resumed)
    assert counters == resumed_counters == {"train/steps": 16, "train/epochs": 4,
                                            "env/steps": 160}


def test_a_stop_while_training_finishes_the_epoch_and_resumes_exactly(tmp_path):
    """SIGTERM at an epoch's 2nd train step dropped the epoch's other two minibatches and
    counted the epoch as done."""
    uncut, _ = _train(tmp_path / "a", 12)
    _, counters = _train(tmp_path / "b", 12, at=6)  # epoch 2's second train step
    assert counters == {"train/steps": 8, "train/epochs": 2, "env/steps": 80}
    resumed, _ = _train(tmp_path / "b", 12, resume=True)
    assert torch.equal(uncut, resumed)


def test_a_periodic_checkpoint_waits_for_the_epoch_end(tmp_path):
    _train(tmp_path, 12, checkpoint_every=3)
    names = [p.name for p in CheckpointManager(tmp_path / "checkpoints").all()]
    assert names == ["000000004", "000000008", "000000012"]  # steps 3, 6 and 9 fall in them


def test_a_second_signal_never_parts_an_update_from_its_count(tmp_path):
    """Two signals at once interrupt the run; the final checkpoint held the weights of
    update k+1 with the counters of update k."""
    model = sign_policy()
    task = SignalAt(TaskConfig(**BASE, total_steps=100), at=3, times=2)
    trainer = TaskTrainer(task, model, run_dir=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    latest = CheckpointManager(tmp_path / "checkpoints").latest()
    assert latest is not None
    ckpt = load_checkpoint(latest, expected_components=COMPONENTS)
    adam_steps = {float(s["step"]) for s in ckpt.components["optimizer"]["state"].values()}
    counters = ckpt.components["trainer"]["counters"]
    assert adam_steps == {float(counters["train/steps"])} == {3}
    # The interrupted epoch is counted as done, its samples with it (the env steps were
    # counted without the epoch, so a resume collected and counted them again).
    assert (counters["train/epochs"], counters["env/steps"]) == (1, 40)


def test_epoch_seeds_depend_on_seed_and_epoch_only():
    assert epoch_seeds(11, 3, 4) == epoch_seeds(11, 3, 4)
    assert epoch_seeds(11, 3, 2) == epoch_seeds(11, 3, 4)[:2]
    assert len({*epoch_seeds(11, 1, 4), *epoch_seeds(11, 2, 4), *epoch_seeds(12, 1, 4)}) == 12
    assert epoch_seeds(-5, 0, 1)[0] >= 0


class _Hangs(SignEnv):
    """Hangs (for 30 s) on its 3rd step."""

    def step(self, action: Any) -> Any:
        if self.steps == 2:
            time.sleep(30)
        return super().step(action)


class _Jitters(SignEnv):
    """Steps take 0-2 ms."""

    def step(self, action: Any) -> Any:
        time.sleep(0.002 * float(self.rng.random()))
        return super().step(action)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_stop_does_not_wait_for_a_hung_worker(tmp_path, mode):
    """SIGTERM waited for the worker's step_timeout before the final checkpoint."""
    config = TaskConfig(**{**BASE, "num_env_workers": 1, "env_worker_mode": mode,
                           "step_timeout": 25.0, "total_steps": 100})
    trainer = TaskTrainer(SignTask(config, env_fn=_Hangs), sign_policy(), run_dir=tmp_path)
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    start = time.monotonic()
    try:
        trainer.run()
    finally:
        timer.cancel()
    assert trainer.stop_requested == "SIGTERM"
    assert time.monotonic() - start < 10.0


def test_a_task_run_refuses_a_linked_checkpoints_directory(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(target)
    with pytest.raises(RunDirError, match="checkpoints"):
        TaskTrainer(SignTask(TaskConfig(**BASE, total_steps=4)), sign_policy(), run_dir=run)
    assert list(target.iterdir()) == []


def test_the_shared_loop_evaluates_a_task():
    """``trainer.eval()`` read a counter only algorithms have (KeyError)."""
    trainer = TaskTrainer(SignTask(TaskConfig(**BASE, total_steps=4)), sign_policy())
    stats = trainer.trainer.eval()
    assert any(k.startswith("eval/") for k in stats), stats


def test_every_inference_call_holds_min_batch_size_states():
    """Envs whose trajectory was cut at max_trajectory_length were left out of the call."""
    sizes: list[int] = []

    class Counting(SignTask):
        def get_actions(self, model: nn.Module, states: Tensor, optimal: bool) -> Tensor:
            sizes.append(len(states))
            return super().get_actions(model, states, optimal)

    config = TaskConfig(**{**BASE, "num_env_workers": 4, "env_worker_mode": "thread",
                           "min_batch_size": 2, "max_wait_time": 0.0})
    task = Counting(config, env_fn=_Jitters)  # so that the envs are cut at different times
    with task.get_worker_pool() as pool:
        task.collect_samples(sign_policy(), pool, 300, min_batch_size=2, max_wait_time=0.0,
                             max_trajectory_length=3)
    assert sizes and min(sizes) >= 2


def test_a_clip_cut_at_max_clip_steps_ends_truncated():
    task = SignTask(TaskConfig(**BASE, max_clip_steps=5))
    states = task.sample_clip(sign_policy(), return_images=False, return_states=True)
    assert len(states) == 5 and states[-1].truncated and not states[-1].terminated


@pytest.mark.parametrize(("settings", "match"), [
    ({"lr": float("inf")}, r"lr must be a finite number > 0, got inf"),
    ({"max_wait_time": -1.0}, r"max_wait_time must be a finite number >= 0"),
    ({"step_timeout": 0.0}, r"step_timeout must be a finite number > 0"),
    ({"max_grad_norm": -1.0}, r"max_grad_norm must be a finite number > 0"),
    ({"min_batch_size": 2}, r"min_batch_size=2 is more than the pool's 1 env "),
    ({"num_env_workers": 4, "min_batch_size": 3, "max_batch_size": 2},
     r"min_batch_size=3 is more than max_batch_size=2"),
    ({"num_env_workers": 2, "envs_per_worker": 2, "max_batch_size": 1},
     r"max_batch_size=1 < envs_per_worker=2"),
    ({"num_env_workers": 2, "envs_per_worker": 2, "min_batch_size": 3, "max_batch_size": 3},
     r"no multiple of envs_per_worker=2 lies in \[min_batch_size=3, 3\]"),
    ({"min_trajectory_length": 50}, r"min_trajectory_length=50 > num_epoch_samples=40"),
    ({"num_samples": 50}, r"num_samples \(each trajectory must hold a clip\)=50 > "),
    ({"num_samples": 4, "max_trajectory_length": 3},
     r"max_trajectory_length=3 < num_samples .*=4: every trajectory would be discarded"),
])
def test_settings_that_cannot_hold_together_are_refused_at_once(settings, match):
    with pytest.raises(ConfigError, match=match):
        TaskConfig(**{**BASE, **settings})


@pytest.mark.parametrize("mode", ["sync", "thread", "process"])
def test_a_pool_reset_with_seeds_reseeds_each_env(mode):
    seeds = [6, 4, 9, 11]  # each gives the sign opposite to the pool's own seed 0-3
    with WorkerPool(SignEnv, 2, mode, envs_per_worker=2, env_seed=0) as pool:
        pool.reset(seeds)
        batch = sorted(pool.next_batch(), key=lambda ready: ready.slot)
        with pytest.raises(ValueError, match="one seed per env"):
            pool.reset(seeds[:3])
    assert [float(r.outcome.obs[0]) for r in batch] == [
        float(SignEnv().reset(seed=seed)[0][0]) for seed in seeds]


def test_a_stop_waits_for_the_epoch_only_stop_wait_s(tmp_path):
    """SIGTERM let a long epoch's train steps all run (a scheduler's grace period ran out
    before the final checkpoint)."""
    model = sign_policy()
    task = SignalAt(TaskConfig(**BASE, total_steps=1000, num_update_steps=200,
                               stop_wait_s=0.0), at=2)
    trainer = TaskTrainer(task, model, run_dir=tmp_path)
    trainer.run()
    assert trainer.state == {"train/steps": 2, "train/epochs": 1, "env/steps": 40}


class _CrashesOnStep(SignEnv):
    def step(self, action: Any) -> Any:
        raise RuntimeError("broken")


def test_an_epochs_reseed_is_not_a_successful_step():
    """Every epoch's reseed reset the worker's failure count, so an env failing once per
    epoch never reached max_consecutive_failures."""
    with WorkerPool(_CrashesOnStep, 1, "thread", env_seed=0,
                    max_consecutive_failures=2) as pool, pytest.raises(WorkerError):
        for epoch in range(6):
            pool.reset(epoch_seeds(0, epoch, 1))
            pool.send(pool.next_batch(1), [0])
            pool.next_batch(1)
