"""Offline RL end to end: ``rlloop collect`` writes a Minari dataset that Minari reads back,
BC clones an expert CartPole policy from it, bad input answers in one line before torch is
imported, and an offline run resumes bit for bit, then evaluates and exports without its
dataset.

One PPO expert is trained in process per module (CartPole-v1 solves in seconds) and 20 of
its greedy episodes recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from conftest import leaves, same_leaf

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.cli.export import export_run
from rlloop.config.loading import build_config
from rlloop.data.offline_dataset import Episode, load_dataset, write_minari
from rlloop.envs.registry import env_spec
from rlloop.errors import ConfigError
from rlloop.runs.collect import collect
from rlloop.runs.saved import evaluate_run
from rlloop.runs.start import resume, train

minari = pytest.importorskip("minari")
QUIET = ["mlflow=false", "progress=false", "save_video=false"]


@pytest.fixture(scope="module")
def expert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """A solved PPO CartPole run, and 20 greedy episodes of it as a dataset in a Minari
    store (``<store>/cartpole-expert-v0``): (run, dataset, the dataset's mean return)."""
    root = tmp_path_factory.mktemp("offline")
    run = train(build_config("ppo", "CartPole-v1", flags={"seed": 0}, sets=QUIET),
                root / "ppo").run_dir
    result = collect(run, 20, root / "store" / "cartpole-expert-v0", seed=1)
    return run, result.path, result.return_mean


def test_collect_writes_a_dataset_minari_reads(expert, monkeypatch) -> None:
    _, path, return_mean = expert
    assert return_mean > 400
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path.parent))
    dataset = minari.load_dataset("cartpole-expert-v0")
    assert dataset.total_episodes == 20
    assert dataset.spec.env_spec.id == "CartPole-v1"
    episodes = list(dataset.iterate_episodes())
    first = episodes[0]
    assert first.observations.shape == (len(first.actions) + 1, 4)
    assert bool(first.terminations[-1] or first.truncations[-1])
    assert not (first.terminations[:-1].any() or first.truncations[:-1].any())
    assert np.mean([e.rewards.sum() for e in episodes]) == pytest.approx(return_mean)
    # rlloop reads it (by path, and by id from Minari's store) as the same transitions
    spec = env_spec("CartPole-v1")
    data = load_dataset(str(path), spec, torch.device("cpu"))
    assert len(data) == dataset.total_steps
    assert torch.equal(data.obs[: len(first.actions)], torch.as_tensor(first.observations[:-1]))
    assert torch.equal(data.next_obs[len(first.actions) - 1],
                       torch.as_tensor(first.observations[-1]))
    assert torch.equal(data.action[: len(first.actions)], torch.as_tensor(first.actions))
    by_id = load_dataset("minari:cartpole-expert-v0", spec, torch.device("cpu"))
    assert torch.equal(by_id.reward, data.reward)


def test_a_dataset_of_other_spaces_is_refused_naming_its_env(expert) -> None:
    _, path, _ = expert
    with pytest.raises(ConfigError, match=r"Acrobot-v1 has observations of shape \(6,\) and "
                       r"Discrete\(3\) actions; pass --env CartPole-v1"):
        load_dataset(str(path), env_spec("Acrobot-v1"), torch.device("cpu"))


@pytest.mark.slow
def test_bc_clones_the_expert_to_95_percent_of_its_return(expert, tmp_path) -> None:
    _, path, return_mean = expert
    config = build_config("bc", "CartPole-v1", flags={"seed": 0}, sets=[
        *QUIET, f"bc.dataset={path}", "bc.total_gradient_steps=1000", "bc.hidden=[64,64]",
        "bc.eval_interval=500", "stop_on_solve=false"])
    result = train(config, tmp_path / "bc")
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    evals = [r["eval/return_mean"] for r in rows if "eval/return_mean" in r]
    assert result.env_steps == 0 and len(evals) == 2
    assert result.stopped_by == "budget"  # total_gradient_steps, the run's budget
    assert evals[-1] >= 0.95 * return_mean, (evals, return_mean)


