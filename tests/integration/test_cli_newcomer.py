"""What a new user trips on at the command line (issue 45): help texts, missing extras named
before anything is written, refusals before torch's import, algorithm names in any case,
a progress target the run really reaches."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import env_without, rlloop_cmd

from rlloop.cli.arguments import build_parser
from rlloop.config.registry import ALGORITHMS

_PROBE = """
import json, sys
from rlloop.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def _probe(args: list[str], env: dict[str, str], cwd: Path) -> tuple[dict[str, object], str]:
    """Run the CLI in a fresh process: its exit code, whether torch was imported, stderr."""
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_argument_of_every_subcommand_has_help_text() -> None:
    missing = [f"{name} {action.dest}" for name, parser in _subcommands().items()
               for action in parser._actions
               if not isinstance(action, argparse._HelpAction) and not action.help]
    assert missing == []


@pytest.mark.parametrize("command", ["train", "eval", "tune"])
def test_help_shows_examples_and_where_the_set_keys_are_listed(command: str) -> None:
    text = _subcommands()[command].format_help()
    assert "examples:" in text
    assert re.search(rf"^  rlloop {command} ", text, re.MULTILINE)
    if command != "eval":
        assert "rlloop presets ALGO --env ID" in " ".join(text.split())


def test_tune_without_optuna_names_the_extra_and_writes_nothing(tmp_path: Path) -> None:
    study = tmp_path / "study"
    out = subprocess.run(rlloop_cmd("tune", "ppo", "--env", "CartPole-v1", "--trials", "1",
                                    "--run-dir", str(study)),
                         env=env_without("optuna", tmp_path), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "rlloop: error: rlloop tune needs Optuna, which is not installed: "
        "pip install 'rlloop[tune]'"]
    assert not study.exists()


@pytest.mark.parametrize(("package", "args", "line"), [
    ("wandb", ["--set", "wandb=true"], "wandb=true needs wandb, which is not installed: "
     "pip install 'rlloop[wandb]'"),
    ("tensorboard", ["--set", "tensorboard=true"], "tensorboard=true needs TensorBoard, "
     "which is not installed: pip install 'rlloop[tensorboard]'"),
    ("ray", ["--set", "num_env_runners=1"], "num_env_runners=1 needs Ray, which is not "
     "installed: pip install 'rlloop[ray]'"),
])
def test_train_without_an_optional_package_names_its_extra_before_torch(
        tmp_path: Path, package: str, args: list[str], line: str) -> None:
    run = tmp_path / "run"
    result, err = _probe(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run),
                          *args], env_without(package, tmp_path), tmp_path)
    assert result == {"code": 2, "torch": False}, err
    assert err.strip().splitlines() == [f"rlloop: error: {line}"]
    assert not run.exists()


def test_a_wrong_action_space_is_refused_before_torch(tmp_path: Path,
                                                      cli_env: dict[str, str]) -> None:
    result, err = _probe(["train", "dqn", "--env", "Pendulum-v1", "--run-dir",
                          str(tmp_path / "run")], cli_env, tmp_path)
    assert result == {"code": 2, "torch": False}, err
    assert err.strip().splitlines() == [
        "rlloop: error: dqn needs discrete actions but Pendulum-v1 has continuous ones; "
        "use ppo, a2c, sac or td3 for this env"]


@pytest.mark.parametrize("command", ["eval", "export"])
def test_a_run_naming_a_module_is_refused_before_torch_without_allow_import(
        tmp_path: Path, command: str, cli_env: dict[str, str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv: newcomer_envs:Foo-v0\n")
    extra = ["--format", "onnx"] if command == "export" else []
    result, err = _probe([command, str(run), *extra], cli_env, tmp_path)
    assert result == {"code": 2, "torch": False}, err
    line, = err.strip().splitlines()
    assert "would import module 'newcomer_envs'" in line and "--allow-import" in line


def test_algorithm_names_are_taken_in_any_case_and_trpo_says_it_is_not_offered(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    env = cli_env
    # PPO is accepted: the refusal is the env id's, which is checked after the algorithm.
    result, err = _probe(["train", "PPO", "--env", "CartPol-v1"], env, tmp_path)
    assert result == {"code": 2, "torch": False}
    assert "unknown env id 'CartPol-v1'" in err
    result, err = _probe(["train", "trpo"], env, tmp_path)
    assert result == {"code": 2, "torch": False}
    names = sorted(ALGORITHMS)  # every algorithm rlloop has, whatever is added later
    assert err.strip().splitlines() == [
        f"rlloop: error: unknown algorithm 'trpo'; choose one of {names}; "
        "TRPO is not offered yet: use ppo"]


def test_the_progress_line_targets_the_steps_the_run_trains_and_prints_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_in_process) -> None:
    """PPO rounds the budget up to whole rollouts: the line showed 5,120/5,000."""
    monkeypatch.chdir(tmp_path)
    out = cli_in_process(["train", "ppo", "--env", "CartPole-v1", "--total-env-steps", "600",
                          "--num-envs", "4", "--set", "ppo.rollout_steps=64", "--set",
                          "mlflow=false", "--set", "stop_on_solve=false", "--run-dir",
                          str(tmp_path / "run")])
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("steps ")]
    assert lines[-1].startswith("steps 768/768 (100%)"), lines
    assert len([ln for ln in lines if ln.startswith("steps 768/")]) == 1, lines
    assert "env steps: 768" in out.stdout
