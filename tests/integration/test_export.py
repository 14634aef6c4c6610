"""``rlloop export``: the ONNX file run in onnxruntime and the TorchScript file run in a
fresh process act exactly as the run's policy does under ``rlloop eval``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from small_runs import train_ppo, train_sac

from rlloop.algorithms import AlgorithmBase
from rlloop.cli.main import main
from rlloop.config.loading import build_config
from rlloop.runs.saved import load_run_policy
from rlloop.runs.start import train

LOAD_TORCHSCRIPT = """
import sys, torch
policy = torch.jit.load(sys.argv[1])
torch.save(policy(torch.load(sys.argv[2])), sys.argv[3])
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    return {"ppo": train_ppo(base / "ppo"), "sac": train_sac(base / "sac")}


def _observations(algorithm: AlgorithmBase) -> torch.Tensor:
    """Raw observations around and well outside the training range, so the normaliser's
    mean, scale and clip all matter."""
    gen = torch.Generator().manual_seed(0)
    shape = algorithm.settings.spec.obs_shape
    return torch.randn(256, *shape, generator=gen) * 3.0


def _eval_actions(algorithm: AlgorithmBase, obs: torch.Tensor) -> torch.Tensor:
    """What `rlloop eval` does to a raw observation: its eval env normalises, then act."""
    stats = algorithm.obs_stats
    return algorithm.act(stats.normalize(obs) if stats else obs, deterministic=True)


def _observations_and_eval_actions(run: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Observations and the actions the run's eval policy takes on them."""
    algorithm = load_run_policy(run, device="cpu")
    try:
        obs = _observations(algorithm)
        return obs, _eval_actions(algorithm, obs)
    finally:
        algorithm.close()


def _compare(algo: str, got: np.ndarray, want: torch.Tensor) -> None:
    assert got.shape == tuple(want.shape)
    if algo in ("ppo", "qrdqn"):  # discrete: the very same actions
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want.numpy())
    else:
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def _export(run, fmt, cli_in_process):
    out = cli_in_process(["export", str(run), "--format", fmt])
    assert out.returncode == 0, out.stderr
    return run / ("policy.onnx" if fmt == "onnx" else "policy.pt")


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_onnx_export_runs_in_onnxruntime_with_the_eval_actions(runs, algo, cli_in_process):
    import onnxruntime

    path = _export(runs[algo], "onnx", cli_in_process)
    obs, want = _observations_and_eval_actions(runs[algo])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["action"], {"obs": obs.numpy()})
    _compare(algo, got, want)
    (one,) = session.run(["action"], {"obs": obs[:1].numpy()})  # the batch size is free
    _compare(algo, one, want[:1])


#: 250 env steps of each algorithm that rides on DQN's or SAC's parts, learning from step 50
QUANTILE_AND_CROSSQ = {
    "qrdqn": ("CartPole-v1", ["qrdqn.hidden=[32,32]", "qrdqn.n_quantiles=5"]),
    "tqc": ("Pendulum-v1", ["tqc.hidden=[32,32]"]),
    "crossq": ("Pendulum-v1", []),
}