def test_bad_offline_input_answers_in_one_line_before_torch(expert, tmp_path) -> None:
    run, path, _ = expert
    cases = {
        "missing": (["train", "bc", "--dataset", str(tmp_path / "nothing")],
                    "does not exist; record one with `rlloop collect RUN_DIR -o"),
        "none": (["train", "iql", "--env", "Pendulum-v1"],
                 "iql learns from a dataset and none was given: pass --dataset DIR"),
        "online": (["train", "ppo", "--dataset", str(path)],
                   "--dataset is for the offline algorithms (bc, cql, iql); ppo learns"),
        "spaces": (["train", "bc", "--dataset", str(path), "--env", "Acrobot-v1"],
                   "pass --env CartPole-v1 (the env it was recorded in)"),
        "not a run": (["collect", str(tmp_path), "-o", str(tmp_path / "d")],
                      "is not an rlloop run directory (no config.yaml); pass a directory "
                      "made by `rlloop train`"),
        "not empty": (["collect", str(run), "-o", str(path)],
                      "exists and is not an empty directory; name a new one"),
    }
    probe = ("import io, sys, contextlib, json\nfrom rlloop.cli.main import main\nout = {}\n"
             f"for name, argv in {json.dumps({k: v[0] for k, v in cases.items()})}.items():\n"
             "    err = io.StringIO()\n"
             "    with contextlib.redirect_stderr(err):\n"
             "        code = main(argv)\n"
             "    out[name] = [code, err.getvalue()]\n"
             "print(json.dumps([out, 'torch' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd=tmp_path)
    answers, torch_imported = json.loads(done.stdout)
    assert not torch_imported
    for name, (_, expected) in cases.items():
        code, err = answers[name]
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, (name, err)


def _random_pendulum(path: Path, episodes: int = 3) -> Path:
    env = gymnasium.make("Pendulum-v1")
    rng = np.random.default_rng(0)
    recorded = []
    for i in range(episodes):
        obs = [env.reset(seed=i)[0]]
        actions, rewards = [], []
        for _ in range(200):
            action = rng.uniform(-2, 2, size=(1,)).astype(np.float32)
            o, r, *_ = env.step(action)
            obs.append(o)
            actions.append(action)
            rewards.append(r)
        recorded.append(Episode(np.stack(obs), np.stack(actions), np.array(rewards),
                                np.zeros(200, bool), np.arange(200) == 199))
    env.close()
    return write_minari(path, recorded, "Pendulum-v1")


@pytest.mark.parametrize("algo", ["iql", pytest.param("cql", marks=pytest.mark.heavy)])
def test_an_offline_run_resumes_bit_for_bit(algo, tmp_path) -> None:
    """N gradient steps straight == N/2, a final checkpoint, a resume to N: every
    parameter, optimiser moment, RNG state and counter."""
    dataset = _random_pendulum(tmp_path / "pendulum-random")

    def config(steps: int):
        return build_config(algo, "Pendulum-v1", flags={"seed": 3}, sets=[
            *QUIET, f"{algo}.dataset={dataset}", f"{algo}.total_gradient_steps={steps}",
            f"{algo}.hidden=[32,32]", f"{algo}.batch_size=32", f"{algo}.eval_interval=15",
            f"{algo}.record_interval=5", "eval_episodes=1", "stop_on_solve=false"])

    train(config(40), tmp_path / "a")
    train(config(20), tmp_path / "b")
    resume(tmp_path / "b", sets=[f"{algo}.total_gradient_steps=40"])
    a = load_checkpoint(CheckpointManager(tmp_path / "a" / "checkpoints").latest())
    b = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert a.components["trainer"]["counters"] == b.components["trainer"]["counters"] == {
        "algorithm/collects": 0, "algorithm/steps": 40, "env/steps": 0}
    la = dict(leaves({k: a.components[k] for k in ("algorithm", "rng")}))
    lb = dict(leaves({k: b.components[k] for k in ("algorithm", "rng")}))
    assert la.keys() == lb.keys() and sum(isinstance(v, torch.Tensor) for v in la.values()) > 10
    assert not [k for k in la if not same_leaf(la[k], lb[k])]
    # Acting needs the policy, not the dataset: evaluated and exported without it.
    dataset.rename(tmp_path / "moved")
    assert evaluate_run(tmp_path / "a", 1)["episodes"] == 1
    assert export_run(tmp_path / "a", "torchscript").is_file()


def test_discrete_cql_trains_on_the_cartpole_dataset(expert, tmp_path) -> None:
    """CQL takes Discrete actions with a Q-network (its loss: tests/losses)."""
    _, path, _ = expert
    config = build_config("cql", "CartPole-v1", flags={"seed": 0}, sets=[
        *QUIET, f"cql.dataset={path}", "cql.total_gradient_steps=100", "cql.hidden=[32,32]",
        "cql.eval_interval=100", "eval_episodes=2"])
    result = train(config, tmp_path / "cql")
    assert result.env_steps == 0 and result.best_eval_return is not None


def test_a_resume_that_ends_between_evaluations_saves_its_updates(expert, tmp_path) -> None:
    """An offline run's env steps stay 0: a resume that trained on with no evaluation due
    was taken for a finished run, and its updates were never saved (nor evaluated)."""
    _, path, _ = expert

    def config(steps: int):
        return build_config("bc", "CartPole-v1", flags={"seed": 0}, sets=[
            *QUIET, f"bc.dataset={path}", f"bc.total_gradient_steps={steps}",
            "bc.hidden=[16,16]", "bc.eval_interval=10", "eval_episodes=1"])

    train(config(10), tmp_path / "bc")
    resume(tmp_path / "bc", sets=["bc.total_gradient_steps=15"])
    latest = CheckpointManager(tmp_path / "bc" / "checkpoints").latest()
    assert latest is not None and latest.name == "000000015"
    assert load_checkpoint(latest).components["trainer"]["counters"]["algorithm/steps"] == 15
    rows = [json.loads(line) for line in (tmp_path / "bc" / "metrics.jsonl").open()]
    assert sum("eval/return_mean" in row for row in rows) == 2  # at 10, and the final one


def test_cqls_penalty_weight_is_10_for_box_actions_and_1_for_discrete_ones() -> None:
    """The defaults measured best (mixed Pendulum data: 10 over 5; mixed CartPole data: 1
    over 10 on 5 of 6 seeds, ``benchmarks/offline_cartpole.py``); a weight set holds for
    both, and the discrete learner weighs its penalty by it."""
    from rlloop.algorithms.cql import DiscreteCQLLearner, DiscreteCQLModule
    from rlloop.config.offline import CQLConfig
    from rlloop.data.transitions import Transitions
    from rlloop.learners.learner import DEFAULT_MODULE_ID

    default = CQLConfig(dataset="-", hidden=[8])
    assert (default.penalty_weight(discrete=False), default.penalty_weight(discrete=True)) == (
        10.0, 1.0)
    assert CQLConfig(dataset="-", cql_weight=3.0).penalty_weight(discrete=True) == 3.0
    torch.manual_seed(0)
    learner = DiscreteCQLLearner({DEFAULT_MODULE_ID: DiscreteCQLModule(4, 2, default)}, default)
    batch = Transitions(torch.randn(8, 4), torch.randint(0, 2, (8,)), torch.randn(8),
                        torch.randn(8, 4), torch.zeros(8, dtype=torch.bool), torch.full((8,), 0.99))
    penalty = {w: learner.compute_loss_for_module(
        DEFAULT_MODULE_ID, CQLConfig(dataset="-", hidden=[8], cql_weight=w), batch)[1]["losses/cql"]
        for w in (None, 1.0, 10.0)}
    assert torch.equal(penalty[None], penalty[1.0])
    assert not torch.equal(penalty[None], penalty[10.0])
