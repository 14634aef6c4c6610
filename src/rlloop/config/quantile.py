"""The quantile family's settings (QR-DQN, TQC): torch-free, checked when built, each field
with the docstring the docs' hyperparameter tables show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlloop.config.offpolicy import DQNConfig, SACConfig
from rlloop.errors import ConfigError


@dataclass
class QRDQNConfig(DQNConfig):
    """QR-DQN hyperparameters: DQN's (its replay variants, epsilon schedule, target
    cadence and action masks) plus the number of quantiles; defaults are sb3-contrib's
    QR-DQN defaults, in rlloop's units."""

    section: ClassVar[str] = "qrdqn"

    n_quantiles: int = 200
    """Quantiles of the return distribution each action's head predicts (at the
    midpoints (i + 0.5) / n_quantiles); Q is their mean."""
    max_grad_norm: float | None = None
    """Clip the global gradient norm to this (None: off, as sb3-contrib's QR-DQN)."""
    exploration_initial_eps: float = 1.0
    """Epsilon at env step 0."""
    exploration_final_eps: float = 0.01
    """Epsilon after exploration_steps env steps (sb3-contrib's QR-DQN default)."""
    exploration_steps: int = 5_000
    """Env steps over which epsilon decays linearly (sb3-contrib's exploration_fraction
    0.005 of a 1M-step budget; a fraction would move with the budget, breaking resume)."""
    lr: float = 5e-5
    """Adam learning rate (sb3-contrib's QR-DQN default)."""
    adam_eps: float = 0.01 / 32
    """Adam epsilon (sb3-contrib's 0.01 / batch_size, from the QR-DQN paper, at the
    default batch_size 32; a preset with another batch size sets its own)."""

    def __post_init__(self) -> None:
        # The quantile head is checked before DQN's checks, whose messages name dqn's knobs.
        if self.n_quantiles <= 0:
            raise ConfigError(f"qrdqn.n_quantiles must be > 0, got {self.n_quantiles}")
        for name, why in (("dueling", "a dueling head of quantiles"),
                          ("manual_backward", "the hand-derived backward pass"),
                          ("compile", "torch.compile of the quantile update")):
            if getattr(self, name) is True:  # manual_backward's auto: not for quantiles
                raise ConfigError(f"qrdqn.{name} is not supported yet ({why}); set "
                                  f"qrdqn.{name}=false or use dqn")
        super().__post_init__()


@dataclass
class TQCConfig(SACConfig):
    """TQC hyperparameters: SAC's (entropy tuning, gSDE, the off-policy cadence) plus the
    quantile critics; defaults are sb3-contrib's TQC defaults."""

    section: ClassVar[str] = "tqc"

    n_critics: int = 2
    """Critics, each predicting n_quantiles quantiles of the return of (s, a)."""
    n_quantiles: int = 25
    """Quantiles per critic."""
    top_quantiles_to_drop_per_net: int = 2
    """Of the target's pooled n_critics * n_quantiles quantiles, drop the largest
    n_critics * this many (the truncation that controls overestimation)."""

    def __post_init__(self) -> None:
        for name in ("n_critics", "n_quantiles"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"tqc.{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.top_quantiles_to_drop_per_net < self.n_quantiles:
            raise ConfigError(f"tqc.top_quantiles_to_drop_per_net must be in [0, "
                              f"tqc.n_quantiles) = [0, {self.n_quantiles}) to keep a target "
                              f"quantile, got {self.top_quantiles_to_drop_per_net}")
        if self.compile:
            raise ConfigError("tqc.compile is not supported yet (torch.compile of the "
                              "quantile critics' update); set tqc.compile=false or use sac")
        super().__post_init__()
