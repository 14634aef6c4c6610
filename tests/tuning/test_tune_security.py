"""A tuning study's directory is untrusted data (``rlloop tune --resume`` a shared study):
its saved settings never import code or name endpoints without ``--allow-import``, rlloop
never writes through links planted in it, and ``--jobs`` workers import no module from
the working directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from rlloop.cli.main import main
from rlloop.errors import RunDirError

optuna = pytest.importorskip("optuna")

TINY = ["--env", "CartPole-v1", "--quiet", "--set", "num_envs=4", "--set", "eval_every=1",
        "--set", "eval_episodes=2", "--set", "solve_episodes=2", "--set", "mlflow=false"]


def _trials(path: Path) -> int:
    study = optuna.load_study(study_name="rlloop", storage=f"sqlite:///{path / 'study.db'}")
    return len(study.trials)


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory) -> Path:
    """A study of one finished trial (resumed with ``--trials 2`` it would run another)."""
    path = tmp_path_factory.mktemp("tune") / "study"
    assert main(["tune", "ppo", *TINY, "--trials", "1", "--total-env-steps", "500",
                 "--run-dir", str(path)]) == 0
    return path


@pytest.fixture
def study(finished_study, tmp_path, monkeypatch) -> Path:
    """A copy of the finished study, the working directory (where a payload would be
    importable from, as in a shared study one ``cd``s into)."""
    path = tmp_path / "study"
    shutil.copytree(finished_study, path)
    monkeypatch.chdir(path)
    return path


def _plant_payload(study: Path, name: str) -> Path:
    """A package ``name`` in the study whose import writes a marker file."""
    marker = study.parent / f"{name}-ran"
    (study / name).mkdir()
    (study / name / "__init__.py").write_text("")
    (study / name / "payload.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    return marker


def _edit_settings(study: Path, **changes) -> None:
    file = study / "tune.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def _hostile(study: Path, case: str, module: str) -> None:
    settings = json.loads((study / "tune.json").read_text())
    if case == "set-net":
        _edit_settings(study, sets=[*settings["sets"], f"ppo.net={module}.payload:Net"])
    elif case == "base-net":
        (study / "base.yaml").write_text(yaml.safe_dump({"ppo": {"net": f"{module}.payload:Net"}}))
    elif case == "space-net":
        _edit_settings(study, space={**settings["space"], "ppo.net": [f"{module}.payload:Net"]})
    elif case == "env":
        _edit_settings(study, env=f"{module}.payload:Evil-v0")
    elif case == "pettingzoo-env":
        _edit_settings(study, env=f"pettingzoo:{module}.payload")
    elif case == "set-mlflow":
        _edit_settings(study, sets=[*settings["sets"], "mlflow_tracking_uri=http://evil:5000"])
    elif case == "flag-mlflow":
        _edit_settings(study, flags={**settings["flags"], "mlflow_tracking_uri": "http://evil"})
    elif case == "base-ray":
        (study / "base.yaml").write_text(yaml.safe_dump({"ray": {"address": "evil:6379"}}))


CASES = ["set-net", "base-net", "space-net", "env", "pettingzoo-env", "set-mlflow",
         "flag-mlflow", "base-ray"]


@pytest.mark.parametrize("case", CASES)
def test_resume_refuses_a_study_that_imports_or_connects(study, capsys, case):
    """A shared study's saved settings ran the module they name (``ppo.net=pkg.payload:Net``
    in its sets) or sent the trials' metrics to a server they name."""
    module = f"study_evil_{case.replace('-', '_')}"
    marker = _plant_payload(study, module)
    _hostile(study, case, module)
    assert main(["tune", "--resume", str(study), "--trials", "2"]) == 2
    err = capsys.readouterr().err
    assert "--allow-import" in err and err.count("\n") == 1, err
    assert not marker.exists()
    assert _trials(study) == 1  # refused before any trial started


def test_a_rerun_without_env_refuses_the_saved_env(study, capsys):
    """The study's command line run again continues it; left out, --env is the saved one."""
    marker = _plant_payload(study, "study_evil_rerun")
    _edit_settings(study, env="study_evil_rerun.payload:Evil-v0")
    assert main(["tune", "ppo", *TINY[2:], "--trials", "2", "--total-env-steps", "500",
                 "--run-dir", str(study)]) == 2
    err = capsys.readouterr().err
    assert "would import module 'study_evil_rerun.payload'" in err and err.count("\n") == 1
    assert not marker.exists() and _trials(study) == 1


def test_allow_import_trusts_the_study(study, capsys):
    _hostile(study, "set-mlflow", "unused")
    assert main(["tune", "--resume", str(study), "--allow-import", "--quiet"]) == 0
    assert "best eval return" in capsys.readouterr().out


def test_a_new_study_may_name_what_the_user_typed(tmp_path):
    """Settings the user types are the user's own choice: not refused."""
    from rlloop.tuning import prepare

    _, settings = prepare("ppo", "CartPole-v1", trials=1, run_dir=str(tmp_path / "new"),
                          resume=None, space_file=None, config_file=None,
                          sets=["mlflow_tracking_uri=file:///tmp/mine"], flags={},
                          startup_trials=1, warmup_evals=1)
    assert settings.sets == ["mlflow_tracking_uri=file:///tmp/mine"]


