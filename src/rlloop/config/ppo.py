"""PPO's and multi-agent PPO's settings: dataclasses with a docstring under every field,
checked when built. Torch-free, so that the CLI checks a config (its keys and values)
before torch's second of import; :mod:`rlloop.algorithms.ppo` and
:mod:`rlloop.algorithms.ma_ppo` use them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rlloop.config.gradient_clip import GradientClip
from rlloop.config.network_choices import ENCODERS, check_cnn_precision, check_net_path
from rlloop.config.schedules import ScheduleError, make_schedule, schedule_spec
from rlloop.config.unused_settings import Dependency, Replacement
from rlloop.errors import ConfigError, check_finite, check_init_log_std

#: ``ppo.micro_batch="auto"`` on a CPU: 1024 rows of a 256-unit layer are 1 MB of
#: activations, which stay in a core's cache through the backward pass.
AUTO_MICRO_BATCH = 1024


@dataclass
class PPOConfig:
    """PPO hyperparameters.

Defaults are Stable-Baselines3's PPO defaults in rlloop's units, a robust start for an env
without a preset: SB3's 2048-step rollout of one env is 16 envs x 128 steps here (with the
default num_envs), and SB3's ``vf_coef=0.5`` is 1.0 here (rlloop's value loss carries a
factor 1/2). Tuned values per env live in the presets (``rlloop presets ppo``)."""

    section: ClassVar[str] = "ppo"
    UNUSED_WHEN: ClassVar[tuple[Dependency, ...]] = (
        ("use_sde", (False,), ("sde_sample_freq", "full_std", "use_expln")),
        ("lr_schedule", ("constant",), ("lr_decay_steps",)),
        ("recurrent", (None,), ("recurrent_hidden", "seq_len")),
        ("max_grad_norm", (None,), ("grad_clip_by",)),
    )
    #: A custom network is the actor's and critic's whole body: these shape rlloop's own
    #: (so do hidden and activation, left out: presets set them, a user rarely beside a net).
    REPLACED_BY: ClassVar[tuple[Replacement, ...]] = (("net", ("encoder", "cnn_precision")),)

    rollout_steps: int = 128
    """Env steps per env per iteration (T); the batch is T * num_envs samples."""
    num_epochs: int = 10
    """Passes over each batch."""
    minibatch_size: int = 64
    """Samples per gradient step; must not exceed T * num_envs."""
    micro_batch: int | Literal["auto"] | None = "auto"
    """Rows per forward/backward pass. A minibatch with more rows is passed in chunks of
    at most this many whose gradients add up to the same update (up to float rounding),
    so a large minibatch's activations stay in the CPU's cache (1.8x faster per epoch at
    65,536 rows of a 256x256 MLP). "auto": 1024 rows on a CPU, whole minibatches on
    other devices; null: whole minibatches."""
    compile: bool = False
    """Run each micro-batch's forward pass and loss (and so their backward) through
    torch.compile: fused elementwise kernels, about 15% off a large-batch update on a CPU.
    The first update compiles (seconds to a minute); feed-forward policies only."""
    cuda_graph: bool = False
    """On a CUDA device with a native env, record each rollout's collection (policy,
    sampling, env physics, storage) once as a CUDA graph and replay it: one launch per
    rollout instead of dozens per env step, where the host's launching, not the GPU,
    bounds collection. The same numbers as without it; feed-forward policies without
    gSDE or observation normalisation only."""
    lr: float = 3e-4
    """Adam learning rate (start value when lr_schedule is linear)."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """"linear" decays lr to 0 over lr_decay_steps env steps; "constant" keeps it."""
    lr_decay_steps: int = 200_000
    """Env steps of the linear decay. Deliberately not tied to total_env_steps, so a run
    cut short and resumed with a larger budget follows the same schedule."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_coef: float | dict[str, Any] = 0.2
    """Surrogate clipping epsilon: a number, or a schedule on the env-step timeline such as
    {type: linear, start: 0.2, end: 0.05, steps: 200000}."""
    vf_coef: float = 1.0
    """Value loss weight (the loss is 1/2 (V - R)^2: twice SB3's vf_coef is the same update)."""
    ent_coef: float | dict[str, Any] = 0.0
    """Entropy bonus weight: a number or a schedule (as for clip_coef)."""
    clip_vf: float | None = None
    """Clip the value update to +-clip_vf around the old value (None: off)."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    target_kl: float | None = None
    """Stop the epoch loop once approx-KL exceeds this (None: never)."""
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
    recurrent: Literal["lstm", "gru"] | None = None
    """A recurrent policy (memory for partially observed envs): an LSTM or GRU cell between
    the observation and the actor and critic MLPs (null: feed-forward)."""
    recurrent_hidden: int = 64
    """Width of the recurrent cell."""
    seq_len: int = 16
    """Steps per training sequence (truncated backpropagation through time); minibatches
    hold minibatch_size // seq_len whole sequences."""
    action_mask: bool | Literal["auto"] = "auto"
    """Invalid-action masking from the env's info["action_mask"] (Discrete actions): masked
    actions get a probability of 0 when acting and in the loss. auto: on when the env gives
    masks; true: required; false: off (the mask stays an observation feature)."""

    def __post_init__(self) -> None:
        check_finite(self.section, self)
        for name in ("rollout_steps", "num_epochs", "minibatch_size", "lr_decay_steps",
                     "recurrent_hidden", "seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.section}.{name} must be > 0, got {getattr(self, name)}")
        if isinstance(self.micro_batch, int) and self.micro_batch <= 0:
            raise ConfigError(f"{self.section}.micro_batch must be > 0, \"auto\" or null (whole "
                              f"minibatches), got {self.micro_batch}")
        if self.lr <= 0:
            raise ConfigError(f"{self.section}.lr must be > 0, got {self.lr}")
        if self.adam_eps <= 0:
            raise ConfigError(f"{self.section}.adam_eps must be > 0, got {self.adam_eps}")
        if self.vf_coef < 0:
            raise ConfigError(f"{self.section}.vf_coef must be >= 0 (a negative weight "
                              f"trains the critic away from the returns), got {self.vf_coef}")
        if self.clip_vf is not None and self.clip_vf <= 0:
            raise ConfigError(f"{self.section}.clip_vf must be > 0 (or null: no value "
                              f"clipping), got {self.clip_vf}")
        check_init_log_std(f"{self.section}.init_log_std", self.init_log_std)
        if not 0 < self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ConfigError(f"{self.section}.gamma must be in (0, 1] and "
                              f"{self.section}.gae_lambda in [0, 1]")
        if _start_value(f"{self.section}.clip_coef", self.clip_coef) <= 0:
            raise ConfigError(f"{self.section}.clip_coef must be > 0, got {self.clip_coef}")
        if _lowest_value(f"{self.section}.ent_coef", self.ent_coef) < 0:
            raise ConfigError(f"{self.section}.ent_coef must be >= 0 (a negative weight "
                              "rewards the policy for losing its entropy: it stops exploring), "
                              f"got {self.ent_coef}; use 0 for no entropy bonus")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ConfigError(f"{self.section}.target_kl must be > 0 (or null: never stop "
                              f"early), got {self.target_kl}")
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ConfigError(
                f"{self.section}.hidden must be a non-empty list of sizes > 0, got {self.hidden}")
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise ConfigError(f"{self.section}.sde_sample_freq must be > 0 or -1 (once per "
                              f"rollout), got {self.sde_sample_freq}")
        if self.net is not None:
            check_net_path(self.net, f"{self.section}.net")
        if self.recurrent is not None:
            # The recurrent policy is its own network: the cells on the (encoded)
            # observation, then the heads; it has no custom body or gSDE head.
            what = "net" if self.net is not None else "use_sde" if self.use_sde else None
            if what is not None:
                raise ConfigError(f"{self.section}.{what} works with feed-forward policies "
                                  f"only; drop {self.section}.{what} or "
                                  f"{self.section}.recurrent")
            for limit, why in (("rollout_steps", "sequences would be mostly padding"),
                               ("minibatch_size", "a minibatch holds whole sequences")):
                if self.seq_len > getattr(self, limit):
                    raise ConfigError(
                        f"{self.section}.seq_len={self.seq_len} is longer than "
                        f"{self.section}.{limit}={getattr(self, limit)} ({why}); lower "
                        f"{self.section}.seq_len or raise {self.section}.{limit}")
        if self.compile and self.recurrent is not None:
            raise ConfigError(f"{self.section}.compile covers feed-forward policies only; drop "
                              f"{self.section}.compile or {self.section}.recurrent")
        if self.cuda_graph:
            what = ("recurrent" if self.recurrent is not None else "use_sde"
                    if self.use_sde else "normalize_obs" if self.normalize_obs else None)
            if what is not None:
                raise ConfigError(f"{self.section}.cuda_graph cannot capture a rollout with "
                                  f"{self.section}.{what}; drop one of the two")
        GradientClip(self.max_grad_norm, self.grad_clip_by)
        if self.encoder not in ENCODERS:
            raise ConfigError(f"{self.section}.encoder must be one of {list(ENCODERS)}, "
                              f"got {self.encoder!r}")
        check_cnn_precision(self.cnn_precision, f"{self.section}.cnn_precision")

    def check_batch(self, num_envs: int) -> None:
        batch = self.rollout_steps * num_envs
        if self.minibatch_size > batch:
            raise ConfigError(
                f"{self.section}.minibatch_size={self.minibatch_size} is larger than the batch "
                f"(rollout_steps * num_envs = {batch}); lower it or collect more")


def _start_value(name: str, value: float | dict[str, Any]) -> float:
    """The value of a scalar-or-schedule setting ``name`` (``section.key``) at env step 0
    (ConfigError if unbuildable)."""
    try:
        return make_schedule(value)(0)
    except ScheduleError as e:
        raise ConfigError(f"{name}: {e}") from None


def _lowest_value(name: str, value: float | dict[str, Any]) -> float:
    """The lowest value a scalar-or-schedule setting ``name`` takes: every built-in
    schedule stays between its start and end values (or its points' values)."""
    _start_value(name, value)  # ConfigError if unbuildable
    spec = schedule_spec(make_schedule(value))
    values = [spec[key] for key in ("value", "start", "end") if key in spec]
    return float(min(values + [y for _, y in spec.get("points", ())]))


@dataclass
class MultiAgentPPOConfig(PPOConfig):
    """PPO's hyperparameters (same meaning, per module) plus how agents map to modules."""

    section: ClassVar[str] = "ma_ppo"

    policy_mapping: Literal["shared", "independent"] = "shared"
    """shared: one module (default_policy) for all agents; independent: one per agent."""
    policies_to_train: list[str] | None = None
    """Module ids to train (None: all; with a league always just 'main')."""
    league_every: int = 0
    """Self-play league: every k iterations a frozen copy of 'main' becomes an opponent
    module (0: no league). Needs a two-player env whose agents share their spaces."""
    league_size: int = 5
    """Most snapshots kept in the league; the oldest leaves when a new one comes."""
    eval_opponent: Literal["random", "policy"] = "random"
    """Who the evaluated agent plays: uniformly random (legal) moves, or the modules."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.league_every < 0:
            raise ConfigError(f"ma_ppo.league_every must be >= 0, got {self.league_every}")
        if self.league_size < 1:
            raise ConfigError(f"ma_ppo.league_size must be >= 1, got {self.league_size}")
        if self.league_every and self.policy_mapping == "independent":
            raise ConfigError("a self-play league maps agents to 'main' and its snapshots, "
                              "not one module per agent; drop ma_ppo.league_every or "
                              "ma_ppo.policy_mapping=independent")
        if self.use_sde or self.net is not None or self.cuda_graph:
            raise ConfigError("ma_ppo supports neither gSDE, custom networks nor CUDA "
                              "graphs; drop ma_ppo.use_sde, ma_ppo.net and ma_ppo.cuda_graph")
        if self.normalize_obs or self.normalize_rewards:
            raise ConfigError("ma_ppo does not normalise observations or rewards; set "
                              "ma_ppo.normalize_obs=false and ma_ppo.normalize_rewards=false")
