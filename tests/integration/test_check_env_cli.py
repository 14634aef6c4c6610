"""``rlloop check-env ID`` as a user runs it: a line per finding, exit 1 on an error, 0 on
warnings alone or none, 2 for an id that cannot be made (issue 45, item 12)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import rlloop_cmd

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("env_id", "code", "line"), [
    ("CartPole-v1", 0, "CartPole-v1: no problems found"),
    ("checker_envs:CheckerGood-v0", 0, "checker_envs:CheckerGood-v0: no problems found"),
    ("checker_envs:CheckerOldStep-v0", 1, "error: step() must return (obs, reward, terminated, "
     "truncated, info), got a tuple of 4; split the old done flag"),
    ("checker_envs:CheckerNoRenderMode-v0", 0, "warning: the env takes no render_mode argument"),
    ("CartPol-v1", 2, "rlloop: error: cannot make 'CartPol-v1'"),
])
def test_check_env_command(env_id: str, code: int, line: str, cli_env, tmp_path) -> None:
    env = {**cli_env, "PYTHONPATH": f"{TESTS}{os.pathsep}{cli_env['PYTHONPATH']}"}
    out = subprocess.run(rlloop_cmd("check-env", env_id), env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stderr
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), lines