def test_a_bad_tune_json_is_one_line(study, capsys):
    _edit_settings(study, sets="ppo.lr=1")
    assert main(["tune", "--resume", str(study)]) == 2
    err = capsys.readouterr().err
    assert "tune.json is not an rlloop study's settings (bad sets)" in err
    assert err.count("\n") == 1


# ---- links ---------------------------------------------------------------------------------
def _one_line_link_error(capsys, member: Path) -> None:
    err = capsys.readouterr().err
    assert f"{member} is a symbolic link" in err and err.count("\n") == 1, err


def test_resume_refuses_a_trial_directory_that_is_a_link(study, tmp_path, capsys):
    """``trials/trial-0001 -> /victim`` made the next trial write a whole run there."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (study / "trials" / "trial-0001").symlink_to(victim)
    assert main(["tune", "--resume", str(study), "--trials", "2"]) == 2
    _one_line_link_error(capsys, study / "trials" / "trial-0001")
    assert list(victim.iterdir()) == [] and _trials(study) == 1


def test_resume_refuses_trials_that_is_a_link(study, tmp_path, capsys):
    victim = tmp_path / "victim"
    shutil.move(study / "trials", victim)
    (study / "trials").symlink_to(victim)
    assert main(["tune", "--resume", str(study), "--trials", "2"]) == 2
    _one_line_link_error(capsys, study / "trials")
    assert sorted(p.name for p in victim.iterdir()) == ["trial-0000"]


def test_resume_never_writes_a_study_database_that_has_another_hard_link(study, tmp_path,
                                                                         capsys):
    other = tmp_path / "other.db"  # the database's other name, outside the study
    other.hardlink_to(study / "study.db")
    before = other.read_bytes()
    assert main(["tune", "--resume", str(study), "--trials", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{study / 'study.db'} has 2 hard links" in err and err.count("\n") == 1, err
    assert other.read_bytes() == before


@pytest.mark.parametrize("member", ["base.yaml", "study.db", "tune.json"])
def test_a_new_study_never_writes_through_a_planted_link(tmp_path, capsys, member):
    """``base.yaml`` was overwritten through a link (copyfile), ``study.db`` created at its
    link's target."""
    victim = tmp_path / "victim.txt"
    if member != "study.db":
        victim.write_text("precious")
    path = tmp_path / "study"
    path.mkdir()
    (path / member).symlink_to(victim)
    config = tmp_path / "base.yaml"
    config.write_text("ppo: {lr: 0.001}\n")
    assert main(["tune", "ppo", *TINY, "--trials", "1", "--total-env-steps", "500",
                 "--config", str(config), "--run-dir", str(path)]) == 2
    _one_line_link_error(capsys, path / member)
    if member == "study.db":
        assert not victim.exists()
    else:
        assert victim.read_text() == "precious"


def test_tune_checks_links_again_when_it_starts(tmp_path):
    """From Python, ``tune`` may run long after ``prepare``: it checks under the lock."""
    from rlloop.tuning import prepare, tune

    path, settings = prepare("ppo", "CartPole-v1", trials=1, run_dir=str(tmp_path / "s"),
                             resume=None, space_file=None, config_file=None, sets=[],
                             flags={"total_env_steps": 500}, startup_trials=1, warmup_evals=1)
    victim = tmp_path / "victim"
    victim.mkdir()
    (path / "trials").mkdir(parents=True)
    (path / "trials" / "trial-0000").symlink_to(victim)
    with pytest.raises(RunDirError, match="trial-0000 is a symbolic link"):
        tune(path, settings, quiet=True)
    assert list(victim.iterdir()) == [] and not (path / "study.db").exists()


# ---- workers ---------------------------------------------------------------------------------
def test_jobs_workers_import_nothing_from_the_working_directory(study):
    """``python -m`` put the working directory first on the workers' path: a ``yaml.py``
    in a study one tunes from shadowed PyYAML in every worker."""
    marker = study.parent / "shadow-ran"
    (study / "yaml.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                   "raise SystemExit(3)\n")
    assert main(["tune", "--resume", str(study), "--jobs", "2", "--quiet"]) == 0
    assert not marker.exists()


def test_jobs_workers_import_the_env_module_the_user_typed(tmp_path, monkeypatch):
    """-P leaves the working directory off the workers' path; an env module there that the
    user named (``--env myenvs:MyCart-v0``) is still imported, in each worker."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "myenvs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('MyCart-v0', max_episode_steps=100,\n"
        "                   entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    args = [a if a != "CartPole-v1" else "myenvs:MyCart-v0" for a in TINY]
    assert main(["tune", "ppo", *args, "--trials", "2", "--jobs", "2",
                 "--total-env-steps", "500", "--run-dir", str(tmp_path / "study")]) == 0
    assert _trials(tmp_path / "study") == 2
