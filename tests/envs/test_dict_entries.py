"""Dict entries that no encoder reads (MiniGrid's mission text) are left out with one line
of notice instead of refusing the env (issue 45, item 8)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from gymnasium import spaces

from rlloop.envs.dict_entries import unencoded_entries
from rlloop.envs.gym_spec import gym_env_spec

minigrid = pytest.importorskip("minigrid")


def test_only_entries_without_an_encoder_are_left_out() -> None:
    image = spaces.Box(0, 255, (7, 7, 3), np.uint8)
    assert unencoded_entries(spaces.Dict({"image": image, "mission": spaces.Text(8)})) == [
        "mission"]
    assert unencoded_entries(spaces.Dict({"image": image, "direction": spaces.Discrete(4)})) == []
    assert unencoded_entries(spaces.Dict({"mission": spaces.Text(8)})) == []  # nothing left
    assert unencoded_entries(image) == []
    # numbers without an encoder are refused with the fix, not dropped
    assert unencoded_entries(spaces.Dict({"image": image, "dice": spaces.MultiDiscrete([3])})) \
        == []


def test_minigrid_trains_on_image_and_direction_with_one_notice(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        spec = gym_env_spec("MiniGrid-Empty-5x5-v0")
        gym_env_spec("MiniGrid-Empty-5x5-v0")
    assert [key for key, _, _ in spec.obs_parts] == ["direction", "image"]
    notices = [r.getMessage() for r in caplog.records if "leaving out" in r.getMessage()]
    assert notices == ["rlloop: MiniGrid-Empty-5x5-v0: leaving out observation 'mission' "
                       "(MissionSpace): no encoder reads it"]
