"""A2C's settings (section ``a2c``): :class:`~rlloop.config.on_policy.OnPolicyConfig`'s
fields with Stable-Baselines3's A2C defaults, and the optimiser. Torch-free, as every
config module; :mod:`rlloop.algorithms.a2c` uses it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from rlloop.config.on_policy import OnPolicyConfig
from rlloop.errors import ConfigError


@dataclass
class A2CConfig(OnPolicyConfig):
    """A2C hyperparameters.

    Defaults are Stable-Baselines3's A2C defaults in rlloop's units: 5 steps per env and one
    gradient step on the whole rollout (no epochs, no minibatches), RMSprop (alpha 0.99, eps
    1e-5), ``gae_lambda=1`` (n-step returns), no advantage standardisation. SB3's
    ``vf_coef=0.5`` is 1.0 here (rlloop's value loss carries a factor 1/2). Tuned values per
    env live in the presets (``rlloop presets a2c``)."""

    section: ClassVar[str] = "a2c"

    rollout_steps: int = 5
    """Env steps per env per iteration (T); each update learns from all T * num_envs
    samples in one gradient step."""
    lr: float = 7e-4
    """Learning rate (start value when lr_schedule is linear)."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives the n-step returns of the A2C paper."""
    normalize_advantages: bool = False
    """Standardise advantages over the rollout (off in the A2C paper and in SB3)."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """The optimiser: "rmsprop" (PyTorch's RMSprop, as SB3's A2C uses by default) or
    "adam" (SB3's use_rms_prop=False)."""
    optimizer_eps: float = 1e-5
    """The optimiser's epsilon (SB3's rms_prop_eps; SB3 gives Adam 1e-5 too)."""
    rmsprop_alpha: float = 0.99
    """RMSprop's smoothing constant of the squared-gradient average."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.optimizer_eps <= 0:
            raise ConfigError(f"a2c.optimizer_eps must be > 0, got {self.optimizer_eps}")
        if not 0 <= self.rmsprop_alpha < 1:
            raise ConfigError(f"a2c.rmsprop_alpha must be in [0, 1), got {self.rmsprop_alpha}")
