"""``check_env`` finds each planted defect in one line naming the fix, passes a good env
and every Gymnasium classic-control, Box2D and MuJoCo env (issue 45, item 12)."""

from __future__ import annotations

import warnings

import checker_envs as envs
import gymnasium
import pytest

import rlloop
from rlloop.envs.checker import check_env
from rlloop.errors import EnvError

PLANTED = [
    (envs.NotAnEnv, "not a gymnasium.Env", False),
    (envs.NoObservationSpace, "observation_space is NoneType", False),
    (envs.InfiniteActions, "infinite bounds", False),
    (envs.OffsetActions, "Discrete(start=1)", False),
    (envs.ResetWithoutSeed, "reset(self, *, seed=None, options=None)", False),
    (envs.ResetReturnsObsOnly, "reset() must return (obs, info)", False),
    (envs.Float64Observations, ".astype(np.float32)", False),
    (envs.WrongShape, "shape (4,)", False),
    (envs.OutOfBounds, "outside observation_space", False),
    (envs.NaNObservations, "NaN or inf", False),
    (envs.OldStepAPI, "split the old done flag", False),
    (envs.ArrayReward, "float(reward)", False),
    (envs.IntTerminated, "bool(terminated)", False),
    (envs.ListInfo, "info is list", False),
    (envs.Unseeded, "self.np_random", False),
    (envs.NoneFrames, "returned None", True),
    (envs.NoRenderModeArgument, "accept render_mode=None", True),
    (envs.NoRenderModes, "metadata['render_modes']", True),
]


def test_a_good_env_passes_as_class_instance_and_id() -> None:
    gymnasium.register("rlloop-test/CheckedGood-v0", entry_point=envs.Good)
    assert check_env(envs.Good) == []
    assert check_env(envs.Good(render_mode="rgb_array")) == []
    assert check_env("rlloop-test/CheckedGood-v0") == []
    assert rlloop.check_env is check_env


@pytest.mark.parametrize(("env", "fix", "warning"), PLANTED, ids=[p[0].__name__ for p in PLANTED])
def test_each_planted_defect_is_one_line_naming_its_fix(env, fix: str, warning: bool) -> None:
    findings = check_env(env)
    assert len(findings) == 1, findings
    (finding,) = findings
    assert fix in finding.message and "\n" not in str(finding)
    assert finding.warning is warning


def _registered(family: str) -> list[str]:
    return sorted(k for k, s in gymnasium.registry.items()
                  if isinstance(s.entry_point, str) and f"gymnasium.envs.{family}" in s.entry_point)


def _check_id(env_id: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the v4 ids are out of date
        try:
            findings = check_env(env_id)
        except EnvError as e:  # not installed here (Box2D, or MuJoCo < 3 for some v4 ids)
            pytest.skip(str(e))
    assert findings == [], [str(f) for f in findings]


@pytest.mark.parametrize("env_id", _registered("classic_control") + _registered("box2d"))
def test_classic_control_and_box2d_envs_pass(env_id: str) -> None:
    _check_id(env_id)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", _registered("mujoco"))
def test_mujoco_envs_pass(env_id: str) -> None:
    _check_id(env_id)
