"""The off-policy cadence: the exact env steps at which optimisations, evals, records and saves
happen, which directories a run leaves, and the CLI around it."""

from __future__ import annotations

import json
import time

import pytest
import torch

from rlloop.checkpoint import CheckpointManager, is_checkpoint, load_checkpoint
from rlloop.config.loading import build_config
from rlloop.envs.core import sample_random_actions
from rlloop.runs.build import COMPONENTS, build_algorithm
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import resume, train
from rlloop.system.seeding import derive_seed
from rlloop.trainers.loop import Trainer
from rlloop.trainers.offpolicy_schedule import OffPolicySchedule
from rlloop.trainers.stop_conditions import HitsUpperBound

QUIET = ["mlflow=false", "progress=false"]
TINY_DQN = ["dqn.hidden=[16]", "dqn.batch_size=8", "dqn.gradient_steps=1",
            "dqn.buffer_size=1000", "dqn.exploration_steps=50"]


def _dqn(*sets: str, num_envs: int = 1):
    config = build_config("dqn", "CartPole-v1", sets=[*QUIET, f"num_envs={num_envs}",
                                                      *TINY_DQN, *sets])
    return config, build_algorithm(config)


def _off_policy_trainer(algo, *, sink=None, **parts) -> Trainer:
    """The one trainer on the off-policy cadence, as a run builds it for DQN, SAC, TD3."""
    return Trainer(algo, sink=sink, schedule=OffPolicySchedule(algo, **parts))


class _Sink:
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def log_metrics(self, metrics, step: int) -> None:
        self.rows.append({**metrics, "step": float(step)})


class _Evaluator:
    def __init__(self, trainer_state) -> None:
        self.state = trainer_state
        self.at: list[float] = []

    def evaluate(self, algorithm, episodes: int) -> dict[str, float]:
        self.at.append(self.state()["env/steps"])
        return {"return_mean": float(len(self.at))}


def _watch_optimizations(algo) -> list[int]:
    """Env steps at which an optimisation step ran (skipped warm-up ones excluded)."""
    seen: list[int] = []
    optimize = algo.optimize

    def watched(env_steps: int):
        stats = optimize(env_steps)
        if stats is not None:
            seen.append(env_steps)
        return stats

    algo.optimize = watched
    return seen


def test_cadence_in_env_steps_one_env():
    # opt every 5 env steps, warm-up 10 env steps: optimisation k happens at 10 + 5k.
    _, algo = _dqn("dqn.learning_starts=10", "dqn.opt_interval=5", "dqn.eval_interval=3",
                   "dqn.record_interval=2", "dqn.save_interval=4", "dqn.max_opts=10")
    opts = _watch_optimizations(algo)
    sink, saves = _Sink(), []
    trainer = _off_policy_trainer(algo, sink=sink, save=lambda k: saves.append(
        (k, trainer.state["env/steps"])))
    evaluator = _Evaluator(lambda: trainer.state)
    trainer.schedule.evaluator = evaluator
    stats = trainer.run()

    assert opts == [10 + 5 * k for k in range(1, 11)]
    assert evaluator.at == [25, 40, 55]  # optimisation steps 3, 6, 9
    assert saves == [(4, 30), (8, 50)]
    # A record is written after every eval or record step: opt steps 2, 3, 4, 6, 8, 9, 10.
    assert [r["opt/steps"] for r in sink.rows] == [2, 3, 4, 6, 8, 9, 10]
    assert [r["step"] for r in sink.rows] == [20, 25, 30, 40, 50, 55, 60]
    for row in sink.rows:
        assert ("eval/return_mean" in row) == (row["opt/steps"] % 3 == 0)
        assert ("env/fps" in row) == (row["opt/steps"] % 2 == 0)
        assert ("opt/steps_per_sec" in row) == ("env/fps" in row)
        assert "losses/q" in row and row["algorithm/steps"] == row["opt/steps"]
    assert stats["algorithm/steps"] == 10 and stats["env/steps"] == 60
    assert trainer.state == {"algorithm/collects": 60, "algorithm/steps": 10, "env/steps": 60}
    algo.close()


