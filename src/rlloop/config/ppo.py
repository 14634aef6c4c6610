"""PPO's and multi-agent PPO's settings: dataclasses with a docstring under every field,
checked when built. Torch-free, so that the CLI checks a config (its keys and values)
before torch's second of import; :mod:`rlloop.algorithms.ppo` and
:mod:`rlloop.algorithms.ma_ppo` use them. The fields PPO shares with A2C are
:class:`~rlloop.config.on_policy.OnPolicyConfig`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from rlloop.config.on_policy import OnPolicyConfig, start_value
from rlloop.config.unused_settings import Dependency
from rlloop.errors import ConfigError

#: ``ppo.micro_batch="auto"`` on a CPU: 1024 rows of a 256-unit layer are 1 MB of
#: activations, which stay in a core's cache through the backward pass.
AUTO_MICRO_BATCH = 1024


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO hyperparameters.

Defaults are Stable-Baselines3's PPO defaults in rlloop's units, a robust start for an env
without a preset: SB3's 2048-step rollout of one env is 16 envs x 128 steps here (with the
default num_envs), and SB3's ``vf_coef=0.5`` is 1.0 here (rlloop's value loss carries a
factor 1/2). Tuned values per env live in the presets (``rlloop presets ppo``)."""

    section: ClassVar[str] = "ppo"
    UNUSED_WHEN: ClassVar[tuple[Dependency, ...]] = (
        *OnPolicyConfig.UNUSED_WHEN,
        ("recurrent", (None,), ("recurrent_hidden", "seq_len")),
    )

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
    adam_eps: float = 1e-5
    """Adam epsilon."""
    clip_coef: float | dict[str, Any] = 0.2
    """Surrogate clipping epsilon: a number, or a schedule on the env-step timeline such as
    {type: linear, start: 0.2, end: 0.05, steps: 200000}."""
    clip_vf: float | None = None
    """Clip the value update to +-clip_vf around the old value (None: off)."""
    target_kl: float | None = None
    """Stop the epoch loop once approx-KL exceeds this (None: never)."""
    recurrent: Literal["lstm", "gru"] | None = None
    """A recurrent policy (memory for partially observed envs): an LSTM or GRU cell between
    the observation and the actor and critic MLPs (null: feed-forward)."""
    recurrent_hidden: int = 64
    """Width of the recurrent cell."""
    seq_len: int = 16
    """Steps per training sequence (truncated backpropagation through time); minibatches
    hold minibatch_size // seq_len whole sequences."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_epochs", "minibatch_size", "recurrent_hidden", "seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.section}.{name} must be > 0, got {getattr(self, name)}")
        if isinstance(self.micro_batch, int) and self.micro_batch <= 0:
            raise ConfigError(f"{self.section}.micro_batch must be > 0, \"auto\" or null (whole "
                              f"minibatches), got {self.micro_batch}")
        if self.adam_eps <= 0:
            raise ConfigError(f"{self.section}.adam_eps must be > 0, got {self.adam_eps}")
        if self.clip_vf is not None and self.clip_vf <= 0:
            raise ConfigError(f"{self.section}.clip_vf must be > 0 (or null: no value "
                              f"clipping), got {self.clip_vf}")
        if start_value(f"{self.section}.clip_coef", self.clip_coef) <= 0:
            raise ConfigError(f"{self.section}.clip_coef must be > 0, got {self.clip_coef}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ConfigError(f"{self.section}.target_kl must be > 0 (or null: never stop "
                              f"early), got {self.target_kl}")
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
        if self.cuda_graph and self.recurrent is not None:
            raise ConfigError(f"{self.section}.cuda_graph cannot capture a rollout with "
                              f"{self.section}.recurrent; drop one of the two")

    def check_batch(self, num_envs: int) -> None:
        batch = self.rollout_steps * num_envs
        if self.minibatch_size > batch:
            raise ConfigError(
                f"{self.section}.minibatch_size={self.minibatch_size} is larger than the batch "
                f"(rollout_steps * num_envs = {batch}); lower it or collect more")


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
