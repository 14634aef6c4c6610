"""CrossQ's settings: torch-free, checked when built, each field with the docstring the
docs' hyperparameter table shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlloop.config.offpolicy import SACConfig, check_hidden
from rlloop.errors import ConfigError


@dataclass
class CrossQConfig(SACConfig):
    """CrossQ hyperparameters: SAC's (entropy tuning, the off-policy cadence) without the
    target critics, plus batch renormalisation and the policy delay; defaults are
    sb3-contrib's CrossQ defaults."""

    section: ClassVar[str] = "crossq"

    lr: float = 1e-3
    """Adam learning rate of the actor, the critics and alpha."""
    adam_beta1: float = 0.5
    """Adam's first-moment decay for the actor and the critics (the paper's and
    sb3-contrib's 0.5; the second is 0.999). The temperature's Adam keeps (0.9, 0.999)."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer sizes of the actor (ReLU), each preceded by a batch renormalisation."""
    critic_hidden: list[int] = field(default_factory=lambda: [1024, 1024])
    """Hidden layer sizes of each critic (ReLU), each layer preceded by a batch
    renormalisation (sb3-contrib's [1024, 1024]; the paper's are 2048 wide)."""
    policy_delay: int = 3
    """Critic updates per actor (and alpha) update."""
    batch_norm_momentum: float = 0.01
    """Weight of each training batch in the running mean and variance of every batch
    renormalisation (running = running + momentum * (batch - running))."""
    batch_norm_eps: float = 0.001
    """Added to the variance before its square root in every batch renormalisation."""
    renorm_warmup_steps: int = 100_000
    """Training passes of a batch renormalisation that normalise with the batch's own
    statistics (plain batch norm); after them the batch statistics are corrected towards
    the running ones (r clipped to [1/3, 3], d to [-5, 5]). The critics make one pass per
    gradient update, the actor one per policy_delay."""
    tau: float | None = None  # type: ignore[assignment]
    """None: CrossQ has no target critics (its TD target reads the online critics); a
    value is refused."""
    target_update_interval: int | None = None  # type: ignore[assignment]
    """None: no target critics to update; a value is refused."""

    def __post_init__(self) -> None:
        s = self.section
        if self.use_sde:
            raise ConfigError(f"{s}.use_sde is not supported yet (gSDE with batch-"
                              f"renormalised features); set {s}.use_sde=false or use sac")
        if self.compile:
            raise ConfigError(f"{s}.compile is not supported yet (torch.compile of the two-"
                              f"step update); set {s}.compile=false")
        super().__post_init__()
        if self.policy_delay <= 0 or self.renorm_warmup_steps < 0:
            raise ConfigError(f"{s}.policy_delay must be > 0 and {s}.renorm_warmup_steps "
                              f">= 0, got {self.policy_delay}, {self.renorm_warmup_steps}")
        if not 0 < self.batch_norm_momentum <= 1 or self.batch_norm_eps <= 0:
            raise ConfigError(f"{s}.batch_norm_momentum must be in (0, 1] and "
                              f"{s}.batch_norm_eps > 0, got {self.batch_norm_momentum}, "
                              f"{self.batch_norm_eps}")
        if not 0 <= self.adam_beta1 < 1:
            raise ConfigError(f"{s}.adam_beta1 must be in [0, 1), got {self.adam_beta1}")
        check_hidden(s, self.critic_hidden)

    def check_target_networks(self) -> None:
        for name in ("tau", "target_update_interval"):
            if getattr(self, name) is not None:
                raise ConfigError(
                    f"crossq.{name}={getattr(self, name)!r}: CrossQ has no target networks "
                    f"(its critics bootstrap from themselves, batch-renormalised); drop "
                    f"crossq.{name}, or use sac or tqc for target critics")
