"""Env-runner settings without Ray: validation, the --ray-address flag, YAML, resume rules,
and that a run without runners never imports Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlloop.config.loading import build_config, from_dict
from rlloop.config.run_config import resumable
from rlloop.errors import ConfigError
from rlloop.runners.fragments import FragmentSampler

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.parametrize(("sets", "message"), [
    (["num_env_runners=-1"], "num_env_runners must be >= 0"),
    (["max_weight_lag=-1"], "max_weight_lag must be >= 0"),
    (["max_restarts=-2"], "max_restarts must be >= 0"),
    (["num_envs_per_runner=0"], "num_envs_per_runner must be > 0"),
    (["ray.address=''"], "ray.address is empty"),
    (["ray.num_cpus_per_runner=-1"], "ray.num_cpus_per_runner must be >= 0"),
    (["ray.num_gpus_per_learner=-1"], "ray.num_gpus_per_learner must be >= 0"),
    (["ray.num_cpus=0"], "ray.num_cpus must be > 0"),
    (["ray.port=1"], "unknown config key 'ray.port'"),
    (["num_env_runners=2", "ppo.normalize_obs=true"], "normalize_obs is not supported"),
    (["num_env_runners=2", "fragment_steps=8"], "set that instead"),
])
def test_bad_runner_settings_are_refused_in_one_line(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        build_config("ppo", "CartPole-v1", sets=sets)
    assert "\n" not in str(info.value)


def test_ray_section_round_trips_through_yaml() -> None:
    config = build_config("sac", "Pendulum-v1", sets=[
        "num_env_runners=4", "ray.address=auto", "ray.dashboard=true", "fragment_steps=16"])
    assert (config.ray.address, config.ray.dashboard) == ("auto", True)
    data = yaml.safe_load(yaml.safe_dump(config.to_dict()))
    assert data["ray"] == {"address": "auto", "dashboard": True, "num_cpus_per_runner": 1.0,
                           "num_cpus": None, "learner_actors": True,
                           "num_cpus_per_learner": 1.0, "num_gpus_per_learner": None}
    again = from_dict(data)
    assert again.ray == config.ray and again.num_env_runners == 4
    assert again.fragment_steps == 16


def test_ray_address_flag_reaches_the_config(tmp_path: Path) -> None:
    from rlloop.cli.main import _parser

    args = _parser().parse_args(["train", "ppo", "--ray-address", "10.0.0.5:6379"])
    assert args.ray_address == "10.0.0.5:6379"
    # The CLI hands it on as the first --set item (JSON-quoted: a YAML scalar).
    config = build_config("ppo", sets=['ray.address="10.0.0.5:6379"'])
    assert config.ray.address == "10.0.0.5:6379"


def test_where_runners_run_may_change_on_resume_but_not_how_many() -> None:
    assert resumable("ray.address", "ppo") and resumable("max_restarts", "ppo")
    assert resumable("restart_failed_env_runners", "sac")
    assert not resumable("num_env_runners", "ppo")
    assert not resumable("num_envs_per_runner", "ppo")


def test_a_run_without_runners_never_imports_ray(tmp_path: Path) -> None:
    code = ("import sys; from rlloop.config.loading import build_config; "
            "from rlloop.runs.start import train; "
            "train(build_config('ppo', sets=['mlflow=false', 'progress=false', "
            "'save_video=false', 'total_env_steps=512', 'eval_episodes=1']), sys.argv[1]); "
            "loaded = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')); "
            "assert not loaded, loaded")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")],
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_fragment_sampler_sends_the_in_process_rollout() -> None:
    """In one process (no Ray), a runner's fragment is what its runner collected."""
    from rlloop.runs.build import build_algorithm

    config = build_config("ppo", sets=["num_envs=2", "ppo.rollout_steps=8",
                                       "ppo.minibatch_size=16", "mlflow=false"])
    algorithm = build_algorithm(config)
    try:
        frag = FragmentSampler(algorithm, 8).sample(0).tagged(3, 1, 7)
        assert frag.obs.shape == (8, 2, 4) and frag.steps == 16
        assert frag.log_probs is not None and frag.log_probs.le(0).all()
        assert (frag.weights_seq_no, frag.runner, frag.instance) == (3, 1, 7)
        assert frag.last_obs.equal(algorithm.runner.obs)
        assert frag.obs.equal(algorithm.buffer.obs)  # a copy of what the runner wrote
    finally:
        algorithm.close()


def test_weights_lag_counts_the_versions_published_since() -> None:
    # Importing the runners module needs Ray; the lag rule itself is plain arithmetic.
    pytest.importorskip("ray")
    from rlloop.runners.fragments import weights_lag

    published = [0, 1, 5, 9]  # weights_seq_no of each broadcast
    assert [weights_lag(published, s) for s in (9, 5, 1, 0)] == [0, 1, 2, 3]


def test_a_runner_builds_for_its_own_envs() -> None:
    """Runner configs: M envs, a seed of their own, no runners, a batch rule that fits M,
    the CPU."""
    pytest.importorskip("ray")
    from rlloop.runners.ray_actor import envs_per_runner, runner_config

    config = build_config("ppo", sets=["num_env_runners=4", "num_envs=16", "device=cuda",
                                       "ppo.rollout_steps=32", "ppo.minibatch_size=512"])
    assert envs_per_runner(config) == 4
    runners = [runner_config(config, i) for i in range(4)]
    assert {r.num_envs for r in runners} == {4}
    assert {r.num_env_runners for r in runners} == {0}
    assert len({r.seed for r in runners}) == 4
    # Runners reserve no GPU (Ray hides it from them): they act on the CPU.
    assert {r.device for r in runners} == {"cpu"}
    assert runners[0].hparams.minibatch_size == 128  # 32 steps x 4 envs
    sac = build_config("sac", "Pendulum-v1", sets=["num_env_runners=2"])
    assert runner_config(sac, 0).hparams.buffer_size == 256  # a batch, not a million