@pytest.mark.parametrize("algo", sorted(QUANTILE_AND_CROSSQ))
def test_quantile_and_crossq_policies_export_to_onnx_with_the_eval_actions(
        algo, tmp_path, cli_in_process):
    import onnxruntime

    env, sets = QUANTILE_AND_CROSSQ[algo]
    run = tmp_path / algo
    small = [f"{algo}.learning_starts=50", f"{algo}.batch_size=16", f"{algo}.buffer_size=1000"]
    train(build_config(algo, env, flags={"total_env_steps": 250},
                       sets=["mlflow=false", "progress=false", "save_video=false",
                             "num_envs=1", "eval_episodes=2", *small, *sets]), run)
    path = _export(run, "onnx", cli_in_process)
    obs, want = _observations_and_eval_actions(run)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["action"], {"obs": obs.numpy()})
    _compare(algo, got, want)


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_torchscript_export_loads_in_a_fresh_process_with_the_eval_actions(
        runs, algo, tmp_path, cli_in_process):
    path = _export(runs[algo], "torchscript", cli_in_process)
    obs, want = _observations_and_eval_actions(runs[algo])
    torch.save(obs, tmp_path / "obs.pt")
    # A bare interpreter (no rlloop on the path): the file must stand on its own.
    out = subprocess.run([sys.executable, "-c", LOAD_TORCHSCRIPT, str(path),
                          str(tmp_path / "obs.pt"), str(tmp_path / "actions.pt")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    _compare(algo, torch.load(tmp_path / "actions.pt").numpy(), want)


def test_the_export_includes_the_observation_normaliser(runs, tmp_path):
    from rlloop.cli.export import export_run

    algorithm = load_run_policy(runs["ppo"], device="cpu")
    try:
        assert algorithm.obs_stats is not None
        obs = _observations(algorithm)
        want = _eval_actions(algorithm, obs)
        unnormalised = algorithm.act(obs, deterministic=True)
    finally:
        algorithm.close()
    assert not torch.equal(want, unnormalised)  # else this test could not tell
    path = export_run(runs["ppo"], "torchscript", tmp_path / "p.pt")
    assert torch.equal(torch.jit.load(str(path))(obs), want)


def test_export_replaces_a_linked_output_instead_of_writing_through_it(runs, tmp_path):
    from rlloop.cli.export import export_run

    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "policy.onnx"
    link.symlink_to(victim)
    export_run(runs["sac"], "onnx", link)
    assert victim.read_text() == "keep"
    assert not link.is_symlink() and link.stat().st_size > 1000


def test_export_refuses_an_output_over_the_runs_own_files(runs):
    """``-o <run>/config.yaml`` wrote ONNX bytes over the run's config: the run was gone."""
    from rlloop.cli.export import export_run
    from rlloop.errors import RunDirError

    config = (runs["sac"] / "config.yaml").read_bytes()
    for out in (runs["sac"] / "config.yaml", runs["sac"] / "best" / "manifest.json"):
        with pytest.raises(RunDirError, match="would overwrite"):
            export_run(runs["sac"], "onnx", out)
    assert (runs["sac"] / "config.yaml").read_bytes() == config
    # nor another run's own files: every run directory the output lies in is protected
    ppo_config = (runs["ppo"] / "config.yaml").read_bytes()
    for out in (runs["ppo"] / "config.yaml", runs["ppo"] / "metrics.jsonl"):
        with pytest.raises(RunDirError, match=rf"would overwrite {runs['ppo']}'s own"):
            export_run(runs["sac"], "onnx", out)
    assert (runs["ppo"] / "config.yaml").read_bytes() == ppo_config


def test_export_refuses_an_unknown_format_and_a_directory_that_is_not_a_run(runs, tmp_path,
                                                                            cli_in_process):
    for args in (["export", str(runs["ppo"]), "--format", "tflite"],
                 ["export", str(tmp_path), "--format", "onnx"]):
        out = cli_in_process(args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("rlloop: error:")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_the_filesystem_refuses_is_one_line_exit_2(runs, capsys):
    """``-o /proc/x.onnx`` passed the output checks (its directory exists), then creating
    the temporary file failed: FileNotFoundError, exit 1, "unexpected"."""
    code = main(["export", str(runs["ppo"]), "--format", "onnx", "-o", "/proc/x.onnx"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("rlloop: error: -o /proc/x.onnx cannot be written ("), err
    assert err[0].endswith("write the export to a directory that takes files"), err


LOAD_RECURRENT_TORCHSCRIPT = """
import sys, torch
policy = torch.jit.load(sys.argv[1])
obs = torch.load(sys.argv[2])
state = torch.zeros(obs.shape[1], int(sys.argv[4]))
actions = []
for o in obs:
    action, state = policy(o, state)
    actions.append(action)
torch.save(torch.stack(actions), sys.argv[3])
"""


@pytest.fixture(scope="module")
def recurrent_run(tmp_path_factory):
    from rlloop.config.loading import build_config
    from rlloop.runs.start import train

    run = tmp_path_factory.mktemp("export-recurrent") / "run"
    train(build_config("ppo", "CartPole-v1", flags={"total_env_steps": 320}, sets=[
        "mlflow=false", "progress=false", "save_video=false", "num_envs=4",
        "env.mask_velocity=true", "ppo.recurrent=lstm", "ppo.recurrent_hidden=16",
        "ppo.hidden=[16]", "ppo.rollout_steps=40", "ppo.seq_len=8", "ppo.minibatch_size=40",
        "ppo.normalize_obs=true"]), run)
    return run


def _recurrent_eval_actions(run: Path) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A sequence of raw observations ``[T, B, 2]``, the actions the run's eval policy
    takes on them in turn (its memory carried from step to step), and the state width."""
    algorithm = load_run_policy(run, device="cpu")
    try:
        gen = torch.Generator().manual_seed(0)
        obs = torch.randn(12, 3, 2, generator=gen) * 2.0
        algorithm.begin_episodes(torch.ones(3, dtype=torch.bool))
        stats = algorithm.obs_stats
        assert stats is not None
        actions = torch.stack([algorithm.act(stats.normalize(o)) for o in obs])
        return obs, actions, algorithm.policy.state_size
    finally:
        algorithm.close()


def test_a_recurrent_policy_exports_with_its_state_as_input_and_output(
        recurrent_run, tmp_path, cli_in_process):
    import onnxruntime

    obs, want, size = _recurrent_eval_actions(recurrent_run)
    path = _export(recurrent_run, "onnx", cli_in_process)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["obs", "state"]
    zeros = np.zeros((3, size), dtype=np.float32)
    state, got, forgetful = zeros, [], []
    for o in obs:
        action, state = session.run(["action", "next_state"], {"obs": o.numpy(), "state": state})
        got.append(action)
        forgetful.append(session.run(["action"], {"obs": o.numpy(), "state": zeros})[0])
    np.testing.assert_array_equal(np.stack(got), want.numpy())
    # the memory is what carries the actions: without it some of them differ
    assert not np.array_equal(np.stack(forgetful), want.numpy())

    path = _export(recurrent_run, "torchscript", cli_in_process)
    torch.save(obs, tmp_path / "obs.pt")
    out = subprocess.run([sys.executable, "-c", LOAD_RECURRENT_TORCHSCRIPT, str(path),
                          str(tmp_path / "obs.pt"), str(tmp_path / "actions.pt"), str(size)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(torch.load(tmp_path / "actions.pt").numpy(), want.numpy())