def test_cadence_with_several_envs_and_pending_optimizations():
    # 4 envs, an optimisation every 2 env steps: each batched step makes two due; a save
    # between them leaves one pending, and the trainer's state says so.
    _, algo = _dqn("dqn.learning_starts=8", "dqn.opt_interval=2", "dqn.eval_interval=100",
                   "dqn.record_interval=100", "dqn.save_interval=3", num_envs=4)
    opts = _watch_optimizations(algo)
    pending = []
    trainer = _off_policy_trainer(algo, save=lambda k: pending.append(
        (k, trainer.get_state()["pending_opts"])))
    trainer.run(stop_conditions=[HitsUpperBound("env/steps", 20)])
    assert opts == [12, 12, 16, 16, 20, 20]
    assert pending == [(3, 1), (6, 0)]
    assert trainer.state["algorithm/collects"] == 5
    algo.close()


def test_throughput_and_wall_time_exclude_evaluations():
    _, algo = _dqn("dqn.learning_starts=10", "dqn.opt_interval=5", "dqn.eval_interval=1",
                   "dqn.record_interval=2", "dqn.max_opts=4")

    class SlowEvaluator:
        def evaluate(self, algorithm, episodes: int) -> dict[str, float]:
            time.sleep(0.2)
            return {"return_mean": 0.0}

    sink = _Sink()
    trainer = _off_policy_trainer(algo, sink=sink, evaluator=SlowEvaluator())
    start = time.perf_counter()
    trainer.run()
    elapsed = time.perf_counter() - start
    assert trainer.wall_time < elapsed - 4 * 0.2 + 0.05
    rates = [r["env/fps"] for r in sink.rows if "env/fps" in r]
    # 10 env steps per record window; with the two 0.2 s evals counted it would be < 25/s.
    assert len(rates) == 2 and min(rates) > 100
    assert all(r["time/eval_s"] >= 0.2 for r in sink.rows)
    algo.close()


def test_warmup_takes_uniform_random_actions_from_the_algorithm_generator():
    _, algo = _dqn("dqn.learning_starts=30", "seed=5")
    for _ in range(30):
        algo.env_step()
    stored = algo.loop.replay.get_state()["action"]
    generator = torch.Generator().manual_seed(derive_seed(5, "algorithm"))
    expected = torch.cat([sample_random_actions(algo.space, 1, generator) for _ in range(30)])
    assert torch.equal(stored, expected)
    assert algo.optimize(30) is None  # still warming up: the optimisation step is skipped
    algo.close()


def test_plain_trainer_step_is_collect_then_update():
    _, algo = _dqn("dqn.learning_starts=4", "dqn.opt_interval=8")
    trainer = Trainer(algo)
    stats = trainer.step()
    assert trainer.state == {"algorithm/collects": 1, "algorithm/steps": 1, "env/steps": 8}
    assert "losses/q" in stats and algo.learner.updates == 1
    algo.close()


def test_run_leaves_best_and_opt_step_checkpoints(tmp_path):
    config = build_config("dqn", "CartPole-v1", sets=[
        *QUIET, "num_envs=1", *TINY_DQN, "dqn.learning_starts=10", "dqn.opt_interval=5",
        "dqn.eval_interval=3", "dqn.record_interval=2", "dqn.save_interval=4",
        "dqn.max_opts=10", "eval_episodes=2", "stop_on_solve=false", "keep_checkpoints=5"])
    result = train(config, tmp_path / "run")
    run = result.run_dir
    assert result.env_steps == 60
    assert is_checkpoint(run / "best")
    names = [p.name for p in CheckpointManager(run / "checkpoints").all()]
    assert names == ["000000004", "000000008", "000000010"]  # periodic + final
    final = load_checkpoint(run / "checkpoints" / "000000010")
    assert final.components["trainer"]["counters"]["algorithm/steps"] == 10
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["opt/steps"] for r in rows if "opt/steps" in r] == [2, 3, 4, 6, 8, 9, 10]
    assert all("env/fps" in r for r in rows if r.get("opt/steps", 1) % 2 == 0)
    assert result.stopped_by == "max_opts"  # said "budget", 940 env steps short of it
    # A resume of a run that reached max_opts trains nothing (it took one more env step
    # and optimisation step at each resume).
    again = resume(run)
    assert again.env_steps == 60 and again.stopped_by == "max_opts"
    names = [p.name for p in CheckpointManager(run / "checkpoints").all()]
    assert names[-1] == "000000010"


