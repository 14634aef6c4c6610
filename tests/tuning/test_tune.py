"""``rlloop tune``: Optuna studies whose trials are rlloop runs (tiny budgets, CartPole)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import rlloop_cmd

from rlloop.cli.main import main

optuna = pytest.importorskip("optuna")

TINY = ["--env", "CartPole-v1", "--quiet", "--set", "num_envs=4", "--set", "eval_every=1",
        "--set", "eval_episodes=2", "--set", "solve_episodes=2"]
NO_MLFLOW = ["--set", "mlflow=false"]


def _study(path):
    return optuna.load_study(study_name="rlloop", storage=f"sqlite:///{path / 'study.db'}")


def _states(path) -> list[str]:
    return [t.state.name for t in _study(path).trials]


def test_four_trials_each_a_run_and_the_best_config_trains(tmp_path):
    study = tmp_path / "study"
    # MLflow off: each trial is an ordinary run (test_cli checks a run's MLflow store), and
    # a store per trial would cost seconds of CPU each.
    assert main(["tune", "ppo", *TINY, *NO_MLFLOW, "--trials", "4", "--total-env-steps",
                 "512", "--run-dir", str(study)]) == 0
    trials = _study(study).trials
    assert len(trials) == 4 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    for t in trials:  # its own run directory, trained with the sampled values
        run = study / "trials" / f"trial-{t.number:04d}"
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["ppo"]["lr"] == t.params["ppo.lr"]
        assert config["ppo"]["gamma"] == t.params["ppo.gamma"]
        assert (run / "best").is_dir() and (run / "metrics.jsonl").is_file()

    best = study / "best.yaml"
    best_trial = _study(study).best_trial
    assert yaml.safe_load(best.read_text())["ppo"]["lr"] == best_trial.params["ppo.lr"]
    run = tmp_path / "from-best"
    assert main(["train", "ppo", "--config", str(best), "--total-env-steps", "256", "--quiet",
                 *NO_MLFLOW, "--run-dir", str(run)]) == 0
    trained = yaml.safe_load((run / "config.yaml").read_text())
    assert trained["ppo"] == yaml.safe_load(best.read_text())["ppo"]


def test_a_rigged_space_prunes_the_trials_below_the_median(tmp_path):
    # An eval return equal to the episode cap (CartPole cannot fall in under 9 steps), so
    # trials after a cap-8 trial with a lower cap fall below the median at every
    # evaluation. With this sampler seed TPE draws caps 8, 8, 5, 2.
    space = tmp_path / "space.yaml"
    space.write_text("env_kwargs.max_episode_steps: {low: 2, high: 8}\n")
    study = tmp_path / "study"
    assert main(["tune", "ppo", *TINY, *NO_MLFLOW, "--backend", "gymnasium", "--seed", "4",
                 "--trials", "4", "--startup-trials", "1", "--space", str(space),
                 "--total-env-steps", "768", "--set", "ppo.rollout_steps=64",
                 "--set", "ppo.minibatch_size=64", "--run-dir", str(study)]) == 0
    trials = _study(study).trials
    assert "PRUNED" in [t.state.name for t in trials]
    for t in trials:
        if t.state.name == "PRUNED":  # stopped early: fewer env steps than the budget
            assert t.user_attrs["env_steps"] < 768
    assert yaml.safe_load((study / "best.yaml").read_text())["env_kwargs"] == {
        "max_episode_steps": 8}


def test_a_killed_study_resumes_and_retries_the_cut_trial(tmp_path, cli_env):
    study = tmp_path / "study"
    proc = subprocess.Popen(
        rlloop_cmd("tune", "ppo", *TINY, *NO_MLFLOW, "--trials", "3", "--total-env-steps",
                   "1024", "--run-dir", str(study)),
        cwd=tmp_path, env=cli_env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (study / "trials" / "trial-0001" / "config.yaml").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the study, in the middle of trial 1
        proc.wait()
    assert _states(study) == ["COMPLETE", "RUNNING"] or _states(study) == ["PRUNED", "RUNNING"]

    assert main(["tune", "--resume", str(study)]) == 0
    trials = _study(study).trials
    assert trials[1].state.name == "FAIL"
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == 1)
    assert retry.params == trials[1].params
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 3
    assert (study / "best.yaml").is_file()

    # The study's own command line, run again, continues it: here it has all its trials.
    assert main(["tune", "ppo", *TINY, *NO_MLFLOW, "--trials", "3", "--total-env-steps",
                 "1024", "--run-dir", str(study)]) == 0
    assert len(_study(study).trials) == len(trials)
    # Other settings for the same directory are refused in one line.
    assert main(["tune", "ppo", *TINY, *NO_MLFLOW, "--total-env-steps", "2048",
                 "--run-dir", str(study)]) == 2


def _processes_naming(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode():
                pids.append(int(proc.name))
        except OSError:
            pass
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_sigterm_to_tune_with_jobs_stops_its_workers_and_their_trials(tmp_path, cli_env):
    """SIGTERM to ``rlloop tune --jobs 2`` killed the parent only: its workers went on,
    orphaned, while the study's lock was free for a --resume."""
    study = tmp_path / "study"
    proc = subprocess.Popen(
        rlloop_cmd("tune", "ppo", *TINY, *NO_MLFLOW, "--trials", "4", "--jobs", "2",
                   "--total-env-steps", "200000", "--set", "stop_on_solve=false",
                   "--run-dir", str(study)),
        cwd=tmp_path, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not all((study / "trials" / f"trial-000{i}" / "checkpoints").is_dir()
                      for i in (0, 1)):  # both workers are training
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # the parent only, as a process manager sends it
        assert proc.wait(120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    left = _processes_naming(str(study))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []  # no worker left behind
    states = _states(study)
    assert "RUNNING" not in states and states.count("FAIL") == 2, states  # both retried later


@pytest.mark.parametrize(("space", "expected"), [
    ("ppo.lrr: {low: 0.001, high: 0.01}",
     "search space key ppo.lrr: unknown config key 'ppo.lrr'; did you mean ppo.lr?"),
    ("ppo.lr: {low: 0.01, high: 0.001}", "low must be below high"),
    ("ppo.lr: {low: 0, high: 0.1, log: true}", "a log range needs low > 0"),
    ("ppo.gamma: []", "the list of choices is empty"),
    ("ppo.lr: 0.01", "expected a list of choices or a mapping"),
    ("ppo.lr: {lo: 0.001, high: 0.01}", "a range takes low, high"),
    # Both ends and every choice are checked (one end let these through), and infinities.
    ("ppo.gamma: {low: 0.9, high: 1.5}", "search space key ppo.gamma: ppo.gamma must be"),
    ("ppo.activation: [tanh, foo]", "search space key ppo.activation"),
    ("ppo.lr: {low: 0.001, high: .inf}", "high must be a finite number"),
    # a float range over an int setting: whole-number ends passed, every trial failed
    ("ppo.minibatch_size: {low: 32, high: 256, type: float}",
     "search space key ppo.minibatch_size: ppo.minibatch_size must be an integer"),
])
def test_a_bad_search_space_is_one_line_exit_2(tmp_path, capsys, space, expected):
    file = tmp_path / "space.yaml"
    file.write_text(space + "\n")
    assert main(["tune", "ppo", "--space", str(file), "--run-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1
    assert not (tmp_path / "s").exists()


def test_options_beside_tune_resume_are_refused_not_ignored(tmp_path, capsys):
    assert main(["tune", "--resume", str(tmp_path), "--set", "ppo.lr=0.5", "--env",
                 "Pendulum-v1", "--total-env-steps", "512"]) == 2
    err = capsys.readouterr().err
    assert "--env, --set, --total-env-steps cannot change them" in err and err.count("\n") == 1
    assert main(["tune", "--resume", str(tmp_path), "--startup-trials", "0",
                 "--warmup-evals", "9"]) == 2
    assert "--startup-trials, --warmup-evals cannot change them" in capsys.readouterr().err


def test_a_space_takes_numbers_as_yaml_spells_them():
    """``1e-4`` (YAML reads it as a string without a dot) was refused as not a number."""
    from rlloop.tuning.space import parse_space

    [param] = parse_space({"ppo.lr": {"low": "1e-4", "high": "1e-2", "log": True}}, "s")
    assert (param.kind, param.low, param.high) == ("float", 1e-4, 1e-2)


def test_a_resumed_study_draws_new_points(tmp_path):
    """The sampler's seed was the same at every sitting: a resumed study's first trial
    repeated trial 0's parameters (and its result)."""
    study = tmp_path / "study"
    base = ["ppo", *TINY, *NO_MLFLOW, "--total-env-steps", "256", "--run-dir", str(study)]
    assert main(["tune", *base, "--trials", "1"]) == 0
    assert main(["tune", "--resume", str(study), "--trials", "2", "--quiet"]) == 0
    first, second = (t.params for t in _study(study).trials)
    assert first != second


def test_resume_of_a_directory_without_a_study_is_one_line_exit_2(tmp_path, capsys):
    assert main(["tune", "--resume", str(tmp_path)]) == 2
    assert "holds no rlloop study" in capsys.readouterr().err


def test_a_study_and_a_training_run_never_share_a_directory(tmp_path, capsys):
    """``tune --run-dir`` a training run wrote the study into it (and the reverse trained
    into a study), mixing config, checkpoints, reports and ``best/``: both are refused."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv: CartPole-v1\n")
    assert main(["tune", "ppo", *TINY, "--run-dir", str(run)]) == 2
    assert "holds a training run, not a study" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]

    study = tmp_path / "study"
    study.mkdir()
    (study / "tune.json").write_text("{}")
    assert main(["train", "ppo", *TINY, *NO_MLFLOW, "--run-dir", str(study)]) == 2
    err = capsys.readouterr().err
    assert "holds a tuning study (rlloop tune), not a training run" in err
    assert err.count("\n") == 1
    assert sorted(p.name for p in study.iterdir()) == ["tune.json"]


def test_an_algorithm_that_does_not_fit_the_env_is_refused_before_any_trial(tmp_path, capsys):
    """dqn on Pendulum ran five failing trials, then blamed the search space."""
    study = tmp_path / "s"
    assert main(["tune", "dqn", "--env", "Pendulum-v1", "--quiet", "--run-dir", str(study)]) == 2
    err = capsys.readouterr().err
    assert "dqn needs discrete actions but Pendulum-v1 has continuous ones" in err
    assert err.count("\n") == 1 and not study.exists()


def test_a_trial_that_skips_its_updates_fails_and_the_study_goes_on(tmp_path, capsys):
    """A trial whose run stops for skipping its updates (max_skipped_share) is a failed
    trial, as one that does not fit the env: the study tries others (here five, all on an
    env that is NaN at every step, and then says why)."""
    import gymnasium
    from nan_envs import ALL_NAN_ID, nan_cartpole

    gymnasium.register(ALL_NAN_ID, entry_point=nan_cartpole, disable_env_checker=True)
    space = tmp_path / "space.yaml"
    space.write_text("ppo.lr: {low: 1e-4, high: 1e-3}\n")
    study = tmp_path / "study"
    try:
        code = main(["tune", "ppo", *TINY[2:], *NO_MLFLOW, "--env", ALL_NAN_ID, "--trials", "1",
                     "--space", str(space), "--total-env-steps", "256",
                     "--set", "ppo.rollout_steps=16", "--set", "ppo.minibatch_size=64",
                     "--run-dir", str(study)])
    finally:
        gymnasium.registry.pop(ALL_NAN_ID, None)
    assert code == 2
    assert "5 trials in a row failed (last: 100% of the updates" in capsys.readouterr().err
    trials = _study(study).trials
    assert [t.state.name for t in trials] == ["FAIL"] * 5
    assert all("max_skipped_share" in t.user_attrs["error"] for t in trials)


def test_every_algorithm_has_a_default_space_of_its_own_settings():
    """``rlloop tune ALGO`` without --space searches the default one: QR-DQN and TQC had
    none (a KeyError), and a key naming no setting would fail every trial."""
    import dataclasses

    from rlloop.config.registry import ALGORITHMS
    from rlloop.tuning.space import default_space

    for algo, entry in ALGORITHMS.items():
        fields = {f.name for f in dataclasses.fields(entry.config_cls)}
        keys = [p.key for p in default_space(algo)]
        assert keys and all(k.split(".", 1)[0] == algo and k.split(".", 1)[1] in fields
                            for k in keys), (algo, keys)
