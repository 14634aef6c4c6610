"""Every tensor rlloop makes names its device: a user's ``torch.set_default_device`` set
before rlloop is imported does not move rlloop's tensors (issue 45, item 10).

Each case trains in a fresh interpreter, because what is tested is the state rlloop makes
at import time under the user's default device ("meta": any tensor that lands there fails
at its first read).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_TRAIN_UNDER_META = """
import json, sys, torch
torch.set_default_device("meta")
from pathlib import Path
from rlloop.config.loading import build_config
from rlloop.runs.start import train
algo, env, run = sys.argv[1], sys.argv[2], Path(sys.argv[3])
sets = ["mlflow=false", "progress=false", "save_video=false", "device=cpu", "num_envs=1",
        "eval_episodes=1", *sys.argv[4:]]
result = train(build_config(algo, env, flags={"total_env_steps": 64}, sets=sets), run)
print(json.dumps({"steps": result.env_steps, "stats": result.last_stats}))
"""

_OFF_POLICY = ["batch_size=8", "learning_starts=16", "buffer_size=256", "hidden=[8,8]",
               "opt_interval=1"]


@pytest.mark.parametrize(("algo", "env", "sets"), [
    ("ppo", "CartPole-v1", ["ppo.rollout_steps=32", "ppo.minibatch_size=32", "ppo.hidden=[8]"]),
    ("dqn", "CartPole-v1", [f"dqn.{s}" for s in _OFF_POLICY]),
    ("sac", "Pendulum-v1", [f"sac.{s}" for s in _OFF_POLICY]),
    ("td3", "Pendulum-v1", [f"td3.{s}" for s in _OFF_POLICY]),
])
def test_trains_on_cpu_under_a_meta_default_device(algo: str, env: str, sets: list[str],
                                                   tmp_path: Path, cli_env) -> None:
    out = subprocess.run([sys.executable, "-c", _TRAIN_UNDER_META, algo, env,
                          str(tmp_path / "run"), *sets], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] >= 64
    assert result["stats"]["algorithm/steps"] > 0  # the learner updated, not only collected