def test_best_is_a_policy_snapshot_without_the_replay_buffer(tmp_path):
    config = build_config("dqn", "CartPole-v1", sets=[
        *QUIET, "num_envs=1", *TINY_DQN, "dqn.learning_starts=1100", "dqn.opt_interval=100",
        "dqn.eval_interval=1", "dqn.max_opts=2", "eval_episodes=2", "stop_on_solve=false",
        "save_video=false"])
    run = train(config, tmp_path / "run").run_dir
    final = CheckpointManager(run / "checkpoints").latest()
    assert final is not None and "offpolicy" in load_checkpoint(final).components["algorithm"]
    best = load_checkpoint(run / "best", expected_components=COMPONENTS)
    assert set(best.components["algorithm"]) == {"learner"}
    assert set(best.components["algorithm"]["learner"]) == {"module"}  # no optimiser moments
    # A full buffer of 1,000 CartPole transitions is ~50 kB; the [16] Q-nets' weights ~2 kB.
    weights = "algorithm.safetensors"
    assert (final / weights).stat().st_size > 50_000 > 25 * (run / "best" / weights).stat().st_size
    # What rlloop eval and the video load from best/ is still there.
    assert evaluate_run(run, episodes=2)["episodes"] == 2
    algo = build_algorithm(config)
    algo.set_policy_state(best.components["algorithm"])
    algo.close()


@pytest.mark.parametrize(("algo", "env_id"), [("td3", "Pendulum-v1")])
def test_cli_trains_evaluates_and_resumes_off_policy(tmp_path, cli_in_process, algo, env_id):
    run = tmp_path / "run"
    small = [f"{algo}.learning_starts=50", f"{algo}.hidden=[32,32]", f"{algo}.batch_size=32",
             f"{algo}.eval_interval=100", f"{algo}.save_interval=100",
             f"{algo}.record_interval=50", "eval_episodes=2", "save_video=false"]
    args = ["train", algo, "--env", env_id, "--run-dir", str(run), "--quiet",
            "--total-env-steps", "250", *[x for s in small for x in ("--set", s)]]
    out = cli_in_process(args)
    assert out.returncode == 0, out.stderr
    for name in ("config.yaml", "metrics.jsonl", "mlflow.db", "report.md", "summary.json"):
        assert (run / name).is_file(), name
    assert is_checkpoint(run / "best")
    assert [p.name for p in CheckpointManager(run / "checkpoints").all()] == [
        "000000100", "000000200"]
    ev = cli_in_process(["eval", str(run), "--episodes", "2", "--json"])
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout.strip().splitlines()[-1])["episodes"] == 2
    res = cli_in_process(["train", algo, "--resume", str(run), "--quiet",
                          "--total-env-steps", "300"])
    assert res.returncode == 0, res.stderr
    latest = load_checkpoint(CheckpointManager(run / "checkpoints").latest())
    assert latest.components["trainer"]["counters"]["env/steps"] == 300
    assert latest.components["trainer"]["counters"]["algorithm/steps"] == 250


def test_a_resume_keeps_the_mean_recorders_stats_since_the_last_record(tmp_path):
    """The mean recorder's sums were not checkpointed: after a cut between two records,
    the first record of the resumed run averaged only the steps since the resume."""
    sets = [*QUIET, "num_envs=1", *TINY_DQN, "dqn.learning_starts=10", "dqn.opt_interval=1",
            "dqn.record_interval=7", "dqn.recorder=mean", "dqn.eval_interval=1000",
            "eval_episodes=1", "stop_on_solve=false", "save_video=false", "seed=3"]

    def records(run) -> dict[int, dict]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: {k: v for k, v in r.items() if k.startswith(("losses/", "q/"))}
                for r in rows if "losses/q" in r}

    straight = train(build_config("dqn", "CartPole-v1", flags={"total_env_steps": 80},
                                  sets=sets), tmp_path / "a").run_dir
    cut = train(build_config("dqn", "CartPole-v1", flags={"total_env_steps": 40}, sets=sets),
                tmp_path / "b").run_dir  # 30 optimisation steps: 2 past a record
    resume(cut, total_env_steps=80)
    a, b = records(straight), records(cut)
    assert a == b and any(step > 40 for step in a)


def test_the_mean_recorders_state_keeps_integer_sums_exact():
    from rlloop.algorithms.offpolicy_parts import MeanRecorder

    straight, cut = MeanRecorder(), MeanRecorder()
    big = torch.tensor(2**24 + 1)  # an int64 stat: a float32 sum would round it
    for recorder in (straight, cut):
        recorder.add({"n": big, "x": torch.tensor(0.1)})
    again = MeanRecorder()
    again.set_state(cut.get_state())
    for recorder in (straight, again):
        recorder.add({"n": big, "x": torch.tensor(0.7)})
    assert again.pop() == straight.pop() == {"n": float(2**24 + 1),
                                             "x": float(torch.tensor(0.1) + 0.7) / 2}
