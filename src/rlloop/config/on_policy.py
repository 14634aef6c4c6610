"""The settings PPO and A2C share: one rollout of ``rollout_steps`` per env, GAE, an
actor-critic network and the observation and reward treatments, each meaning the same in
both. Torch-free, as every config module; :mod:`rlloop.config.ppo` and
:mod:`rlloop.config.a2c` add what each algorithm has alone (PPO's epochs, minibatches and
clipping; A2C's optimiser choice)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rlloop.config.gradient_clip import GradientClip
from rlloop.config.network_choices import ENCODERS, check_cnn_precision, check_net_path
from rlloop.config.schedules import ScheduleError, make_schedule, schedule_spec
from rlloop.config.unused_settings import Dependency, Replacement
from rlloop.errors import ConfigError, check_finite, check_init_log_std


@dataclass
class OnPolicyConfig:
    """What an on-policy actor-critic collects and learns from; an algorithm's config
    subclasses it with its own ``section`` (the YAML key and the prefix of its errors)."""

    section: ClassVar[str] = "on_policy"
    UNUSED_WHEN: ClassVar[tuple[Dependency, ...]] = (
        ("use_sde", (False,), ("sde_sample_freq", "full_std", "use_expln")),
        ("lr_schedule", ("constant",), ("lr_decay_steps",)),
        ("max_grad_norm", (None,), ("grad_clip_by",)),
    )
    #: A custom network is the actor's and critic's whole body: these shape rlloop's own
    #: (so do hidden and activation, left out: presets set them, a user rarely beside a net).
    REPLACED_BY: ClassVar[tuple[Replacement, ...]] = (("net", ("encoder", "cnn_precision")),)

    rollout_steps: int = 128
    """Env steps per env per iteration (T); the batch is T * num_envs samples."""
    cuda_graph: bool = False
    """On a CUDA device with a native env, record each rollout's collection (policy,
    sampling, env physics, storage) once as a CUDA graph and replay it: one launch per
    rollout instead of dozens per env step, where the host's launching, not the GPU,
    bounds collection. The same numbers as without it; feed-forward policies without
    gSDE or observation normalisation only."""
    lr: float = 3e-4
    """Learning rate (start value when lr_schedule is linear)."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """"linear" decays lr to 0 over lr_decay_steps env steps; "constant" keeps it."""
    lr_decay_steps: int = 200_000
    """Env steps of the linear decay. Deliberately not tied to total_env_steps, so a run
    cut short and resumed with a larger budget follows the same schedule."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    vf_coef: float = 1.0
    """Value loss weight (the loss is 1/2 (V - R)^2: twice SB3's vf_coef is the same update)."""
    ent_coef: float | dict[str, Any] = 0.0
    """Entropy bonus weight: a number, or a schedule on the env-step timeline such as
    {type: linear, start: 0.01, end: 0.0, steps: 200000}."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    max_grad_norm: float | None = 0.5
    """Gradient clipping threshold (None: off)."""
    grad_clip_by: Literal["global_norm", "norm", "value"] = "global_norm"
    """How gradients are clipped: all params together, per tensor, or elementwise."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer sizes of the actor and the critic MLPs."""
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    """Hidden activation."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions; with gSDE of
    the noise matrix entries: SB3's log_std_init)."""
    use_sde: bool = False
    """Box actions: explore with gSDE (a noise matrix on the actor's last hidden
    features, held for sde_sample_freq steps) instead of independent Gaussian noise."""
    sde_sample_freq: int = -1
    """gSDE: env steps (per env) between new noise matrices; -1: only at the start of
    each rollout."""
    full_std: bool = True
    """gSDE: one std per (feature, action) pair; false: one per feature."""
    use_expln: bool = False
    """gSDE: std = expln(log_std) (exp below 0, log1p + 1 above) instead of exp."""
    ortho_init: bool = True
    """Orthogonal initialisation of the layers (false: PyTorch's default)."""
    net: str | None = None
    """A custom network for the actor and the critic bodies as module:Class, called as
    Class(obs_shape) and returning an nn.Module with a features_dim attribute
    (None: MLPs of `hidden` units, or the encoder below). It replaces the encoder."""
    encoder: str = "auto"
    """Observation encoder: "auto" (Nature CNN for image observations, else the MLP),
    "mlp" (flattened observations, pixels too) or "nature_cnn". With the CNN the policy
    and value heads are linear on its shared 512 features (hidden is unused)."""
    cnn_precision: str = "float32"
    """What the Nature CNN computes in: "float32", or "bfloat16" (its convolutions and
    linear layer under torch.autocast, forward and backward; weights, optimiser, heads and
    losses stay float32). Several times faster on CPUs with bfloat16 matrix units (Intel
    AMX) and on GPUs, at bfloat16's 8-bit mantissa in the features."""
    normalize_obs: bool = False
    """Standardise observations with running statistics."""
    clip_rewards: bool = False
    """Learn from the sign of each reward (Atari's convention); episode returns are still
    logged unclipped."""
    normalize_rewards: bool = False
    """Scale rewards by the running std of the discounted return."""
    action_mask: bool | Literal["auto"] = "auto"
    """Invalid-action masking from the env's info["action_mask"] (Discrete actions): masked
    actions get a probability of 0 when acting and in the loss. auto: on when the env gives
    masks; true: required; false: off (the mask stays an observation feature)."""

    def __post_init__(self) -> None:
        check_finite(self.section, self)
        for name in ("rollout_steps", "lr_decay_steps"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.section}.{name} must be > 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"{self.section}.lr must be > 0, got {self.lr}")
        if self.vf_coef < 0:
            raise ConfigError(
                f"{self.section}.vf_coef must be >= 0 (a negative weight "
                f"trains the critic away from the returns), got {self.vf_coef}"
            )
        check_init_log_std(f"{self.section}.init_log_std", self.init_log_std)
        if not 0 < self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ConfigError(
                f"{self.section}.gamma must be in (0, 1] and {self.section}.gae_lambda in [0, 1]"
            )
        if lowest_value(f"{self.section}.ent_coef", self.ent_coef) < 0:
            raise ConfigError(
                f"{self.section}.ent_coef must be >= 0 (a negative weight "
                "rewards the policy for losing its entropy: it stops exploring), "
                f"got {self.ent_coef}; use 0 for no entropy bonus"
            )
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ConfigError(
                f"{self.section}.hidden must be a non-empty list of sizes > 0, got {self.hidden}"
            )
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise ConfigError(
                f"{self.section}.sde_sample_freq must be > 0 or -1 (once per "
                f"rollout), got {self.sde_sample_freq}"
            )
        if self.net is not None:
            check_net_path(self.net, f"{self.section}.net")
        if self.cuda_graph:
            what = "use_sde" if self.use_sde else "normalize_obs" if self.normalize_obs else None
            if what is not None:
                raise ConfigError(
                    f"{self.section}.cuda_graph cannot capture a rollout with "
                    f"{self.section}.{what}; drop one of the two"
                )
        GradientClip(self.max_grad_norm, self.grad_clip_by)
        if self.encoder not in ENCODERS:
            raise ConfigError(
                f"{self.section}.encoder must be one of {list(ENCODERS)}, got {self.encoder!r}"
            )
        check_cnn_precision(self.cnn_precision, f"{self.section}.cnn_precision")

    def check_batch(self, num_envs: int) -> None:
        """ConfigError for a batch ``num_envs`` envs cannot fill (none here: every update
        learns from the whole rollout)."""


def start_value(name: str, value: float | dict[str, Any]) -> float:
    """The value of a scalar-or-schedule setting ``name`` (``section.key``) at env step 0
    (ConfigError if unbuildable)."""
    try:
        return make_schedule(value)(0)
    except ScheduleError as e:
        raise ConfigError(f"{name}: {e}") from None


def lowest_value(name: str, value: float | dict[str, Any]) -> float:
    """The lowest value a scalar-or-schedule setting ``name`` takes: every built-in
    schedule stays between its start and end values (or its points' values)."""
    start_value(name, value)  # ConfigError if unbuildable
    spec = schedule_spec(make_schedule(value))
    values = [spec[key] for key in ("value", "start", "end") if key in spec]
    return float(min(values + [y for _, y in spec.get("points", ())]))
