"""Exact resume with hindsight replay: N env steps straight == N/2, a checkpoint, and a
resume to N, bit for bit, with episodes running in every env at the cut (their steps are
in the replay, not yet sampleable; the envs' state continues them after the resume), and
with the observation and reward statistics of normalize_obs and normalize_rewards."""

from __future__ import annotations

import math

import goal_envs
import pytest
from conftest import leaves, same_leaf

from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.loading import build_config
from rlloop.runs.start import resume, train

goal_envs.register()
SETS = ["mlflow=false", "progress=false", "save_video=false", "stop_on_solve=false",
        "num_envs=3", "sac.replay=her", "sac.hidden=[32,32]", "sac.batch_size=32",
        "sac.learning_starts=30", "sac.buffer_size=120", "sac.eval_interval=20",
        "sac.record_interval=1", "sac.opt_interval=3", "eval_episodes=2"]


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "env", "copy_info", "normalize"), [
    ("future", "BitFlipBox", False, False),
    # a reward that reads info: the infos resume too; and the normalisation statistics
    ("future", "CostlyBitFlip", True, True),
])
def test_sac_with_her_resumes_bit_exactly(tmp_path, strategy, env, copy_info,
                                          normalize) -> None:
    def config(steps: int):
        return build_config("sac", f"rlloop-test/{env}-v0",
                            flags={"seed": 4, "total_env_steps": steps},
                            sets=[*SETS, f"sac.her_strategy={strategy}",
                                  f"sac.her_copy_info={copy_info}",
                                  f"sac.normalize_obs={normalize}",
                                  f"sac.normalize_rewards={normalize}"])

    # 3 envs x 50 steps to the cut (8-step episodes, ended early on the goal: none ends
    # on step 50 in every env), 40 rows per env: the replay has wrapped by the end
    train(config(300), tmp_path / "a")
    train(config(150), tmp_path / "b")
    saved = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    replay = saved.components["algorithm"]["offpolicy"]["replay"]
    assert (replay["start"] < int(replay["written"])).all()  # an episode runs in every env
    assert ("infos" in replay) == copy_info
    assert ("obs_norm" in saved.components["algorithm"]) == normalize
    assert ("reward_norm" in saved.components["algorithm"]["offpolicy"]) == normalize
    resume(tmp_path / "b", total_env_steps=300)

    a = load_checkpoint(CheckpointManager(tmp_path / "a" / "checkpoints").latest())
    b = load_checkpoint(CheckpointManager(tmp_path / "b" / "checkpoints").latest())
    assert a.components["trainer"]["counters"] == b.components["trainer"]["counters"]
    la = dict(leaves({k: a.components[k] for k in ("algorithm", "rng")}))
    lb = dict(leaves({k: b.components[k] for k in ("algorithm", "rng")}))
    assert la.keys() == lb.keys()
    assert a.components["algorithm"]["offpolicy"]["replay"]["written"] == 100
    if copy_info:  # the costs of the steps held, read back as they were kept
        costs = a.components["algorithm"]["offpolicy"]["replay"]["infos"]
        assert {tuple(e["path"]) for e in costs} == {("cost",), ("is_success",)}
    # the learner's logged-lr accumulator is folded at a checkpoint (a logging statistic,
    # summed in another order after a cut): equal to rounding, the rest bit-identical
    different = [k for k in la if not (same_leaf(la[k], lb[k]) or (
        "metrics_logger" in k and math.isclose(la[k], lb[k], rel_tol=1e-12)))]
    assert not different, different
