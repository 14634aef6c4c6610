"""Invalid-action masking: a legal-action mask rides at the end of each observation.

Board games (PettingZoo's classic envs) and Gymnasium envs that put ``info["action_mask"]``
next to their observations get that mask appended to the observation vector by the env
layer (``EnvSpec.action_mask`` says how many trailing features it takes). Keeping the mask
inside the observation lets rollouts and replay buffers store it with every sample (next
states' masks too) without a new field, and everything stays on the device.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rlloop.envs.core import Discrete, EnvSpec
from rlloop.errors import ConfigError

#: Logit (or Q-value) of an illegal action: finite, so that ``p * log p`` is 0, not NaN,
#: in the entropy, and a masked max never meets ``-inf - -inf``.
ILLEGAL_LOGIT = -1e9

def legal_actions(flat_obs: Tensor, mask_dims: int) -> Tensor:
    """``[B, A]`` bool legal actions from the last ``mask_dims`` features of ``[B, D]``.

    A row whose mask is all zero (the agent is not to move, or the episode is over) gets
    every action, since that action is ignored anyway."""
    legal = flat_obs[:, -mask_dims:] > 0
    return legal | ~legal.any(-1, keepdim=True)


def mask_scores(scores: Tensor, legal: Tensor) -> Tensor:
    """Logits or Q-values ``[B, A]`` with the illegal entries pushed to ``ILLEGAL_LOGIT``."""
    return scores.masked_fill(~legal, ILLEGAL_LOGIT)


def resolve_action_mask(setting: Any, spec: EnvSpec, section: str) -> int:
    """How many trailing observation features are the action mask the policy applies
    (0: no masking); ``ConfigError`` when masking is required but impossible."""
    if setting is False or (setting == "auto" and not spec.action_mask):
        return 0
    if setting not in (True, "auto"):
        raise ConfigError(f"{section}.action_mask must be auto, true or false, got {setting!r}")
    if not isinstance(spec.action_space, Discrete):
        raise ConfigError(f"{section}.action_mask needs Discrete actions but {spec.env_id} has "
                          f"{type(spec.action_space).__name__} ones; drop {section}.action_mask")
    if not spec.action_mask:
        raise ConfigError(f"{section}.action_mask=true but {spec.env_id} gives no "
                          "info['action_mask'] with vector or Dict observations, nor an "
                          "'action_mask' entry in a Dict observation (an image observation "
                          "carries its mask as such an entry); set "
                          f"{section}.action_mask=auto or false")
    return spec.action_mask
