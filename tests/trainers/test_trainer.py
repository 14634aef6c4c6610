"""Trainer semantics (rl8's): counters, eval rules, stop conditions, env resets."""

import dataclasses
import math

import pytest
import torch

from rlloop.config.loading import build_config
from rlloop.runs.build import build_algorithm
from rlloop.trainers.loop import OnPolicySchedule, Trainer
from rlloop.trainers.stop_conditions import HitsLowerBound, HitsUpperBound, Plateaus


def _trainer(**sets):
    items = ["mlflow=false", "progress=false", "ppo.rollout_steps=8", "num_envs=4",
             "ppo.minibatch_size=16", *[f"{k}={v}" for k, v in sets.items()]]
    config = build_config("ppo", "CartPole-v1", sets=items)
    return Trainer(build_algorithm(config), eval_episodes=3)


def test_step_counters_and_stats_keys():
    trainer = _trainer()
    stats = trainer.step()
    assert stats["env/steps"] == 32 and stats["algorithm/steps"] == 1
    assert stats["algorithm/collects"] == 1
    for key in ("losses/policy", "losses/value", "ppo/approx_kl", "time/env_s",
                "time/inference_s", "time/learn_s", "env/steps_per_s"):
        assert key in stats and math.isfinite(stats[key]), key
    trainer.step()
    assert trainer.state == {"algorithm/collects": 2, "algorithm/steps": 2, "env/steps": 64}


def test_an_algorithm_without_a_schedule_runs_on_the_on_policy_one():
    assert isinstance(_trainer().schedule, OnPolicySchedule)


def test_eval_scores_the_policy_over_whole_episodes():
    # CartPole pays 1 per step, so any policy scores > 0: compare two known policies.
    trainer = _trainer()
    algo = trainer.algorithm
    algo.act = lambda obs, deterministic=True: torch.zeros(len(obs), dtype=torch.int64)
    left = trainer.eval()  # always pushing left drops the pole within about 10 steps
    algo.act = lambda obs, deterministic=True: (obs[:, 2] + obs[:, 3] > 0).long()
    lean = trainer.eval()  # pushing towards the pole's lean balances it to the time limit
    assert left["eval/episodes"] == lean["eval/episodes"] == 3
    assert left["eval/return_mean"] == left["eval/length_mean"] < 15
    assert lean["eval/return_mean"] == lean["eval/return_min"] == 500.0


def test_eval_config_rejected_when_envs_reset_once():
    trainer = _trainer()
    trainer.step()
    with pytest.raises(ValueError, match="horizons_per_env_reset < 0"):
        trainer.eval(env_config={"sutton_barto_reward": True})
    with pytest.raises(ValueError, match="horizons_per_env_reset < 0"):
        trainer.run(steps_per_eval=1, eval_env_config={"x": 1},
                    stop_conditions=[HitsUpperBound("env/steps", 1)])


def test_eval_only_at_reset_boundaries_and_steps_per_eval_multiple():
    trainer = _trainer(horizons_per_env_reset=2, eval_every=2)
    trainer.step()
    with pytest.raises(RuntimeError, match="every horizons_per_env_reset=2"):
        trainer.eval()
    trainer.step()
    trainer.eval()
    with pytest.raises(ValueError, match="multiple of horizons_per_env_reset=2"):
        trainer.run(steps_per_eval=3)


def test_a_run_ending_between_reset_boundaries_keeps_its_last_evaluation(tmp_path):
    """With horizons_per_env_reset=3 and a budget of 8 iterations, the end-of-run
    evaluation raised 'eval can only be called every ...': exit 1 and no report."""
    from rlloop.runs.start import train

    config = build_config("ppo", "CartPole-v1", flags={"total_env_steps": 256}, sets=[
        "mlflow=false", "progress=false", "save_video=false", "ppo.rollout_steps=8",
        "num_envs=4", "ppo.minibatch_size=16", "horizons_per_env_reset=3", "eval_every=3",
        "eval_episodes=2", "stop_on_solve=false"])
    result = train(config, tmp_path / "run")
    assert result.env_steps == 256  # 8 iterations: evaluated after 3 and 6, not after 8
    assert result.last_stats["eval/episodes"] == 2
    assert (result.run_dir / "report.md").is_file()
    # No evaluation before the budget ends (eval_every=0): none at all, and a report.
    config = dataclasses.replace(config, eval_every=0, total_env_steps=64)
    result = train(config, tmp_path / "none")
    assert "eval/return_mean" not in result.last_stats and result.best_eval_return is None
    assert (result.run_dir / "report.md").is_file()


class _EvalSteps:
    """Records the update count at each evaluation."""

    def __init__(self) -> None:
        self.at: list[int] = []

    def on_step(self, trainer: Trainer, stats: dict) -> None:
        pass

    def on_eval(self, trainer: Trainer, stats: dict) -> None:
        self.at.append(trainer.state["algorithm/steps"])


def test_run_stops_on_condition_and_evaluates():
    trainer = _trainer()
    evals = _EvalSteps()
    trainer.callbacks.append(evals)
    stats = trainer.run(steps_per_eval=2, stop_conditions=[HitsUpperBound("env/steps", 128)])
    assert stats["env/steps"] == 128
    assert "eval/return_mean" in stats  # 4 steps: evaluated at the last one
    assert evals.at == [2, 4]  # every steps_per_eval updates, not every update


def test_a_run_owes_evaluations_by_its_own_cadence_only():
    """A run without evals, then one every 2 updates: the second took the first's last
    update (4, a multiple of 2) for one cut before its due eval and evaluated it first."""
    trainer = _trainer()
    evals = _EvalSteps()
    trainer.callbacks.append(evals)
    trainer.run(stop_conditions=[HitsUpperBound("env/steps", 128)])
    trainer.run(steps_per_eval=2, stop_conditions=[HitsUpperBound("env/steps", 192)])
    assert evals.at == [6]


def test_conditions():
    assert HitsUpperBound("a", 1)({"a": 1.0}) and not HitsUpperBound("a", 1)({"a": 0.5})
    assert HitsLowerBound("a", 1)({"a": 0.5}) and not HitsLowerBound("a", 1)({})
    plateau = Plateaus("a", patience=2, rtol=0.01)
    assert [plateau({"a": v}) for v in (1.0, 5.0, 5.01, 5.0)] == [False, False, False, True]
