"""Self-play league: snapshots join every k iterations, only 'main' learns, CLI and resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pettingzoo")

from rlloop.algorithms.league import MAIN, League
from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.loading import build_config
from rlloop.runs.build import build_algorithm
from rlloop.trainers.loop import Trainer

TTT = "pettingzoo:classic.tictactoe_v3"
SMALL = ["--num-envs", "4", "--set", "ma_ppo.rollout_steps=16",
         "--set", "ma_ppo.minibatch_size=32", "--set", "mlflow=false", "--quiet"]


def _league_algo(every=2, size=3):
    return build_algorithm(build_config("ma_ppo", TTT, sets=[
        "mlflow=false", "num_envs=4", "ma_ppo.rollout_steps=16", "ma_ppo.minibatch_size=32",
        f"ma_ppo.league_every={every}", f"ma_ppo.league_size={size}"]))


def _weights(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_league_grows_every_k_iterations_and_only_main_learns():
    algo = _league_algo(every=2, size=3)
    trainer = Trainer(algo)
    learner = algo.learner
    sizes, snapshots_at = [], {}
    for it in range(1, 10):
        main_before = _weights(learner.modules[MAIN])
        frozen_before = {m: _weights(learner.modules[m]) for m in algo.league.snapshots}
        stats = trainer.step()
        sizes.append(stats["league/size"])
        for m, w in frozen_before.items():  # snapshots never move
            if m in learner.modules:
                assert all(torch.equal(v, w[k]) for k, v in learner.modules[m].state_dict()
                           .items())
        assert any(not torch.equal(v, main_before[k])
                   for k, v in learner.modules[MAIN].state_dict().items())
        if it % 2 == 0:  # the new snapshot is main as it was after this iteration's update
            newest = algo.league.snapshots[-1]
            snapshots_at[newest] = it
            assert all(torch.equal(v, learner.modules[MAIN].state_dict()[k])
                       for k, v in learner.modules[newest].state_dict().items())
    assert sizes == [0, 1, 1, 2, 2, 3, 3, 3, 3]  # min(iterations // 2, 3)
    assert algo.league.snapshots == ["main_v2", "main_v3", "main_v4"]
    assert set(learner.modules) == {MAIN, "main_v2", "main_v3", "main_v4"}
    # main_v1 left the league: nothing of it remains in the learner
    assert not any(m == "main_v1" for m, _ in learner._optims)
    logged = learner.metrics.keys()
    assert not any(k.startswith("main_v1/") for k in logged)
    assert all(not p.requires_grad for m in algo.league.snapshots
               for p in learner.modules[m].parameters())
    assert stats["learner/params_frozen"] == 3 * stats["learner/params_trainable"]
    assert "main/losses/policy" in stats and "main_v3/losses/policy" not in stats
    algo.close()


def test_league_pairs_main_with_snapshots_in_both_seats():
    league = League(every=1, size=2)
    mapping = league.mapping(("player_1", "player_2"), torch.Generator().manual_seed(0))
    assert [mapping("player_1", e) for e in range(4)] == [MAIN] * 4  # empty league: itself
    league.add()
    league.add()
    seats = [(mapping("player_1", e), mapping("player_2", e)) for e in range(40)]
    assert all((a == MAIN) != (b == MAIN) for a, b in seats)  # main takes one seat ...
    assert {a for a, _ in seats[0::2]} == {MAIN} and {b for _, b in seats[1::2]} == {MAIN}
    assert {b for _, b in seats[0::2]} == {"main_v1", "main_v2"}  # ... vs every snapshot


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_self_play_from_the_cli_grows_the_league_and_resumes(tmp_path, monkeypatch,
                                                            cli_in_process):
    monkeypatch.chdir(tmp_path)
    # 16 steps x 4 envs = 64 env steps per iteration: 8 iterations
    args = ["train", "ma_ppo", "--env", TTT, "--run-dir", "run", "--total-env-steps", "512",
            "--set", "ma_ppo.league_every=2", "--set", "ma_ppo.league_size=3", *SMALL]
    out = cli_in_process(args)
    assert out.returncode == 0, out.stderr
    sizes = [row["league/size"] for row in _metrics(tmp_path / "run") if "league/size" in row]
    assert sizes == [0, 1, 1, 2, 2, 3, 3, 3]
    ckpt = load_checkpoint(CheckpointManager(tmp_path / "run" / "checkpoints").latest())
    league = ckpt.components["algorithm"]["league"]
    assert league == {"snapshots": ["main_v2", "main_v3", "main_v4"], "created": 4}
    assert set(ckpt.components["algorithm"]["learner"]["module"]) == {
        MAIN, "main_v2", "main_v3", "main_v4"}

    out = cli_in_process(["train", "ma_ppo", "--resume", "run", "--total-env-steps", "640",
                          "--quiet"])
    assert out.returncode == 0, out.stderr
    ckpt = load_checkpoint(CheckpointManager(tmp_path / "run" / "checkpoints").latest())
    assert ckpt.components["algorithm"]["league"]["snapshots"] == ["main_v3", "main_v4",
                                                                  "main_v5"]


def test_self_play_example_script_runs(tmp_path, cli_env):
    script = Path(__file__).resolve().parents[2] / "examples" / "self_play_league.py"
    out = subprocess.run([sys.executable, str(script), "--run-dir", "league", "--every", "1",
                          "--size", "2", "--steps", "2048"], cwd=tmp_path, env=cli_env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "['main_v3', 'main_v4']" in out.stdout
