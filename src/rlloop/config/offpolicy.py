"""The off-policy family's settings (DQN, SAC, TD3 and what they share): dataclasses with
a docstring under every field, checked when built. Torch-free, so that the CLI checks a
config before torch's second of import; the algorithms' modules use them."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rlloop.config.gradient_clip import GradientClip
from rlloop.config.network_choices import ENCODERS, check_cnn_precision
from rlloop.config.unused_settings import Dependency
from rlloop.errors import ConfigError, check_finite, check_init_log_std

#: The parts a config names (setting -> the registry of
#: :mod:`rlloop.algorithms.offpolicy_parts` that builds them) and the names rlloop ships for
#: each.
PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "replay": ("REPLAY_BUFFERS", ("uniform", "prioritized", "frames", "her")),
    "step_processor": ("STEP_PROCESSORS", ("nstep",)),
    "evaluator": ("EVALUATORS", ("deterministic", "stochastic")),
    "recorder": ("RECORDERS", ("last", "mean")),
}


def part_names(setting: str) -> list[str]:
    """The names ``setting`` accepts: rlloop's own parts, or once the registries are
    imported (torch code, where a user may register more) the names they hold."""
    registry_name, builtin = PARTS[setting]
    registries = sys.modules.get("rlloop.algorithms.offpolicy_parts")
    return sorted(getattr(registries, registry_name) if registries is not None else builtin)


@dataclass
class OffPolicyConfig:
    """Settings every off-policy algorithm shares (its section: ``dqn.``, ``sac.``, ...)."""

    section: ClassVar[str] = "offpolicy"
    supports_prioritized: ClassVar[bool] = False
    UNUSED_WHEN: ClassVar[tuple[Dependency, ...]] = (
        ("replay", ("uniform", "frames", "her"), ("per_alpha", "per_beta", "per_beta_steps")),
        ("replay", ("uniform", "prioritized", "frames"),
         ("her_strategy", "her_n_sampled_goal", "her_copy_info")),
        ("lr_schedule", ("constant",), ("lr_decay_steps",)),
    )

    buffer_size: int = 1_000_000
    """Replay capacity in transitions; the oldest are overwritten first."""
    replay: str = "uniform"
    """Replay buffer (REPLAY_BUFFERS): "uniform", "prioritized" (DQN only), "frames"
    (stacked uint8 frames such as Atari's, each frame stored once; one-step transitions),
    or "her" (hindsight experience replay for goal envs: Dict observations with
    achieved_goal and desired_goal, and the env's compute_reward; one-step transitions)."""
    per_alpha: float = 0.6
    """Prioritized replay: prioritisation exponent (0 is uniform)."""
    per_beta: float = 0.4
    """Prioritized replay: importance-sampling exponent at the start, annealed to 1."""
    per_beta_steps: int = 100_000
    """Prioritized replay: env steps over which beta is annealed to 1."""
    her_strategy: Literal["future", "final", "episode"] = "future"
    """HER: the achieved goal that relabels a transition: "future" (one reached at or after
    it in its episode), "final" (its episode's last) or "episode" (any of its episode)."""
    her_n_sampled_goal: int = 4
    """HER: relabelled transitions per real one (a batch holds n/(n+1) relabelled)."""
    her_copy_info: bool = False
    """HER: keep each step's info dict (numbers and numeric arrays) and pass the
    relabelled transitions' infos to the env's compute_reward, for a reward that reads
    info (SB3's copy_info_dict); false passes an empty dict per transition."""
    step_processor: str = "nstep"
    """Step processor (STEP_PROCESSORS): "nstep" sums n_step rewards per transition and
    keeps the final observation of truncated episodes for bootstrapping."""
    n_step: int = 1
    """Rewards summed per transition (1: one-step transitions)."""
    gamma: float = 0.99
    """Discount factor."""
    batch_size: int = 256
    """Transitions per gradient update."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """"linear" decays every optimiser's learning rate from lr to 0 over lr_decay_steps env
    steps (rl-zoo's lin_ values); "constant" keeps it."""
    lr_decay_steps: int = 1_000_000
    """Env steps of the linear decay (not tied to total_env_steps, so a run cut short and
    resumed with a larger budget follows the same schedule)."""
    learning_starts: int = 100
    """Warm-up: env steps of uniformly random actions; optimisation steps are skipped
    until more env steps than this were taken."""
    opt_interval: int = 1
    """Env steps (summed over envs) between optimisation steps (SB3's train_freq)."""
    gradient_steps: int = 1
    """Gradient updates per optimisation step, each on a freshly sampled batch."""
    eval_interval: int = 1000
    """Optimisation steps between evaluations; a new best is saved under <run>/best."""
    record_interval: int = 100
    """Optimisation steps between records (env/fps, opt/steps_per_sec, losses)."""
    save_interval: int = 0
    """Optimisation steps between checkpoints <run>/checkpoints/<opt steps> (0: never;
    a final checkpoint is always written)."""
    max_opts: int = 0
    """Stop after this many optimisation steps (0: no limit besides total_env_steps)."""
    evaluator: str = "deterministic"
    """Evaluator (EVALUATORS): "deterministic" (greedy or mean action) or "stochastic"."""
    recorder: str = "mean"
    """Recorder (RECORDERS): "mean" of the stats since the last record, or "last"."""
    clip_rewards: bool = False
    """Learn from the sign of each reward (Atari's convention); episode returns are still
    logged unclipped."""
    normalize_obs: bool = False
    """Standardise observations with running mean/std statistics (SB3's VecNormalize):
    every env step updates them, the policy acts on standardised observations, evaluation
    and ``predict`` read them, checkpoints save them. The replay stores the raw
    observations and a sampled batch is standardised with the statistics of that moment,
    as SB3 does: rows standardised when stored would keep the first steps' unsettled
    statistics for the whole run (SAC then did not learn Pendulum-v1). Vector (float)
    observations, and Dict observations of vector entries (standardised entry by entry,
    after hindsight relabelling with replay=her); not images."""
    normalize_rewards: bool = False
    """Divide rewards by the running std of the discounted return (SB3's VecNormalize
    ``norm_reward``, PPO's ``normalize_rewards``) and clip them at +-10, after
    ``clip_rewards``. As with observations the replay keeps the env's rewards and a
    sampled batch is scaled with the current std; logged and evaluated returns stay the
    env's own."""
    encoder: str = "auto"
    """Observation encoder: "auto" (Nature CNN for image observations, else the MLP),
    "mlp" (flattened observations, pixels too) or "nature_cnn". With the CNN the heads
    are linear on its 512 features (hidden applies to vector observations only). With
    replay=her, "auto" is "mlp" (see ``network_encoder``)."""
    cnn_precision: str = "float32"
    """What the Nature CNN computes in: "float32", or "bfloat16" (its convolutions and
    linear layer under torch.autocast, forward and backward; weights, optimiser, heads and
    losses stay float32). Several times faster on CPUs with bfloat16 matrix units (Intel
    AMX) and on GPUs, at bfloat16's 8-bit mantissa in the features."""
    compile: bool = False
    """Run each gradient update through torch.compile as one graph: loss, gradient,
    clipping and Adam (compiled on the first updates, which takes a while; the README
    says when it pays)."""

    def __post_init__(self) -> None:
        s = self.section
        check_finite(s, self)
        for name in ("buffer_size", "n_step", "batch_size", "opt_interval", "gradient_steps",
                     "eval_interval", "record_interval", "per_beta_steps", "lr_decay_steps"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{s}.{name} must be > 0, got {getattr(self, name)}")
        for name in ("learning_starts", "save_interval", "max_opts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{s}.{name} must be >= 0, got {getattr(self, name)}")
        if self.buffer_size < self.batch_size:
            raise ConfigError(f"{s}.buffer_size={self.buffer_size} holds fewer transitions than "
                              f"one batch ({s}.batch_size={self.batch_size}); raise "
                              f"{s}.buffer_size or lower {s}.batch_size")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"{s}.gamma must be in (0, 1], got {self.gamma}")
        if self.lr_schedule not in ("constant", "linear"):
            raise ConfigError(f"{s}.lr_schedule must be constant or linear, got "
                              f"{self.lr_schedule!r}")
        if self.per_alpha < 0 or not 0 <= self.per_beta <= 1:
            raise ConfigError(f"{s}.per_alpha must be >= 0 and {s}.per_beta in [0, 1]")
        for name in PARTS:
            if getattr(self, name) not in (names := part_names(name)):
                raise ConfigError(f"{s}.{name} must be one of {names}, "
                                  f"got {getattr(self, name)!r}")
        if self.encoder not in ENCODERS:
            raise ConfigError(f"{s}.encoder must be one of {list(ENCODERS)}, "
                              f"got {self.encoder!r}")
        check_cnn_precision(self.cnn_precision, f"{s}.cnn_precision")
        self._check_her()
        if self.replay == "prioritized" and not self.supports_prioritized:
            raise ConfigError(f"{s}.replay=prioritized is supported by dqn only; use uniform")


    @property
    def network_encoder(self) -> str:
        """The encoder the networks are built with: ``encoder``, but "mlp" for "auto" with
        HER. A Dict observation's own encoders (one per entry) feed linear heads, which add
        up what each entry says: a goal-conditioned value needs the goal and the state
        mixed, as one MLP over the flattened entries does (SB3's CombinedExtractor)."""
        return "mlp" if self.replay == "her" and self.encoder == "auto" else self.encoder

    def _check_her(self) -> None:
        s = self.section
        if self.her_strategy not in ("future", "final", "episode"):  # a Python caller's
            raise ConfigError(f"{s}.her_strategy must be one of ['future', 'final', "
                              f"'episode'], got {self.her_strategy!r}")
        if self.her_n_sampled_goal < 1:
            raise ConfigError(f"{s}.her_n_sampled_goal must be >= 1 (relabelled transitions "
                              f"per real one), got {self.her_n_sampled_goal}")
        if self.replay == "her" and self.n_step != 1:
            raise ConfigError(f"{s}.replay=her relabels one-step transitions; set "
                              f"{s}.n_step=1 or {s}.replay=uniform")


def check_hidden(section: str, hidden: list[int]) -> None:
    if not hidden or any(h <= 0 for h in hidden):
        raise ConfigError(f"{section}.hidden must be a non-empty list of sizes > 0, got {hidden}")


@dataclass
class DQNConfig(OffPolicyConfig):
    """DQN hyperparameters (defaults: Stable-Baselines3's DQN defaults, in rlloop's units)."""

    section: ClassVar[str] = "dqn"
    supports_prioritized: ClassVar[bool] = True

    batch_size: int = 32
    """Transitions per gradient update."""
    learning_starts: int = 100
    """Warm-up env steps of uniformly random actions."""
    opt_interval: int = 4
    """Env steps between optimisation steps."""
    lr: float = 1e-4
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    max_grad_norm: float | None = 10.0
    """Clip the global gradient norm to this (None: off)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer sizes of the Q-network (ReLU)."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A)."""
    double_q: bool = False
    """Double-DQN target: the online network picks the next action, the target rates it."""
    target_update_interval: int = 2_500
    """Gradient updates between target-network updates (SB3 counts env steps: its 10,000
    at one update per 4 env steps is 2,500 updates)."""
    tau: float = 1.0
    """Target update: 1 copies the online network (hard), < 1 averages (Polyak)."""
    exploration_initial_eps: float = 1.0
    """Epsilon at env step 0."""
    exploration_final_eps: float = 0.05
    """Epsilon after exploration_steps env steps (also used by stochastic evaluation)."""
    exploration_steps: int = 20_000
    """Env steps over which epsilon decays linearly (SB3's exploration_fraction=0.1 of the
    default 200k-step budget; a fraction would move with the budget, breaking resume)."""
    manual_backward: bool | Literal["auto"] = "auto"
    """Compute the gradient with a hand-derived backward pass instead of autograd
    (rlloop.learners.mlp_backprop; same maths to float rounding, faster on a CPU). auto:
    on a CPU where the Q-network is a plain ReLU MLP and compile is off, else autograd;
    true: required (any other network warns once and uses autograd); false: autograd."""
    action_mask: bool | Literal["auto"] = "auto"
    """Invalid-action masking from the env's info["action_mask"]: greedy and random actions
    come from the legal ones only, and the target's max runs over the next state's legal
    actions. auto: on when the env gives masks; true: required; false: off."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr <= 0 or self.adam_eps <= 0:
            raise ConfigError(f"dqn.lr and dqn.adam_eps must be > 0, got {self.lr}, "
                              f"{self.adam_eps}")
        if self.target_update_interval <= 0 or self.exploration_steps <= 0:
            raise ConfigError("dqn.target_update_interval and dqn.exploration_steps must be > 0")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"dqn.tau must be in (0, 1], got {self.tau}")
        for name in ("exploration_initial_eps", "exploration_final_eps"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"dqn.{name} must be in [0, 1], got {getattr(self, name)}")
        check_hidden("dqn", self.hidden)
        GradientClip(self.max_grad_norm)
        if self.manual_backward not in (True, False, "auto"):
            raise ConfigError(f"dqn.manual_backward must be true, false or auto, got "
                              f"{self.manual_backward!r}")
        if self.manual_backward is True and self.compile:
            raise ConfigError("dqn.manual_backward and dqn.compile exclude each other (the "
                              "hand-derived pass is not compiled); set one of them to false")


@dataclass
class SACConfig(OffPolicyConfig):
    """SAC hyperparameters (defaults: Stable-Baselines3's SAC defaults)."""

    section: ClassVar[str] = "sac"
    UNUSED_WHEN: ClassVar[tuple[Dependency, ...]] = (
        *OffPolicyConfig.UNUSED_WHEN,
        ("use_sde", (False,), ("sde_sample_freq", "init_log_std", "full_std", "use_expln",
                               "use_sde_at_warmup")),
        ("autotune_alpha", (False,), ("target_entropy",)))

    lr: float = 3e-4
    """Adam learning rate of the actor, the critics and alpha."""
    tau: float = 0.005
    """Polyak coefficient of the target critics."""
    target_update_interval: int = 1
    """Gradient updates between target-critic updates."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    autotune_alpha: bool = True
    """Learn alpha so that the policy entropy tracks target_entropy."""
    target_entropy: float | None = None
    """Entropy target of the alpha loss (None: -action_dim)."""
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer sizes of the actor and of each critic (ReLU)."""
    use_sde: bool = False
    """Explore with gSDE (state-dependent noise matrices) instead of independent noise."""
    sde_sample_freq: int = -1
    """gSDE: env steps (per env) between new noise matrices; -1: only at the start of
    each rollout (after each optimisation step)."""
    init_log_std: float = -3.0
    """gSDE: initial log std of the noise matrix entries (SB3's log_std_init)."""
    full_std: bool = True
    """gSDE: one std per (feature, action) pair; false: one per feature."""
    use_expln: bool = False
    """gSDE: std = expln(log_std) (exp below 0, log1p + 1 above) instead of exp."""
    use_sde_at_warmup: bool = False
    """gSDE: act with the policy during warm-up instead of uniformly at random."""

    def __post_init__(self) -> None:
        super().__post_init__()
        s = self.section  # sac, or tqc (whose config extends this one)
        if self.lr <= 0 or self.init_alpha <= 0:
            raise ConfigError(f"{s}.lr and {s}.init_alpha must be > 0, got {self.lr}, "
                              f"{self.init_alpha}")
        self.check_target_networks()
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise ConfigError(f"{s}.sde_sample_freq must be > 0 or -1 (once per rollout), "
                              f"got {self.sde_sample_freq}")
        check_init_log_std(f"{s}.init_log_std", self.init_log_std)
        check_hidden(s, self.hidden)

    def check_target_networks(self) -> None:
        """The target critics' settings (CrossQ, which has none, refuses them instead)."""
        s = self.section
        if not 0 < self.tau <= 1:
            raise ConfigError(f"{s}.tau must be in (0, 1], got {self.tau}")
        if self.target_update_interval <= 0:
            raise ConfigError(f"{s}.target_update_interval must be > 0")


@dataclass
class TD3Config(OffPolicyConfig):
    """TD3 hyperparameters (defaults: Stable-Baselines3's TD3 defaults, noise 0.1)."""

    section: ClassVar[str] = "td3"
    UNUSED_WHEN: ClassVar[tuple[Dependency, ...]] = (
        *OffPolicyConfig.UNUSED_WHEN,
        ("action_noise", ("normal", "none"), ("ou_theta", "ou_dt")),
        ("action_noise", ("none",), ("action_noise_std",)))

    lr: float = 1e-3
    """Adam learning rate of the actor and the critics."""
    tau: float = 0.005
    """Polyak coefficient of the target networks."""
    policy_delay: int = 2
    """Critic updates per actor (and target) update."""
    target_policy_noise: float = 0.2
    """Std of the target smoothing noise (normalised action units)."""
    target_noise_clip: float = 0.5
    """Clip of the target smoothing noise."""
    action_noise: Literal["normal", "ornstein_uhlenbeck", "none"] = "normal"
    """Exploration noise added to mu(s): independent Gaussian, an Ornstein-Uhlenbeck
    process per env (restarted at each episode end), or none."""
    action_noise_std: float = 0.1
    """Std of the Gaussian noise, or the OU process's sigma (normalised action units)."""
    ou_theta: float = 0.15
    """OU mean-reversion rate theta (Stable-Baselines3's default)."""
    ou_dt: float = 1e-2
    """OU time step dt (Stable-Baselines3's default): each step adds
    sigma * sqrt(dt) * N(0, 1) and pulls back by theta * dt."""
    hidden: list[int] = field(default_factory=lambda: [400, 300])
    """Hidden layer sizes of the actor and of each critic (ReLU)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr <= 0 or self.policy_delay <= 0:
            raise ConfigError(f"td3.lr and td3.policy_delay must be > 0, got {self.lr}, "
                              f"{self.policy_delay}")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"td3.tau must be in (0, 1], got {self.tau}")
        for name in ("target_policy_noise", "target_noise_clip", "action_noise_std",
                     "ou_theta"):
            if getattr(self, name) < 0:
                raise ConfigError(f"td3.{name} must be >= 0, got {getattr(self, name)}")
        if self.ou_dt <= 0:
            raise ConfigError(f"td3.ou_dt must be > 0, got {self.ou_dt}")
        check_hidden("td3", self.hidden)
