"""A run directory is untrusted data: loading it never imports code it names, and resuming
it never writes through a symbolic link. Every fault here is planted for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import rlloop_cmd

from rlloop.cli.main import main
from rlloop.config.loading import build_config
from rlloop.errors import RunDirError
from rlloop.system.run_files import IN_PLACE, MEMBERS, check_members, open_append, write_file

QUIET = ["--quiet", "--set", "mlflow=false", "--set", "save_video=false"]


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rlloop_cmd(*args), env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A short finished PPO run (trained in this process), copied by each test that plants
    a link in it."""
    run = tmp_path_factory.mktemp("trained") / "run"
    code = main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run),
                 "--total-env-steps", "1024", "--set", "stop_on_solve=false", *QUIET,
                 "--set", "mlflow=true"])
    assert code == 0
    return run


@pytest.fixture
def cli(tmp_path, monkeypatch, cli_in_process):
    """``rlloop`` in this process, from ``tmp_path`` and with it on sys.path as ``python -m``
    puts the working directory there; a planted ``evilrun`` package imported by one test is
    forgotten, so that the next test's import runs its own payload."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield cli_in_process
    for name in [m for m in sys.modules if m == "evilrun" or m.startswith("evilrun.")]:
        del sys.modules[name]


def _plant_payload(tmp_path: Path, algo: str, env_id: str, trained: Path
                  ) -> tuple[Path, Path]:
    """``tmp_path/evilrun``: a copy of a trained run whose config names a payload module
    inside it; and the sentinel file the payload writes if it ever runs."""
    sentinel = tmp_path / "pwned"
    run = tmp_path / "evilrun"
    shutil.copytree(trained, run)
    (run / "payload.py").write_text(f"open({str(sentinel)!r}, 'w').write('ran')\n")
    config = build_config(algo, "CartPole-v1" if algo != "ma_ppo" else None).to_dict()
    config["env"] = env_id
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run, sentinel


CASES = [("ppo", "evilrun.payload:Evil-v0"), ("ma_ppo", "pettingzoo:evilrun.payload")]


@pytest.mark.parametrize(("algo", "env_id"), CASES)
@pytest.mark.parametrize("command", ["eval", "resume", "export"])
def test_loading_a_run_never_imports_the_module_it_names(tmp_path, cli, trained_run, algo,
                                                          env_id, command):
    _, sentinel = _plant_payload(tmp_path, algo, env_id, trained_run)
    # `python -m` puts the working directory on sys.path, so `evilrun.payload` is importable.
    args = {"eval": ["eval", "evilrun"], "resume": ["train", algo, "--resume", "evilrun"],
            "export": ["export", "evilrun", "--format", "torchscript"]}[command]
    out = cli(args)
    assert not sentinel.exists(), "the run directory's module was imported"
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlloop: error:"), out.stderr
    assert "evilrun.payload" in lines[0] and "--allow-import" in lines[0]

    # Saying so on the command line lets the module be imported (the user trusts it).
    cli([*args, "--allow-import"])
    assert sentinel.exists()


def test_plot_reads_a_run_without_importing_the_module_it_names(tmp_path, cli, trained_run):
    _, sentinel = _plant_payload(tmp_path, "ppo", "evilrun.payload:Evil-v0", trained_run)
    out = cli(["plot", "evilrun", "-o", "fig.png", "--metric", "episode/return_mean"])
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "fig.png").is_file() and not sentinel.exists()


def test_python_api_never_imports_the_module_a_run_names(tmp_path, cli_env, trained_run):
    _, sentinel = _plant_payload(tmp_path, "ppo", "evilrun.payload:Evil-v0", trained_run)
    script = textwrap.dedent("""
        from rlloop.errors import EnvError
        from rlloop.cli.export import export_run
        from rlloop.runs.saved import evaluate_run
        from rlloop.runs.start import resume
        from rlloop.runs.video import record_run_video
        for load in (lambda: evaluate_run("evilrun"), lambda: resume("evilrun"),
                     lambda: record_run_video("evilrun", "clip.mp4"),
                     lambda: export_run("evilrun", "torchscript")):
            try:
                load()
            except EnvError as e:
                assert "--allow-import" in str(e), e
            else:
                raise SystemExit("loaded")
    """)
    out = subprocess.run([sys.executable, "-c", script], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert not sentinel.exists()


@pytest.mark.parametrize("member", ["report.md", "summary.json", "learning_curves.png",
                                    "metrics.jsonl", "config.yaml", "run.json", "mlflow.db",
                                    "checkpoints", "best", ".lock"])
def test_resume_never_writes_through_a_symlinked_member(tmp_path, cli, trained_run, member):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run, symlinks=True)
    victim = tmp_path / "victim"
    if (run / member).is_dir():
        shutil.copytree(run / member, victim)
        shutil.rmtree(run / member)
    else:
        victim.write_bytes((run / member).read_bytes())
    before = {p.relative_to(victim): p.read_bytes() for p in victim.rglob("*") if p.is_file()} \
        if victim.is_dir() else victim.read_bytes()
    (run / member).unlink(missing_ok=True)
    (run / member).symlink_to(victim)

    out = cli(["train", "ppo", "--resume", str(run), "--total-env-steps", "2048", *QUIET])
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "symbolic link" in lines[0] and member in lines[0], out.stderr
    after = {p.relative_to(victim): p.read_bytes() for p in victim.rglob("*") if p.is_file()} \
        if victim.is_dir() else victim.read_bytes()
    assert after == before, "the link's target was changed"


def test_a_new_run_refuses_a_prepared_directory_with_links(tmp_path, cli):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (run / "metrics.jsonl").symlink_to(victim)
    out = cli(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run),
               "--total-env-steps", "512", *QUIET])
    assert out.returncode == 2 and "symbolic link" in out.stderr, out.stderr
    assert victim.read_text() == "precious"


def test_check_members_covers_every_member(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in MEMBERS:
        run = tmp_path / f"run-{name}"
        run.mkdir()
        (run / name).symlink_to(outside)
        with pytest.raises(RunDirError, match="symbolic link"):
            check_members(run)


@pytest.mark.parametrize("member", ["metrics.jsonl", "mlflow.db", ".lock"])
def test_resume_never_writes_in_place_through_a_hard_link(tmp_path, trained_run, member):
    from rlloop.runs.start import resume

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    other = tmp_path / "other"  # the file's other name, outside the run
    os.link(run / member, other)
    if member == ".lock":  # empty once released: content the PID write would replace
        other.write_text("precious\n")
    before = other.read_bytes()
    with pytest.raises(RunDirError, match=f"{member} has 2 hard links") as refused:
        resume(run, total_env_steps=2048)  # with its MLflow store, as it was trained
    assert "\n" not in str(refused.value) and "cp " in str(refused.value)
    assert other.read_bytes() == before, "the other link's file was changed"


def test_hard_links_are_refused_for_every_member_written_in_place(tmp_path):
    for name in IN_PLACE:
        run = tmp_path / f"run-{name}"
        run.mkdir()
        (run / name).write_bytes(b"")
        os.link(run / name, tmp_path / f"other-{name}")
        with pytest.raises(RunDirError, match="hard links"):
            check_members(run)
        with pytest.raises(RunDirError, match="hard links"):
            open_append(run / name).close()  # checked on the descriptor, as it is written


def test_write_file_replaces_a_link_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "report.md"
    link.symlink_to(victim)
    write_file(link, "# report")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "# report"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_open_append_refuses_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(victim)
    with pytest.raises(RunDirError, match="symbolic link"):
        open_append(link)
    assert victim.read_text() == "precious"


def test_links_below_the_artifacts_folder_are_refused_too(tmp_path):
    run = tmp_path / "run"
    (run / "artifacts" / "0").mkdir(parents=True)
    (run / "artifacts" / "0" / "artifacts").symlink_to(tmp_path)
    with pytest.raises(RunDirError, match="symbolic link"):
        check_members(run)


def _resume(run: Path, env: dict[str, str], cwd: Path, *extra: str
            ) -> subprocess.CompletedProcess[str]:
    return _run(["train", "ppo", "--resume", str(run), "--total-env-steps", "2048", *QUIET,
                 "--set", "mlflow=true", *extra], env, cwd)


def test_a_planted_figure_link_is_not_copied_into_the_mlflow_artifacts(tmp_path, cli_env,
                                                                       trained_run):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    secret = tmp_path / "secret.txt"
    secret.write_text("my private key")
    (run / "zz_leak.png").symlink_to(secret)
    out = _resume(run, cli_env, tmp_path)
    assert out.returncode == 0, out.stderr
    copies = [p for p in (run / "artifacts").rglob("*") if p.is_file()]
    assert any(p.name == "report.md" for p in copies)  # the run's own files were logged
    assert not [p for p in copies if p.read_bytes() == secret.read_bytes()]


def test_a_store_naming_artifact_paths_outside_the_run_writes_nothing_there(
        tmp_path, cli_env, trained_run):
    import sqlite3

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    victim = tmp_path / "victim"
    with sqlite3.connect(run / "mlflow.db") as db:
        db.execute("UPDATE runs SET artifact_uri = ?", (victim.as_uri(),))
    out = _resume(run, cli_env, tmp_path)
    assert out.returncode == 0, out.stderr  # the run goes on, without its MLflow store
    assert "outside the run's" in out.stderr and "move mlflow.db aside" in out.stderr
    assert not victim.exists()


@pytest.mark.parametrize(("key", "value"), [("mlflow_tracking_uri", "http://127.0.0.1:9"),
                                            ("ray.address", "127.0.0.1:9")])
def test_a_resume_contacts_no_server_its_run_directory_names(tmp_path, cli_env, trained_run,
                                                            key, value):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    out = _resume(run, cli_env, tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--set {key}={value}" in lines[0], out.stderr
    import rlloop

    with pytest.raises(ValueError) as refused:
        rlloop.load(run).learn(1000)
    assert f"{run} sets {key}=" in str(refused.value)


def test_a_loaded_run_profiles_only_when_asked_again(tmp_path, trained_run):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["profile"] = {"wait": 0, "warmup": 0, "active": 1}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    import rlloop

    rlloop.load(run, mlflow=False).learn(1000)
    assert not (run / "profile").exists()


def test_saving_a_model_refuses_a_run_holding_a_link(tmp_path, trained_run):
    import rlloop

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    secret = tmp_path / "secret.txt"
    secret.write_text("my private key")
    (run / "notes.txt").symlink_to(secret)
    with pytest.raises(RunDirError, match=r"notes\.txt is a symbolic link"):
        rlloop.load(run).save(tmp_path / "saved")
    assert not (tmp_path / "saved" / "notes.txt").exists()


def test_a_new_mlflow_store_is_never_written_through_a_guessable_name(tmp_path):
    from rlloop.logging.mlflow_store import _seed_from_template

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / f".mlflow.db.{os.getpid()}.tmp").symlink_to(victim)
    _seed_from_template(tmp_path / "mlflow.db")
    assert victim.read_text() == "precious"
