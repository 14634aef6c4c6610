"""Mistyped input to ``rlloop train`` answers before torch is imported: one line, exit 2.

Each case runs the CLI in a real process and reports whether torch was loaded when it
returned; torch's import alone is over a second, the answer should not wait for it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlloop.config.loading import build_config, check_set_keys
from rlloop.errors import ConfigError

_PROBE = """
import json, sys
from rlloop.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def _train(args: list[str], env: dict[str, str], cwd: Path) -> tuple[dict[str, object], str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, "train", *args], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (["ppo", "--env", "CartPol-v1"],
     "rlloop: error: unknown env id 'CartPol-v1'; did you mean 'CartPole-v1'"),
    (["ppo", "--set", "ppo.lrr=1"],
     "rlloop: error: unknown config key 'ppo.lrr'; did you mean ppo.lr?"),
    (["dqn", "--env", "CartPole-v1", "--set", "dqn.taus=0.1"],
     "rlloop: error: unknown config key 'dqn.taus'; did you mean dqn.tau?"),
    (["ppo", "--set", "seeed=1"],
     "rlloop: error: unknown config key 'seeed'; did you mean seed?"),
    (["ppo", "--set", "ppo.lr=-1"], "rlloop: error: ppo.lr must be > 0, got -1"),
    (["dqn", "--env", "CartPole-v1", "--set", "dqn.tau=2"],
     "rlloop: error: dqn.tau must be in (0, 1], got 2"),
    (["ppo", "--set", "ppo.micro_batch=0"], "rlloop: error: ppo.micro_batch must be > 0"),
    # Pendulum with g=.nan stepped NaN forever; a negative entropy bonus was trained with.
    (["sac", "--env", "Pendulum-v1", "--set", "env_kwargs.g=.nan"],
     "rlloop: error: env_kwargs.g must be a finite number, got nan"),
    (["ppo", "--set", "ppo.ent_coef=-5"], "rlloop: error: ppo.ent_coef must be >= 0"),
    # An empty --resume trained a new run; --set env= kept the first env's preset.
    (["ppo", "--resume", ""], "rlloop: error: --resume is empty"),
    (["ppo", "--set", "env=Acrobot-v1"], "rlloop: error: --set env=... would keep the preset"),
    # Without --resume the flag trusted nothing and was silently ignored.
    (["ppo", "--allow-import"], "rlloop: error: --allow-import only applies with --resume"),
])
def test_mistyped_env_or_key_fails_without_importing_torch(
        tmp_path: Path, cli_env: dict[str, str], args: list[str], expected: str) -> None:
    result, stderr = _train(args, cli_env, tmp_path)
    lines = stderr.strip().splitlines()
    assert result == {"code": 2, "torch": False}, stderr
    assert len(lines) == 1 and lines[0].startswith(expected), stderr
    assert not (tmp_path / "runs").exists()  # nothing was created


def test_an_empty_run_directory_is_not_the_working_directory(tmp_path: Path,
                                                             cli_env: dict[str, str]) -> None:
    """``rlloop eval ""`` evaluated the working directory's run, if it was one."""
    (tmp_path / "config.yaml").write_text("algo: ppo\n")
    out = subprocess.run([sys.executable, "-c", _PROBE, "eval", ""], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 2, "torch": False}
    assert out.stderr.startswith("rlloop: error: the run directory is empty")


