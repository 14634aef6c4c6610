"""A run directory written by rlloop 0.1.0 before the package redesign still loads, evaluates
and resumes: internal module paths changed, the run files and checkpoint format did not.

The fixture ``fixtures/runs/ppo-cartpole-0.1.0`` was written by that release with
``rlloop train ppo --env CartPole-v1 --seed 3 --total-env-steps 4096 --set mlflow=false
--set save_video=false`` (its figures and report left out to keep it small).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
from conftest import rlloop_cmd

import rlloop
from rlloop.runs.start import resume

OLD_RUN = Path(__file__).parents[1] / "fixtures" / "runs" / "ppo-cartpole-0.1.0"


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / "old-run"
    shutil.copytree(OLD_RUN, run)
    return run


def test_an_old_run_loads_and_predicts(tmp_path: Path) -> None:
    model = rlloop.load(_copy(tmp_path))
    actions = model.predict(np.zeros((3, 4), dtype=np.float32))
    assert actions.shape == (3,) and set(actions.tolist()) <= {0, 1}


def test_an_old_run_evaluates_from_the_cli(tmp_path: Path, cli_env: dict[str, str]) -> None:
    run = _copy(tmp_path)
    out = subprocess.run(rlloop_cmd("eval", str(run), "--episodes", "2", "--json"),
                         capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["episodes"] == 2


def test_an_old_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    run = _copy(tmp_path)
    result = resume(run, total_env_steps=8192, progress=False)
    assert result.env_steps == 8192
    steps = [json.loads(line)["step"] for line in
             (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 8192  # appended after the old rows
