"""``num_learners=2``: real gloo process groups on 127.0.0.1, one rank in this process and
one spawned, as a run makes them. No mocks: what is checked is what the group computes."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch
from conftest import rlloop_cmd
from learner_cases import ppo_update_case
from proc_utils import live_children

from rlloop.algorithms.distributed import build_rank_learner
from rlloop.algorithms.sac import SACLearner, SACModule
from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.cli.main import main
from rlloop.config.loading import build_config
from rlloop.config.offpolicy import SACConfig
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Box, Discrete, EnvSpec
from rlloop.learners.distributed import DataParallel
from rlloop.learners.learner import DEFAULT_MODULE_ID
from rlloop.learners.learner_group import LearnerSpec, start_group
from rlloop.runs.start import resume, train
from rlloop.system.devices import new_generator

CPU = torch.device("cpu")
QUIET = ["mlflow=false", "progress=false", "save_video=false", "stop_on_solve=false"]


def _rank0(config, env_spec, module, generator=None, timeout_s=300.0) -> DataParallel:
    spec = LearnerSpec(build_rank_learner, config, env_spec, "cpu", "skip", 0, 1, timeout_s)
    group, link, _ = start_group(spec, 2, CPU)
    learner = build_rank_learner(spec, group, CPU, link, module, generator)
    learner.broadcast_state()
    return learner


def _assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


def _assert_ranks_equal(learner: DataParallel) -> None:
    mine = learner.get_state(components="module")["module"][DEFAULT_MODULE_ID]
    theirs = learner.state_of_rank(1)["module"][DEFAULT_MODULE_ID]
    for k in mine:
        assert torch.equal(mine[k], theirs[k]), k


def test_two_ppo_learners_make_one_learners_update():
    """Advantages standardised over the whole minibatch, global-norm clipping on the reduced
    gradient, 2 epochs of 2 uneven minibatches (75 rows: shards of 18/19 rows), stats reduced."""
    case = ppo_update_case(clip_vf=0.2)
    cfg, module, one, batch, kwargs, expected = (case.cfg, case.module, case.one, case.batch,
                                                 case.kwargs, case.expected)
    two = _rank0(cfg, EnvSpec("t", (4,), Discrete(2)), module)
    try:
        # The rendezvous and gloo listen and connect on 127.0.0.1 only.
        assert two.link is not None
        procs = [psutil.Process(), *(psutil.Process(m.pid) for m in two.link.members)]
        conns = [c for p in procs for c in p.net_connections("inet")]
        assert any(c.status == psutil.CONN_LISTEN for c in conns)
        assert {c.laddr.ip.removeprefix("::ffff:") for c in conns} == {"127.0.0.1"}
        got = two.update_from_batch({DEFAULT_MODULE_ID: batch}, stop=lambda s: False,
                                    generator=torch.Generator().manual_seed(5), **kwargs)
        _assert_close(two.modules.state_dict(), one.modules.state_dict(), atol=1e-6)
        for key in ("losses/policy", "losses/value", "ppo/approx_kl", "losses/total",
                    "default_policy/gradients_default_global_norm"):
            assert got[key] == pytest.approx(expected[key], rel=1e-5), key
        _assert_ranks_equal(two)
        # Every rank restores: a state set on rank 0 reaches rank 1.
        two.set_state(one.get_state())
        _assert_close(two.modules.state_dict(), one.modules.state_dict(), atol=0)
        _assert_ranks_equal(two)
    finally:
        two.close()
    assert not live_children()


def test_two_sac_learners_make_one_learners_update():
    """Three updates on 15-row batches (shards of 7/8 rows): critics, Polyak targets, actor,
    alpha and Adam moments stay within float rounding of one learner's. The first comes
    after a pause longer than a collective may wait (a slow env's warm-up): rank 1 waits
    for commands without that deadline."""
    torch.manual_seed(0)
    cfg = SACConfig(hidden=[32, 32], batch_size=15)
    module = SACModule(3, 1, cfg)
    one = SACLearner({DEFAULT_MODULE_ID: copy.deepcopy(module)}, cfg, -1.0,
                     new_generator(CPU, 7))
    two = _rank0(cfg, EnvSpec("p", (3,), Box((-2.0,), (2.0,), (1,))), module,
                 new_generator(CPU, 7), timeout_s=6.0)
    g = torch.Generator().manual_seed(2)
    try:
        time.sleep(8.0)
        for _ in range(3):
            n = 15
            batch = Transitions(torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g),
                                torch.randn(n, generator=g), torch.randn(n, 3, generator=g),
                                torch.rand(n, generator=g) < 0.2, torch.full((n,), 0.99))
            expected = one.update(batch)
            got = two.update(batch)
            for key in ("losses/critic", "losses/actor", "losses/alpha", "q/mean"):
                torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)
        _assert_close(two.modules.state_dict(), one.modules.state_dict(), atol=1e-6)
        _assert_ranks_equal(two)
    finally:
        two.close()
    assert not live_children()


def _ppo_config(steps: int, *extra: str):
    return build_config("ppo", "CartPole-v1", flags={"seed": 1, "total_env_steps": steps},
                        sets=[*QUIET, "num_learners=2", "num_envs=4", "ppo.rollout_steps=32",
                              "ppo.minibatch_size=64", "checkpoint_every=2",
                              "keep_checkpoints=10", "eval_every=0", "eval_episodes=2",
                              *extra])


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).components["algorithm"]["learner"]["module"][DEFAULT_MODULE_ID]


def test_checkpoint_and_exact_resume_with_two_learners(tmp_path):
    """1024 env steps straight, or the same run's checkpoint at 512 resumed in a new group to
    1024: bit-identical weights (rank 0 wrote the checkpoint; rank 1 restored it)."""
    straight = tmp_path / "straight"
    train(_ppo_config(1024), straight)
    half = tmp_path / "half"
    shutil.copytree(straight, half)
    for ckpt in (half / "checkpoints").iterdir():
        if ckpt.name.isdigit() and int(ckpt.name) > 512:
            shutil.rmtree(ckpt)
    assert int(CheckpointManager(half / "checkpoints").latest().name) == 512
    resume(half, total_env_steps=1024)
    a = _weights(CheckpointManager(straight / "checkpoints").latest())
    b = _weights(CheckpointManager(half / "checkpoints").latest())
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not live_children()


def _tagged_processes(tag: str) -> list[int]:
    """Pids of live processes whose environment carries ``tag`` (a run's whole tree,
    orphans included)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RLLOOP_TEST_TAG") == tag and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def _train_and_kill(tmp_path: Path, cli_env: dict[str, str], *sets: str):
    env = {**cli_env, "RLLOOP_TEST_TAG": uuid.uuid4().hex,
           "RLLOOP_TEST_KILL_MARKER": str(tmp_path / "killed"),
           "PYTHONPATH": str(Path(__file__).parents[1]) + os.pathsep + cli_env["PYTHONPATH"]}
    args = ["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "run"),
            "--total-env-steps", "1536", "--callback", "learner_killer:KillLearnerRank"]
    for item in (*QUIET, "num_learners=2", "num_envs=4", "ppo.rollout_steps=64",
                 "ppo.minibatch_size=64", "checkpoint_every=2", "eval_every=0",
                 "eval_episodes=2", *sets):
        args += ["--set", item]
    out = subprocess.run(rlloop_cmd(*args), env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=240)
    assert (tmp_path / "killed").is_file(), out.stderr  # the rank was killed mid-training
    return out, env["RLLOOP_TEST_TAG"]


def test_killed_learner_rank_stops_the_run_cleanly(tmp_path, cli_env):
    out, tag = _train_and_kill(tmp_path, cli_env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("rlloop: error: learner rank 1 (pid ") and "SIGKILL" in lines[0]
    assert not _tagged_processes(tag)  # no learner rank, no gloo peer left behind
    # The newest checkpoint is one written before the failure: resumable.
    latest = CheckpointManager(tmp_path / "run" / "checkpoints").latest()
    assert load_checkpoint(latest).components["trainer"]["counters"]["env/steps"] <= 512


def test_killed_learner_rank_restarts_from_the_newest_checkpoint(tmp_path, cli_env):
    out, tag = _train_and_kill(tmp_path, cli_env, "max_learner_restarts=1")
    assert out.returncode == 0, out.stderr
    assert "restarting the learners from the newest checkpoint" in out.stderr
    latest = CheckpointManager(tmp_path / "run" / "checkpoints").latest()
    assert load_checkpoint(latest).components["trainer"]["counters"]["env/steps"] == 1536
    assert not _tagged_processes(tag)


@pytest.mark.parametrize(("args", "message"), [
    (["ppo", "--env", "CartPole-v1", "--set", "num_learners=0"],
     "num_learners must be >= 1, got 0"),
    (["dqn", "--env", "CartPole-v1", "--set", "num_learners=2"],
     "num_learners=2 needs one of ['ppo', 'appo', 'sac'], not dqn; use num_learners=1"),
    (["sac", "--env", "Pendulum-v1", "--set", "num_learners=2", "--set", "compile=true"],
     "sac.compile=true does not combine with num_learners > 1"),
    (["ppo", "--env", "CartPole-v1", "--set", "num_learners=2", "--set", "ppo.recurrent=lstm"],
     "num_learners=2 shards minibatches of steps; ppo.recurrent trains on sequences"),
])
def test_bad_learner_settings_are_one_line_errors(args, message, tmp_path, capsys):
    code = main(["train", *args, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"rlloop: error: {message}")
    assert not (tmp_path / "run").exists() and not live_children()


def test_a_launcher_with_more_processes_than_learners_is_refused(tmp_path, capsys,
                                                                 monkeypatch):
    """torchrun --nproc-per-node 2 without num_learners=2: both processes trained the
    whole run alone into one directory, one failing on the other's lock."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    code = main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(
        "rlloop: error: the launcher started 2 processes (WORLD_SIZE) but num_learners=1")
    assert err[0].endswith("set num_learners=2")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ppo_with_two_learners_solves_cartpole(tmp_path):
    config = build_config("ppo", "CartPole-v1", flags={"seed": 0, "total_env_steps": 100_000},
                          sets=["mlflow=false", "progress=false", "save_video=false",
                                "num_learners=2"])
    result = train(config, tmp_path / "run")
    assert result.stopped_by == "solved", result
    assert not live_children()


def test_ranks_build_the_algorithms_own_policy_and_count_every_row():
    """Rank 1 builds what rank 0 holds (here the masked policy of an env with an action
    mask; it built a plain one, whose unmasked log-probs bent the shared gradient), and
    the sample counters count the whole minibatch, not rank 0's shard."""
    from rlloop.algorithms.ppo import PPOLearner
    from rlloop.config.ppo import PPOConfig
    from rlloop.data.rollout import RolloutBatch
    from rlloop.modules.masked import MaskedActorCritic

    torch.manual_seed(0)
    cfg, n, actions = PPOConfig(minibatch_size=40, ent_coef=0.01), 40, 3
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(n, 4 + actions, generator=g)
    obs[:, -actions:] = torch.tensor([1.0, 1.0, 0.0])  # action 2 is never legal
    module = MaskedActorCritic((4 + actions,), Discrete(actions), actions, cfg.hidden,
                               cfg.activation)
    with torch.no_grad():
        dist, values = module.dist_value(obs)
        taken = dist.sample(g)
        batch = RolloutBatch(obs, taken, dist.log_prob(taken), torch.randn(n, generator=g),
                             torch.randn(n, generator=g), values)
    kwargs = {"num_epochs": 1, "minibatch_size": n, "env_steps": 0}
    one = PPOLearner({DEFAULT_MODULE_ID: copy.deepcopy(module)}, cfg)
    expected = one.update_from_batch({DEFAULT_MODULE_ID: batch},
                                     generator=torch.Generator().manual_seed(5), **kwargs)
    two = _rank0(cfg, EnvSpec("m", (4 + actions,), Discrete(actions), action_mask=actions),
                 module)
    try:
        got = two.update_from_batch({DEFAULT_MODULE_ID: batch}, stop=lambda s: False,
                                    generator=torch.Generator().manual_seed(5), **kwargs)
        assert got["ppo/approx_kl"] == pytest.approx(0.0, abs=1e-6)  # one epoch: on-policy
        _assert_close(two.modules.state_dict(), one.modules.state_dict(), atol=1e-6)
        _assert_ranks_equal(two)
        for key in ("learner/num_samples_trained", "learner/num_samples_trained_lifetime"):
            assert got[key] == expected[key] == n, key
    finally:
        two.close()


def test_a_step_one_shard_overflows_is_skipped_by_every_rank():
    """A finite batch whose loss overflows on one rank's shard only (a return of 2e19):
    every rank skips the step, as one learner does, so the copies stay equal."""
    import dataclasses

    from learner_cases import ppo_batch

    from rlloop.algorithms.ppo import PPOLearner
    from rlloop.config.ppo import PPOConfig
    from rlloop.modules.actor_critic import ActorCritic

    torch.manual_seed(0)
    cfg = PPOConfig(minibatch_size=20)
    module = ActorCritic((4,), Discrete(2), cfg.hidden, cfg.activation, 0.0)
    batch = ppo_batch(20, seed=1)
    returns = batch.returns.clone()
    returns[15] = 2e19
    batch = dataclasses.replace(batch, returns=returns)
    kwargs = {"num_epochs": 1, "minibatch_size": 20, "env_steps": 0}
    before = copy.deepcopy(module.state_dict())
    one = PPOLearner({DEFAULT_MODULE_ID: copy.deepcopy(module)}, cfg)
    expected = one.update_from_batch({DEFAULT_MODULE_ID: batch},
                                     generator=torch.Generator().manual_seed(5), **kwargs)
    assert expected["guard/skipped_updates"] == 1.0
    two = _rank0(cfg, EnvSpec("t", (4,), Discrete(2)), module)
    try:
        got = two.update_from_batch({DEFAULT_MODULE_ID: batch}, stop=lambda s: False,
                                    generator=torch.Generator().manual_seed(5), **kwargs)
        assert got["guard/skipped_updates"] == 1.0
        _assert_close(two.modules[DEFAULT_MODULE_ID].state_dict(), before, atol=0)
        _assert_ranks_equal(two)
    finally:
        two.close()


def test_two_sac_learners_share_the_gsde_noise_matrix():
    """gSDE draws one noise matrix per batch: every rank uses all of it (it was cut as if
    it were batch rows: a crash, or with one-row shards a silently wrong update)."""
    torch.manual_seed(0)
    cfg = SACConfig(hidden=[32, 32], batch_size=15, use_sde=True)
    module = SACModule(3, 1, cfg)
    one = SACLearner({DEFAULT_MODULE_ID: copy.deepcopy(module)}, cfg, -1.0,
                     new_generator(CPU, 7))
    two = _rank0(cfg, EnvSpec("p", (3,), Box((-2.0,), (2.0,), (1,))), module,
                 new_generator(CPU, 7))
    g = torch.Generator().manual_seed(2)
    try:
        for _ in range(2):
            n = 15
            batch = Transitions(torch.randn(n, 3, generator=g), torch.rand(n, 1, generator=g),
                                torch.randn(n, generator=g), torch.randn(n, 3, generator=g),
                                torch.rand(n, generator=g) < 0.2, torch.full((n,), 0.99))
            expected, got = one.update(batch), two.update(batch)
            torch.testing.assert_close(got["losses/actor"], expected["losses/actor"],
                                       rtol=1e-5, atol=1e-6)
        _assert_close(two.modules.state_dict(), one.modules.state_dict(), atol=1e-6)
        _assert_ranks_equal(two)
    finally:
        two.close()