def test_run_dir_beside_resume_is_refused_not_ignored(tmp_path: Path,
                                                     cli_env: dict[str, str]) -> None:
    """``--run-dir`` with ``--resume`` was ignored: the run went on in the resumed dir."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.yaml").write_text("algo: ppo\n")
    result, stderr = _train(["ppo", "--resume", "a", "--run-dir", "b"], cli_env, tmp_path)
    assert result == {"code": 2, "torch": False}, stderr
    assert "a resumed run stays in its own directory" in stderr
    assert not (tmp_path / "b").exists()


def test_early_key_check_says_what_build_config_says() -> None:
    for algo, item in (("ppo", "ppo.lrr=1"), ("sac", "sac.alpha=1"), ("ppo", "seeed=1")):
        with pytest.raises(ConfigError) as early:
            check_set_keys(algo, [item])
        with pytest.raises(ConfigError) as full:
            build_config(algo, "Pendulum-v1" if algo == "sac" else None, sets=[item])
        assert str(early.value) == str(full.value)


def test_early_key_check_passes_valid_keys_and_sections() -> None:
    check_set_keys("ppo", ["ppo.lr=1e-3", "ppo.hidden=[8]", "seed=3", "env.mask_velocity=true",
                           "ray.address=auto"])


@pytest.mark.parametrize(("item", "fix"), [("env=Acrobot-v1", "--env ID"),
                                           ("algo=td3", "rlloop train ALGO"),
                                           ("dqn.lr=0.1", "--set ppo.KEY=VALUE")])
def test_a_set_item_that_would_be_dropped_or_switch_the_preset_is_refused(item, fix) -> None:
    """``--set env=X`` kept the first env's preset, ``--set algo=`` switched the algorithm
    under the first one's settings, and another algorithm's section was dropped unread."""
    with pytest.raises(ConfigError, match=re.escape(fix)):
        check_set_keys("ppo", [item])
    with pytest.raises(ConfigError, match=re.escape(fix)):
        build_config("ppo", "CartPole-v1", sets=[item])


def test_a_config_file_for_another_algorithm_is_refused(tmp_path) -> None:
    file = tmp_path / "sac.yaml"
    file.write_text("algo: sac\nsac:\n  lr: 0.001\n")
    with pytest.raises(ConfigError, match="is for sac, not ppo"):
        build_config("ppo", "Pendulum-v1", file=file)
    # `rlloop presets sac > p.yaml; rlloop train td3 --config p.yaml` (no algo: key):
    # the sac section was dropped unread and td3 trained on its own defaults
    file.write_text("env: Pendulum-v1\nsac:\n  lr: 0.005\n  batch_size: 64\n")
    with pytest.raises(ConfigError, match=r"has settings for sac, not td3, which this run "
                                          r"trains; train sac with it, or rename the section"):
        build_config("td3", "Pendulum-v1", file=file)
    assert build_config("sac", "Pendulum-v1", file=file).hparams.batch_size == 64


def test_every_config_class_and_build_config_import_without_torch() -> None:
    """The early checks read the config classes' fields and validate whole configs: that
    must not wait for torch's import."""
    probe = ("import sys\nfrom rlloop.config.registry import ALGORITHMS\n"
             "from rlloop.config.loading import config_layers, from_dict\n"
             "for name, entry in ALGORITHMS.items():\n"
             "    assert entry.config_cls.section == name, name\n"
             "    from_dict(config_layers(name, 'Pendulum-v1' if name in ('sac', 'td3') "
             "else None, sets=['num_env_runners=1'] if name in ('appo', 'impala') "
             "else None))\n"
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_registries_of_off_policy_parts_hold_the_names_configs_accept() -> None:
    import rlloop.algorithms.offpolicy_parts as parts
    from rlloop.config.offpolicy import PARTS, part_names

    for setting, (registry, builtin) in PARTS.items():
        assert sorted(getattr(parts, registry)) == sorted(builtin) == part_names(setting)


def _args(*, sets: list[str] | None = None, config: str | None = None,
          resume: Path | None = None):  # type: ignore[no-untyped-def]
    import argparse

    return argparse.Namespace(algo="ppo", env=None, sets=sets or [], resume=resume,
                              config=config)


def test_mlflow_child_is_prestarted_only_for_runs_that_log_to_mlflow(tmp_path):
    """The MLflow child (whose import overlaps torch's) is started when the run's mlflow
    setting, after every layer, is on: not for mlflow off in a config file or a saved run."""
    import subprocess as sp

    from rlloop.cli.main import _wants_mlflow

    off = tmp_path / "off.yaml"
    off.write_text("mlflow: false\n")
    on = tmp_path / "on.yaml"
    on.write_text("mlflow: true\nseed: 3\n")
    assert _wants_mlflow(_args())
    assert not _wants_mlflow(_args(sets=["mlflow = false"]))
    assert not _wants_mlflow(_args(config=str(off)))
    assert _wants_mlflow(_args(config=str(off), sets=["mlflow=true"]))
    assert _wants_mlflow(_args(config=str(on)))
    # a saved run without MLflow, resumed
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv: CartPole-v1\nmlflow: false\n")
    assert not _wants_mlflow(_args(resume=run))
    # input the run will refuse: the child is started as before (and killed at the end)
    assert _wants_mlflow(_args(config=str(tmp_path / "missing.yaml")))
    # and deciding never imports torch
    probe = ("import argparse, sys\nfrom rlloop.cli.main import _wants_mlflow\n"
             f"_wants_mlflow(argparse.Namespace(algo='ppo', env=None, sets=[], resume=None, "
             f"config={str(off)!r}))\nprint('torch' in sys.modules)")
    out = sp.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_mlflow_file_store_is_refused_before_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_in_process) -> None:
    """MLflow 3 refuses its ``file:`` store (unless MLFLOW_ALLOW_FILE_STORE=true) when the
    sink opens it, after training: the run trained, then lost every MLflow row with a
    warning. It is refused first, and nothing is written. (In process: the refusal, not
    the process, is checked.)"""
    from rlloop.logging.mlflow_store import file_store_refusal

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    store = f"file:{tmp_path / 'mlruns'}"
    out = cli_in_process(["train", "ppo", "--run-dir", "run", "--set", "total_env_steps=256",
                          "--set", f"mlflow_tracking_uri={store}"])
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"rlloop: error: mlflow_tracking_uri {store!r} is MLflow's file store"), out.stderr
    assert "MLFLOW_ALLOW_FILE_STORE=true" in out.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlruns").exists()
    # A bare path is the same store; database and server stores are not looked at.
    assert file_store_refusal(str(tmp_path / "mlruns")) is not None
    assert file_store_refusal("sqlite:///x.db") is None
    assert file_store_refusal("http://127.0.0.1:5000") is None


