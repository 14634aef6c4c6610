"""Dict observations with entries no encoder reads (MiniGrid's ``mission`` text): those
entries are left out, with one line of notice, instead of refusing the env.

Only text is left out (a ``Text`` space, or one Gymnasium cannot flatten, like MiniGrid's
``MissionSpace``): other entries without an encoder (a MultiDiscrete) carry numbers the
policy may need, so the env is refused with the fix instead. A run on
``MiniGrid-DoorKey-5x5-v0`` then trains on ``direction`` and ``image``, as rl-zoo's
wrappers do for the tasks whose mission text never changes.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium
from gymnasium import spaces
from gymnasium.wrappers import FilterObservation

_log = logging.getLogger(__name__)
_noticed: set[str] = set()  # env ids whose left-out entries were announced in this process


def unencoded_entries(space: gymnasium.Space[Any]) -> list[str]:
    """The keys of ``space``'s text entries, when it is a Dict that keeps at least one other
    entry (else ``[]``: nothing to leave out, or nothing left)."""
    if not isinstance(space, spaces.Dict):
        return []
    drop = [str(k) for k, v in space.spaces.items() if _is_text(v)]
    return drop if len(drop) < len(space.spaces) else []


def _is_text(space: gymnasium.Space[Any]) -> bool:
    if isinstance(space, spaces.Text):
        return True
    if isinstance(space, spaces.Box | spaces.Discrete | spaces.Dict | spaces.Tuple):
        return False
    try:
        spaces.flatten_space(space)
    except NotImplementedError:  # MiniGrid's MissionSpace: free text
        return True
    return False


def keep_encoded_entries(env: gymnasium.Env[Any, Any], env_id: str) -> gymnasium.Env[Any, Any]:
    """``env`` without the Dict entries that no encoder reads (see the module docstring);
    the first time per env id, one line says which were left out."""
    space = env.observation_space
    drop = unencoded_entries(space)
    if not drop:
        return env
    if env_id not in _noticed:
        _noticed.add(env_id)
        kinds = ", ".join(f"{k!r} ({type(space.spaces[k]).__name__})"  # type: ignore[attr-defined]
                          for k in drop)
        # The id as typed: without the "module:" that loads its package.
        _log.warning("rlloop: %s: leaving out observation %s: no encoder reads it",
                     env_id.rpartition(":")[2], kinds)
    keep = [k for k in space.spaces if k not in drop]  # type: ignore[attr-defined]
    return FilterObservation(env, keep)
