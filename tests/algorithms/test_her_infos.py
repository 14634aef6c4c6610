"""Hindsight replay with ``her_copy_info``: each env step's info reaches the replay beside
that step's transition (the ended episode's last info, not its reset's, where an episode
ended), rewards that read info are recomputed with it, and what cannot be kept or fed is
refused in one line naming the fix.

The env (``goal_envs.CostlyBitFlip``) charges each step off the goal ``info["cost"]``,
which grows along the episode, so a reward scored with another step's info is wrong: the
stored rewards, scored again from the stored infos, must come out as the env gave them.
"""

from __future__ import annotations

from typing import Any

import goal_envs
import gymnasium
import pytest
import torch

import rlloop.envs.goal_env as goal_env
from rlloop.config.loading import build_config
from rlloop.data.hindsight_replay import ACHIEVED, DESIRED, HindsightReplayBuffer
from rlloop.errors import ConfigError
from rlloop.runs.build import build_algorithm

goal_envs.register()
QUIET = ["mlflow=false", "progress=false", "save_video=false"]
COSTLY = "rlloop-test/CostlyBitFlip-v0"


class NamedCostlyBitFlip(goal_envs.CostlyBitFlip):
    """An info entry no tensor can hold."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "name": "step"}


if "rlloop-test/NamedCostlyBitFlip-v0" not in gymnasium.registry:
    gymnasium.register("rlloop-test/NamedCostlyBitFlip-v0", entry_point=NamedCostlyBitFlip,
                       max_episode_steps=goal_envs.N_BITS)


def _sac(env: str = COSTLY, *sets: str):
    return build_algorithm(build_config(
        "sac", env, flags={"seed": 0},
        sets=[*QUIET, "num_envs=3", "sac.replay=her", "sac.learning_starts=12",
              "sac.batch_size=16", "sac.hidden=[16,16]", *sets]))


def _steps(algorithm, count: int) -> HindsightReplayBuffer:
    for _ in range(count):
        algorithm.env_step()
        algorithm.optimize(algorithm.loop.env_steps)
    replay = algorithm.loop.replay
    assert isinstance(replay, HindsightReplayBuffer) and replay.infos is not None
    return replay


def _rescored(replay: HindsightReplayBuffer, infos_step_shift: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every held transition's reward as stored, and as the env's compute_reward gives
    it for the real goal with the stored info (of the step ``infos_step_shift`` earlier)."""
    held, n = min(replay._written, replay.rows), replay.num_envs
    row = torch.arange(infos_step_shift, held).repeat_interleave(n)
    env = torch.arange(n).repeat(held - infos_step_shift)
    infos = replay.infos.read(row - infos_step_shift, env)
    next_obs = {k: t[row, env] for k, t in replay.next_obs.tensors.items()}
    again = replay.compute_reward(next_obs[ACHIEVED], next_obs[DESIRED], infos)
    return replay._fields["reward"][row, env], again


def test_each_steps_own_info_is_stored_with_it() -> None:
    # 3 envs x 20 steps: episodes of 8 steps (or fewer, ended on the goal) end and
    # restart in every env, and rewards are relabelled from the second optimisation on
    algorithm = _sac(COSTLY, "sac.her_copy_info=true")
    replay = _steps(algorithm, 20)
    stored, again = _rescored(replay)
    assert (stored < 0).sum() > 30  # costs were charged, and they grow along the episode
    assert torch.equal(stored, again)
    assert algorithm.learner.updates > 0
    stored, late = _rescored(replay, infos_step_shift=1)  # planted: the step before's
    assert not torch.equal(stored, late)


def test_the_check_catches_the_reset_info_of_an_ended_episode(monkeypatch) -> None:
    def reset_infos(infos, num_envs):  # planted: the infos as the vector env gives them
        return [goal_env._own_info(infos, i) for i in range(num_envs)]

    monkeypatch.setattr(goal_env, "unbatch_infos", reset_infos)
    stored, again = _rescored(_steps(_sac(COSTLY, "sac.her_copy_info=true"), 20))
    assert not torch.equal(stored, again)


def test_an_info_entry_that_cannot_be_stored_is_refused_at_the_first_step() -> None:
    algorithm = _sac("rlloop-test/NamedCostlyBitFlip-v0", "sac.her_copy_info=true")
    with pytest.raises(ConfigError, match=r"^sac.her_copy_info=true stores each step's info, "
                       r"but info\['name'\] is a str, and only numbers, bools and numeric "
                       r"arrays can be stored; drop that entry from the env's info or set "
                       r"sac.her_copy_info=false$"):
        algorithm.env_step()


def test_a_reward_that_reads_info_without_it_names_her_copy_info() -> None:
    with pytest.raises(ConfigError, match=r"an empty info per row\), and for B=2 it raised "
                                          r"KeyError: 'cost'; set sac.her_copy_info=true if "
                                          r"it reads info, else make it vectorised"):
        _sac(COSTLY)


def test_her_copy_info_without_her_is_named_unused() -> None:
    from rlloop.config.unused_settings import unused_settings
    config = build_config("td3", "Pendulum-v1", sets=[*QUIET, "td3.her_copy_info=true"])
    assert unused_settings(config.hparams) == [
        "td3.her_copy_info=True has no effect while td3.replay is 'uniform'; drop it or "
        "change td3.replay"]


@pytest.mark.parametrize(("algo", "env", "runners"), [
    ("dqn", "CartPole-v1", 1), ("sac", "Pendulum-v1", 2), ("td3", "Pendulum-v1", 1),
    ("tqc", "Pendulum-v1", 1)])
def test_her_with_ray_env_runners_is_refused_in_one_line_naming_the_fix(algo, env,
                                                                        runners) -> None:
    # the runners' fragments carry neither Dict observations nor infos, and arrive per
    # runner, not in the lockstep rows HER keeps its episodes in
    with pytest.raises(ConfigError, match=r"use num_env_runners=0$") as caught:
        build_config(algo, env, sets=[*QUIET, f"{algo}.replay=her", f"{algo}.her_copy_info=true",
                                      f"num_env_runners={runners}"])
    assert "\n" not in str(caught.value)
