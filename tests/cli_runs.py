"""Short ``rlloop train`` runs that several algorithms' tests make the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

QUIET = ["mlflow=false", "progress=false", "save_video=false"]


def _sets(settings: tuple[str, ...] | list[str]) -> list[str]:
    return [arg for s in settings for arg in ("--set", s)]


def train_then_load(cli_in_process: Callable[[list[str]], Any], run: Path, algo: str,
                    env_id: str, env_steps: int, *settings: str) -> Any:
    """``rlloop train ALGO`` for ``env_steps`` (no MLflow, no video), then the run loaded
    into the Python API with ``rlloop.load``."""
    from rlloop import load

    out = cli_in_process(["train", algo, "--env", env_id, "--run-dir", str(run),
                          "--total-env-steps", str(env_steps), "--quiet",
                          *_sets(["mlflow=false", "save_video=false", *settings])])
    assert out.returncode == 0, out.stderr
    return load(run)


def failed_runner_error(algo: str, run: Path, capsys: pytest.CaptureFixture[str],
                        *settings: str) -> str:
    """The one line on stderr of ``rlloop train ALGO`` whose one env runner raises at its
    21st step, without restarts; checks that it names the step's error and the fix."""
    from rlloop.cli.main import main

    code = main(["train", algo, "--env", "raising_env:RaisingCartPole-v0", "--run-dir",
                 str(run), "--quiet", *_sets(["env_kwargs.after=20", "num_env_runners=1",
                                              "restart_failed_env_runners=false",
                                              "num_envs=2", *settings, *QUIET])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "raised RuntimeError in step(): simulated bug at step 21" in err[0]
    assert err[0].endswith("set restart_failed_env_runners=true to restart it")
    return err[0]