def test_a_tracking_uri_no_store_opens_is_refused_before_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_in_process) -> None:
    """``htpp://...`` trained the whole budget, then lost every MLflow row at close."""
    from rlloop.logging.mlflow_store import unknown_scheme_refusal

    monkeypatch.chdir(tmp_path)
    out = cli_in_process(["train", "ppo", "--run-dir", "run", "--set", "total_env_steps=256",
                          "--set", "mlflow_tracking_uri=htpp://localhost:5000"])
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        "rlloop: error: mlflow_tracking_uri 'htpp://localhost:5000' has the scheme 'htpp', "
        "which no MLflow tracking store opens"), out.stderr
    assert not (tmp_path / "run").exists()
    for taken in ("http://127.0.0.1:5000", "https://h", "sqlite:///x.db", "databricks",
                  "postgresql+psycopg2://u@h/db", "file:/tmp/m", "/tmp/m", "C:/m"):
        assert unknown_scheme_refusal(taken) is None, taken


def test_an_sqlite_store_that_cannot_be_made_is_refused_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sqlite:////proc/nope/db`` was taken at the start; the MLflow child failed to make
    it and the run's rows were lost at the end. It is refused first, and nothing is
    written."""
    from rlloop.cli.main import main
    from rlloop.logging.mlflow_store import sqlite_store_refusal

    if not Path("/proc").is_dir():
        pytest.skip("no /proc on this system")
    uri = "sqlite:////proc/nope/db"
    code = main(["train", "ppo", "--run-dir", str(tmp_path / "run"), "--quiet",
                 "--set", "total_env_steps=256", "--set", f"mlflow_tracking_uri={uri}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"rlloop: error: mlflow_tracking_uri {uri!r}: the database "
                               "cannot be created in /proc"), lines[0]
    assert not (tmp_path / "run").exists()
    (tmp_path / "a-file").write_text("")
    (tmp_path / "notes.txt").write_text("not a database")
    for refused, why in ((tmp_path, "names a directory"),
                         (tmp_path / "a-file" / "m.db", "a-file is a file"),
                         (tmp_path / "notes.txt", "is not an SQLite database")):
        assert why in (sqlite_store_refusal(f"sqlite:///{refused}") or ""), refused
    # A store that can be made (its folders too) or opened is taken, and nothing is left.
    for taken in (f"sqlite:///{tmp_path / 'new' / 'deeper' / 'm.db'}",
                  f"sqlite:///{tmp_path / 'a-file'}", "sqlite://", "sqlite:///:memory:",
                  "http://127.0.0.1:5000"):
        assert sqlite_store_refusal(taken) is None, taken
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "notes.txt"]


def test_an_mlflow_file_store_is_taken_when_the_user_opts_in(monkeypatch) -> None:
    from rlloop.logging.mlflow_store import file_store_refusal

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert file_store_refusal("file:/tmp/mlruns") is None


@pytest.mark.parametrize("args", [["export", "nothere", "--format", "onnx"],
                                  ["plot", "nothere", "-o", "x.png"]])
def test_export_and_plot_of_a_missing_run_answer_before_torch(tmp_path: Path,
                                                              cli_env: dict[str, str],
                                                              args: list[str]) -> None:
    """``export`` of a mistyped run blamed a ``-o`` never given, after importing torch."""
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 2, "torch": False}
    assert out.stderr.strip() == ("rlloop: error: nothere is not an rlloop run directory (no "
                                  "config.yaml); pass a directory made by `rlloop train`, e.g. "
                                  "runs/<run-name>")


@pytest.mark.parametrize(("video", "expected"), [
    ("clip.txt", "--video clip.txt: name an .mp4 file (e.g. clip.mp4)"),
    ("missing/clip.mp4", "--video missing/clip.mp4: the directory missing does not exist"),
    ("run/config.yaml", "--video run/config.yaml: name an .mp4 file"),
])
def test_eval_video_file_is_checked_before_the_evaluation(tmp_path: Path,
                                                          cli_env: dict[str, str],
                                                          video: str, expected: str) -> None:
    """A --video name ffmpeg cannot write failed after the evaluation, losing its result,
    with an 'unexpected' error."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("algo: ppo\n")
    out = subprocess.run([sys.executable, "-c", _PROBE, "eval", "run", "--video", video],
                         env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"code": 2, "torch": False}
    assert out.stderr.strip().startswith(f"rlloop: error: {expected}"), out.stderr


