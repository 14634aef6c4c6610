"""Presets: every shipped file builds a valid config, `rlloop presets` lists and prints them
without torch, and an env without a preset gets SB3-like defaults, not CartPole's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlloop.config.loading import build_config
from rlloop.config.ppo import PPOConfig
from rlloop.config.presets import all_files, file_name
from rlloop.config.registry import ALGORITHMS
from rlloop.config.run_config import RunConfig

ZOO_ENVS = {"CartPole-v1": {"ppo", "a2c", "dqn", "qrdqn"},
            "Acrobot-v1": {"ppo", "a2c", "dqn", "qrdqn"},
            "MountainCar-v0": {"ppo", "a2c", "dqn", "qrdqn"},
            "Pendulum-v1": {"ppo", "a2c", "sac", "td3", "tqc", "crossq"},
            "LunarLander-v3": {"ppo", "a2c", "dqn", "qrdqn"},
            "LunarLanderContinuous-v3": {"ppo", "a2c", "sac", "td3", "tqc", "crossq"},
            "BipedalWalker-v3": {"ppo", "a2c", "sac", "td3", "tqc", "crossq"}}


ZOO_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo.py"


@pytest.fixture(scope="module")
def zoo():
    """benchmarks/zoo.py as a module: its main() trains in this process (one seed at a
    time), so no interpreter and torch import per run."""
    spec = importlib.util.spec_from_file_location("zoo_benchmark", ZOO_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _zoo(zoo, args, capsys):
    capsys.readouterr()
    code = zoo.main(args)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


@pytest.mark.parametrize("env_id", sorted(ZOO_ENVS))
def test_classic_and_box2d_presets_cover_every_fitting_algorithm(env_id):
    found = next(f for f in all_files() if f.env == env_id)
    online = {algo for algo in found.algorithms if not ALGORITHMS[algo].offline}
    assert online == ZOO_ENVS[env_id]
    for algo in online:
        config = build_config(algo, env_id)  # every key is a real, valid setting
        assert config.total_env_steps >= 1
        bench = found.benchmark[algo]
        assert bench["budget"] > 0 and isinstance(bench["zoo_score"], float)


def test_pendulums_offline_presets_are_the_measured_settings():
    """CQL and IQL on Pendulum-v1 train as measured on the offline guide's mixed dataset
    (SAC's lr 1e-3, 10k updates of [64, 64]) without --set; their defaults stay 3e-4,
    CORL's and TorchRL's."""
    for algo in ("cql", "iql"):
        hp = build_config(algo, "Pendulum-v1").hparams
        assert (hp.lr, hp.total_gradient_steps, hp.hidden) == (1e-3, 10_000, [64, 64])
        assert build_config(algo, "MountainCarContinuous-v0").hparams.lr == 3e-4


def test_every_file_is_named_after_its_env_and_builds():
    for found in all_files():
        assert file_name(found.env)
        for algo in found.algorithms:
            assert algo in ALGORITHMS, (found.env, algo)


def test_defaults_are_sb3s_in_rlloop_units_and_the_cartpole_preset_keeps_its_own():
    ppo = PPOConfig()
    batch = ppo.rollout_steps * RunConfig.num_envs
    assert (batch, ppo.minibatch_size, ppo.num_epochs) == (2048, 64, 10)
    assert (ppo.lr, ppo.lr_schedule, ppo.vf_coef, ppo.ent_coef) == (3e-4, "constant", 1.0, 0.0)
    # An env without a preset trains with these; CartPole keeps its fast settings.
    assert build_config("ppo", "Blackjack-v1").hparams == ppo
    cartpole = build_config("ppo", "CartPole-v1").hparams
    assert (cartpole.lr, cartpole.num_epochs, cartpole.vf_coef) == (3e-3, 4, 0.5)


def test_presets_command_lists_and_prints_a_config_layer(tmp_path, cli_in_process):
    # in this process: test_presets_command_does_not_import_torch runs a real one
    out = cli_in_process(["presets"])
    assert out.returncode == 0, out.stderr
    assert any(line.split()[:4] == ["LunarLander-v3", "ppo", "1,000,000", "242.1"]
               for line in out.stdout.splitlines()), out.stdout
    only = cli_in_process(["presets", "dqn"]).stdout
    assert "Acrobot-v1" in only and "Pendulum-v1" not in only

    printed = cli_in_process(["presets", "ppo", "--env", "LunarLander-v3"])
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "ll.yaml").write_text(printed.stdout)
    from_file = build_config("ppo", file=tmp_path / "ll.yaml", sets=["ppo.lr=0.001"])
    preset = build_config("ppo", "LunarLander-v3", sets=["ppo.lr=0.001"])
    assert from_file.to_dict() == preset.to_dict()


@pytest.mark.parametrize(("args", "expected"), [
    (["presets", "trpo"], "no presets for algorithm 'trpo'"),
    (["presets", "ppo", "--env", "Nowhere-v0"], "no ppo preset for Nowhere-v0"),
])
def test_presets_command_bad_input_is_one_line(cli_in_process, args, expected):
    out = cli_in_process(args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("rlloop: error: ") and expected in lines[0]


def test_presets_command_does_not_import_torch(tmp_path, cli_env):
    code = ("import json, sys; from rlloop.cli.main import main; main(['presets']); "
            "main(['presets', 'sac', '--env', 'Pendulum-v1']); "
            "print(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) is False


def test_zoo_benchmark_resumes_and_writes_the_table(tmp_path, zoo, capsys):
    results, table = tmp_path / "zoo.jsonl", tmp_path / "table.md"
    args = ["--only", "CartPole-v1/ppo", "--fraction", "0.02",
            "--seeds", "1", "--eval-episodes", "2", "--results", str(results),
            "--table", str(table)]
    first = _zoo(zoo, args, capsys)
    assert first.returncode == 0, first.stderr
    row = json.loads(results.read_text())
    assert (row["env"], row["algo"], row["seed"], row["env_steps"]) == ("CartPole-v1", "ppo",
                                                                        0, 2048)
    again = _zoo(zoo, args, capsys)
    assert again.returncode == 0, again.stderr
    assert "seed 0:" not in again.stdout  # measured already: skipped, not trained again
    assert len(results.read_text().splitlines()) == 1
    assert "| CartPole-v1 | ppo | 2,000 |" in table.read_text()


def test_zoo_benchmark_resumes_a_seed_stopped_part_way(tmp_path, zoo, capsys):
    from rlloop.config.loading import build_config
    from rlloop.runs.start import train

    runs, results = tmp_path / "runs", tmp_path / "zoo.jsonl"
    # An earlier sitting's seed 1, stopped with a checkpoint at 1,024 of its 2,048 env steps
    stopped = train(build_config("ppo", "CartPole-v1", flags={"seed": 1,
                                                              "total_env_steps": 1024},
                                 sets=["mlflow=false", "progress=false", "save_video=false",
                                       "stop_on_solve=false"]),
                    runs / "CartPole-v1-ppo-1-0.02")
    assert stopped.env_steps == 1024
    (stopped.run_dir / "zoo_sittings.json").write_text("[5.0]")
    args = ["--only", "CartPole-v1/ppo", "--fraction", "0.02",
            "--seeds", "1", "--first-seed", "1", "--eval-episodes", "2",
            "--results", str(results), "--runs-dir", str(runs)]
    done = _zoo(zoo, args, capsys)
    assert done.returncode == 0, done.stderr
    assert "CartPole-v1/ppo seed 1: resuming" in done.stdout
    row = json.loads(results.read_text())
    assert (row["seed"], row["env_steps"]) == (1, 2048)  # seed 0 was not asked for
    assert row["wall_s"] > 5.0  # both sittings


def test_zoo_benchmark_leaves_a_seed_that_another_process_trains(tmp_path, cli_env):
    from rlloop.runs.lock import RunLock

    runs, results = tmp_path / "runs", tmp_path / "zoo.jsonl"
    # Another sitting trains seed 0 and has not reached its first checkpoint yet.
    live = runs / "CartPole-v1-ppo-0-0.02"
    lock = RunLock(live).acquire()
    (live / "metrics.jsonl").write_text("{}\n")
    try:
        done = subprocess.run(
            [sys.executable, str(ZOO_SCRIPT), "--only", "CartPole-v1/ppo", "--fraction", "0.02",
             "--seeds", "1", "--results", str(results), "--runs-dir", str(runs)],
            capture_output=True, text=True, timeout=300, env=cli_env)
    finally:
        lock.release()
    assert done.returncode == 0, done.stderr
    assert "CartPole-v1/ppo seed 0: skipped" in done.stdout and "in use by" in done.stdout
    assert (live / "metrics.jsonl").read_text() == "{}\n"  # neither removed nor resumed
    assert not results.exists() or not results.read_text().strip()


def test_atari_ppo_presets_double_sb3s_vf_coef():
    # rl-zoo's `atari` entry: vf_coef 0.5 in SB3's value loss, which has no factor 1/2
    atari = [f for f in all_files() if f.env.startswith("ALE/")]
    assert len(atari) == 8
    for found in atari:
        assert found.algorithms["ppo"]["ppo"]["vf_coef"] == 1.0, found.env


#: rl-zoo's PPO vf_coef (SB3's value loss has no factor 1/2; SB3's default is 0.5).
ZOO_PPO_VF_COEF = {"Acrobot-v1": 0.5, "MountainCar-v0": 0.5, "Pendulum-v1": 0.5,
                   "LunarLander-v3": 0.5, "LunarLanderContinuous-v3": 0.5,
                   "BipedalWalker-v3": 0.5, "MountainCarContinuous-v0": 0.19}

#: rl-zoo's DQN entries: (budget, exploration_fraction, target_update_interval in env
#: steps, train_freq, gradient_steps with -1 resolved to train_freq). Atari: the `atari`
#: entry, every game alike.
ZOO_DQN = {"CartPole-v1": (50_000, 0.16, 10, 256, 128),
           "Acrobot-v1": (100_000, 0.12, 250, 4, 4),
           "MountainCar-v0": (120_000, 0.2, 600, 16, 8),
           "LunarLander-v3": (100_000, 0.12, 250, 4, 4),
           "ALE/Pong-v5": (10_000_000, 0.1, 1000, 4, 1)}


@pytest.mark.parametrize("env_id", sorted(ZOO_PPO_VF_COEF))
def test_classic_and_box2d_ppo_presets_double_sb3s_vf_coef(env_id):
    assert build_config("ppo", env_id).hparams.vf_coef == 2 * ZOO_PPO_VF_COEF[env_id]


@pytest.mark.parametrize("env_id", sorted(ZOO_DQN))
def test_dqn_presets_translate_exploration_and_target_updates(env_id):
    budget, fraction, target_env_steps, train_freq, gradient_steps = ZOO_DQN[env_id]
    config = build_config("dqn", env_id)
    hp = config.hparams
    assert config.total_env_steps == budget
    assert hp.exploration_steps == round(fraction * budget)  # env steps, not a fraction
    # SB3 updates the target every target_update_interval env steps, but between training
    # phases: at most once per train_freq env steps. rlloop counts gradient updates.
    assert (hp.opt_interval, hp.gradient_steps) == (train_freq, gradient_steps)
    updates = max(target_env_steps, train_freq) * gradient_steps / train_freq
    assert hp.target_update_interval == updates


def test_box2d_sac_presets_translate_rl_zoos_lr_schedule_and_gsde():
    llc = build_config("sac", "LunarLanderContinuous-v3").hparams  # lin_7.3e-4 over 500k
    assert (llc.lr, llc.lr_schedule, llc.lr_decay_steps) == (7.3e-4, "linear", 500_000)
    bw = build_config("sac", "BipedalWalker-v3").hparams  # use_sde, log_std_init -3, expln
    assert (bw.use_sde, bw.init_log_std, bw.use_expln, bw.sde_sample_freq) == (True, -3.0,
                                                                               True, -1)


@pytest.mark.slow
def test_zoo_benchmark_trains_seeds_in_parallel_processes(tmp_path, cli_env):
    results = tmp_path / "zoo.jsonl"
    args = [sys.executable, str(ZOO_SCRIPT), "--only", "CartPole-v1/ppo", "--fraction", "0.02",
            "--seeds", "2", "--jobs", "2", "--eval-episodes", "2", "--results", str(results)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=cli_env)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["seed"] for r in rows) == [0, 1]  # one line each, written by the parent
    assert "| CartPole-v1 | ppo | 2,000 |" in done.stdout and "2 seeds" in done.stdout


def test_the_listing_shows_each_presets_budget_and_sane_evaluation_cadences():
    """Presets without an rl-zoo score listed their budget as '-'; Humanoid PPO evaluated
    1,028 times over its 10M steps (5 x 1,000-step episodes each: half the run), and
    MountainCarContinuous PPO 500 times over 20k steps."""
    from rlloop.config.presets import listing

    budgets = {(row.env, row.algo): row.budget for row in listing()}
    assert all(budgets.values())
    assert budgets[("Humanoid-v5", "ppo")] == 10_000_000
    for algo, env in (("ppo", "Humanoid-v5"), ("ppo", "MountainCarContinuous-v0"),
                      ("ppo", "HalfCheetah-v5"), ("ppo", "CartPole-v1")):
        config = build_config(algo, env)
        hp = config.hparams
        evals = config.total_env_steps / (config.eval_every * hp.rollout_steps * config.num_envs)
        assert 10 <= evals <= 120, (algo, env, evals)
