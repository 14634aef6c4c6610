"""Every tensor rlloop makes names its device: a user's ``torch.set_default_device`` set
before rlloop is imported does not move rlloop's tensors (issue 45, item 10).

The cases train in a fresh interpreter, because what is tested is the state rlloop makes
at import time under the user's default device ("meta": any tensor that lands there fails
at its first read).
"""

from __future__ import annotations

import json
import os
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
runs = Path(sys.argv[1])
for algo, env, sets in json.loads(sys.argv[2]):
    sets = ["mlflow=false", "progress=false", "save_video=false", "device=cpu", "num_envs=1",
            "eval_episodes=1", *sets]
    try:
        result = train(build_config(algo, env, flags={"total_env_steps": 64}, sets=sets),
                       runs / algo)
        line = {"steps": result.env_steps, "stats": result.last_stats}
    except Exception as error:  # the other cases still train
        line = {"error": f"{type(error).__name__}: {error}"}
    print(json.dumps({algo: line}), flush=True)
"""

_OFF_POLICY = ["batch_size=8", "learning_starts=16", "buffer_size=256", "hidden=[8,8]",
               "opt_interval=1"]
CASES = [
    ("ppo", "CartPole-v1", ["ppo.rollout_steps=32", "ppo.minibatch_size=32", "ppo.hidden=[8]"]),
    ("dqn", "CartPole-v1", [f"dqn.{s}" for s in _OFF_POLICY]),
    ("sac", "Pendulum-v1", [f"sac.{s}" for s in _OFF_POLICY]),
    ("td3", "Pendulum-v1", [f"td3.{s}" for s in _OFF_POLICY]),
    ("crossq", "Pendulum-v1", [f"crossq.{s}" for s in _OFF_POLICY] + ["crossq.critic_hidden=[8]"]),
]


@pytest.fixture(scope="module")
def meta_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict], str]:
    """Every case trained one after another in one fresh interpreter whose default device
    was set before rlloop was imported (one interpreter start, not one per case: the
    default device stays "meta" throughout, so each algorithm's modules, imported when it
    is built, and its run make their tensors under it)."""
    runs = tmp_path_factory.mktemp("meta")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _TRAIN_UNDER_META, str(runs),
                          json.dumps(CASES)], env=env, cwd=runs, capture_output=True,
                         text=True, timeout=240)
    results: dict[str, dict] = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            results.update(json.loads(line))
    return results, out.stderr[-2000:]


@pytest.mark.parametrize("algo", [case[0] for case in CASES])
def test_trains_on_cpu_under_a_meta_default_device(
        algo: str, meta_runs: tuple[dict[str, dict], str]) -> None:
    results, stderr = meta_runs
    assert algo in results, stderr  # the interpreter died before this case ended
    result = results[algo]
    assert "error" not in result, result["error"]
    assert result["steps"] >= 64
    assert result["stats"]["algorithm/steps"] > 0  # the learner updated, not only collected