@pytest.mark.parametrize("algo", ["dqn", "sac", "td3"])
def test_rl8_cadence_settings_on_an_off_policy_run_name_its_own(algo: str) -> None:
    """``--set eval_every=1`` on SAC was accepted and ignored (one evaluation, at the end)."""
    env = "CartPole-v1" if algo == "dqn" else "Pendulum-v1"
    with pytest.raises(ConfigError, match=rf"^eval_every counts iterations of PPO's loop; "
                                          rf"{algo} counts optimisation steps: set "
                                          rf"{algo}.eval_interval instead"):
        build_config(algo, env, sets=["eval_every=1"])
    with pytest.raises(ConfigError, match=rf"set {algo}.save_interval instead"):
        build_config(algo, env, sets=["checkpoint_every=1"])
    build_config(algo, env, sets=[f"{algo}.eval_interval=7"])  # its own: fine


@pytest.mark.parametrize(("algo", "item", "hint"), [
    ("sac", "sac.learning_rate=1e-3", "Stable-Baselines3's learning_rate is sac.lr here"),
    ("sac", "sac.ent_coef=0.1",
     "Stable-Baselines3's ent_coef is sac.init_alpha / sac.autotune_alpha here"),
    ("sac", "sac.train_freq=4", "Stable-Baselines3's train_freq is sac.opt_interval here"),
    ("ppo", "ppo.n_steps=8", "Stable-Baselines3's n_steps is ppo.rollout_steps here"),
    ("ppo", "ppo.n_envs=2", "Stable-Baselines3's n_envs is num_envs here"),
    ("sac", "learning_rate=1e-3", "Stable-Baselines3's learning_rate is sac.lr here"),
    ("sac", "buffer_size=1000", "did you mean sac.buffer_size?"),
])
def test_stable_baselines3_names_point_at_rlloops(algo: str, item: str, hint: str) -> None:
    """SB3's names got difflib's guesses ("did you mean sac.learning_starts?" for
    learning_rate, sac.encoder for ent_coef) or none."""
    env = "Pendulum-v1"
    for check in (lambda: check_set_keys(algo, [item]),
                  lambda: build_config(algo, env, sets=[item])):
        with pytest.raises(ConfigError, match=re.escape(hint)):
            check()


@pytest.mark.parametrize("run_dir", ["proj", "."])
def test_a_run_dir_holding_other_files_is_refused_and_left_alone(
        tmp_path: Path, cli_env: dict[str, str], run_dir: str) -> None:
    """A directory with the user's own files was trained into: report.md replaced, best/
    emptied, rows appended to their metrics.jsonl."""
    proj = tmp_path / "proj"
    (proj / "best").mkdir(parents=True)
    (proj / "report.md").write_text("# my notes\n")
    (proj / "best" / "notes.txt").write_text("keep\n")
    cwd = proj if run_dir == "." else tmp_path
    result, stderr = _train(["ppo", "--run-dir", run_dir, "--total-env-steps", "300",
                             "--set", "mlflow=false", "--set", "save_video=false", "--quiet"],
                            cli_env, cwd)
    assert result["code"] == 2, stderr
    assert stderr.strip().splitlines() == [stderr.strip()]  # one line
    assert "holds report.md, best but no run: a new run would write over them" in stderr
    assert sorted(p.name for p in proj.rglob("*")) == ["best", "notes.txt", "report.md"]
    assert (proj / "report.md").read_text() == "# my notes\n"


def test_a_run_dir_holding_only_files_a_run_never_writes_is_taken(tmp_path: Path) -> None:
    """``rlloop train ... --run-dir run > run/train.log``: the shell makes the log first."""
    from rlloop.runs.run_dir import refuse_existing_run

    (tmp_path / "train.log").write_text("")
    (tmp_path / ".gitkeep").write_text("")
    refuse_existing_run(tmp_path, other_files=True)  # no error

