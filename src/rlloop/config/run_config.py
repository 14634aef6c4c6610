"""Run configuration: a dataclass validated on construction (built from its layers by
`rlloop.config.loading`). The algorithm's own hyperparameters live in a section named
after it (``ppo:``, set with ``--set ppo.lr=1e-3``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from rlloop.config.ray import RayConfig, check_env_runners
from rlloop.config.registry import ALGORITHMS, unknown_algorithm
from rlloop.errors import ConfigError, check_finite, check_finite_values
from rlloop.system.device_names import check_device_name
from rlloop.system.profiling import ProfileConfig

BACKENDS = ("auto", "native", "gymnasium", "gymnasium-async", "gymnasium-thread", "envpool")
#: Seeds are 32-bit, the range every generator a run seeds (torch, NumPy, Gymnasium) accepts.
MAX_SEED = 2**32 - 1
#: More episodes than anyone evaluates on purpose; ``1e9`` would run for days.
MAX_EVAL_EPISODES = 100_000
#: A budget past any run's reach (and far inside int64): 1e15 env steps.
MAX_ENV_STEPS = 10**15

#: What a resumed run may change: budgets, stop rules, evaluation, checkpoint and logging
#: settings, and where it computes (checkpoints load on any device). The rest (env, seed,
#: networks, batch shapes, the MLflow store) is fixed when a run starts: its checkpoints
#: and MLflow run are tied to it.
RESUMABLE_KEYS = frozenset({
    "total_env_steps", "stop_on_solve", "solve_threshold", "solve_episodes", "eval_every",
    "eval_episodes", "checkpoint_every", "keep_checkpoints", "torch_threads", "device",
    "mlflow", "mlflow_interval_s", "tensorboard", "progress", "on_nonfinite",
    "max_skipped_share", "save_video",
    "profile", "wandb", "wandb_project",
    "max_weight_lag", "restart_failed_env_runners", "max_restarts", "ray.address",
    "ray.dashboard", "ray.num_cpus_per_runner", "num_learners", "max_learner_restarts",
    "ray.learner_actors", "ray.num_cpus_per_learner", "ray.num_gpus_per_learner"})
#: Metrics records in a row over which ``max_skipped_share`` is judged (its docstring says 10).
SKIPPED_SHARE_RECORDS = 10
#: Algorithms whose learner can run as several processes (``num_learners > 1``).
DISTRIBUTED_ALGOS = ("ppo", "appo", "sac")
#: The same inside an algorithm's section (the off-policy cadence and evaluator).
RESUMABLE_SECTION_KEYS = frozenset({
    "eval_interval", "record_interval", "save_interval", "max_opts", "evaluator", "recorder",
    "total_gradient_steps"})


def resumable(key: str, algo: str) -> bool:
    """Whether ``key`` (dotted, as ``--set`` takes it) may change when ``algo``'s run resumes."""
    section, _, name = key.partition(".")
    return (key in RESUMABLE_KEYS or (section == algo and name in RESUMABLE_SECTION_KEYS)
            or section == "profile")


@dataclass
class RunConfig:
    """Everything a training run needs. Field docs double as the CLI's reference."""

    algo: str = "ppo"
    """Algorithm name (see ``rlloop algos``)."""
    env: str = "CartPole-v1"
    """Environment id: a native rlloop env or any Gymnasium id."""
    backend: str = "auto"
    """auto (native when one exists), native, gymnasium, gymnasium-async (one process per
    env) or gymnasium-thread (envs stepped at once in threads: for steps that wait with the
    GIL released; env runners step their envs so too)."""
    num_envs: int = 16
    """Parallel training envs."""
    seed: int = 0
    """Seed for networks, action sampling and envs."""
    device: str = "auto"
    """Where envs, storage, networks and optimisers live: auto (CUDA when present, else
    CPU), cpu, cuda, cuda:N or mps."""
    total_env_steps: int = 200_000
    """Step budget: training stops once this many env steps were taken."""
    stop_on_solve: bool = True
    """Also stop when the eval return reaches solve_threshold."""
    solve_threshold: float | None = None
    """Eval return that counts as solved (default: the env's reward_threshold)."""
    solve_episodes: int = 100
    """An evaluation that reaches solve_threshold stops the run only if a fresh evaluation
    over this many episodes reaches it too (Gym's "solved": a mean over 100 episodes)."""
    eval_every: int = 5
    """Iterations between evaluations (0: only at the end). Off-policy algorithms count
    optimisation steps instead, in their own section (dqn.eval_interval, ...)."""
    eval_episodes: int = 10
    """Episodes per evaluation."""
    checkpoint_every: int = 50
    """Iterations between periodic checkpoints (0: only at the end). Off-policy
    algorithms use their own save_interval, in optimisation steps."""
    keep_checkpoints: int = 3
    """Periodic checkpoints kept (the newest ones)."""
    horizons_per_env_reset: int = -1
    """Reset the training envs every k iterations; < 0 resets them only once."""
    torch_threads: int = 1
    """torch intra-op threads (1 is fastest for small MLPs on CPU)."""
    mlflow: bool = True
    """Log params, metrics, tags and artifacts (model, video, report) to MLflow."""
    mlflow_tracking_uri: str | None = None
    """MLflow store (default: a local store inside the run directory), e.g. a shared
    tracking server: http://host:5000."""
    mlflow_interval_s: float = 1.0
    """Seconds between MLflow batch writes (every metrics.jsonl row reaches MLflow, at its
    step; training never waits for MLflow)."""
    mlflow_close_timeout_s: float = 5.0
    """Seconds a finishing run waits for MLflow to write what is queued; a store that does
    not answer in time is left with one warning saying how many rows it misses."""
    experiment: str = "rlloop"
    """MLflow experiment name."""
    tensorboard: bool = False
    """Also write TensorBoard event files under <run>/tensorboard."""
    wandb: bool = False
    """Also log params and metrics to Weights & Biases (offline, into <run>/wandb, unless
    WANDB_MODE says otherwise; ``wandb sync`` uploads an offline run later)."""
    wandb_project: str = "rlloop"
    """The W&B project of the run."""
    profile: ProfileConfig | None = None
    """Run torch.profiler over a few training iterations and write a trace under
    <run>/profile (a mapping: wait, warmup, active, record_shapes; ``--profile`` or
    ``true``: the defaults; null: off)."""
    progress: bool = True
    """Show the live progress line."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env constructor (gymnasium.make kwargs)."""
    on_nonfinite: Literal["skip", "raise"] = "skip"
    """A NaN/inf in a batch, loss or gradient skips that update (counted in
    guard/skipped_updates; the first skip is a console warning) or stops the run with an
    error naming the step."""
    max_skipped_share: float = 0.5
    """With on_nonfinite=skip: the run stops with an error (its final checkpoint written
    first) once more than this share of its updates were skipped, averaged over 10 metrics
    records in a row (each iteration's, off-policy each record_interval's; all of them in
    a run that ends sooner): an env or setting that yields NaN/inf all the time, so nothing
    is learned. 1: never stop."""
    step_timeout: float | None = 60.0
    """Seconds a gymnasium-async env worker may take to answer a step or reset before the
    run stops with an error naming the env (null: wait forever). A worker's first answer,
    which includes starting it, gets 120 s more."""
    save_video: bool = True
    """At the end of a run, film one episode of the best policy to <run>/video.mp4
    (skipped with a one-line warning if the env cannot render, and after a stop signal)."""
    compile: bool | None = None
    """Run the algorithm's gradient updates through torch.compile (sets <algo>.compile;
    None leaves the algorithm's own setting)."""
    num_env_runners: int = 0
    """Ray actors that step the envs, each with its own envs and policy copy (0: the envs
    run in this process and Ray is not imported)."""
    num_envs_per_runner: int | None = None
    """Envs per env runner (None: num_envs split over the runners, rounded up)."""
    fragment_steps: int | None = None
    """Steps per env in one fragment an off-policy runner sends (None: 32); PPO's
    fragments are ppo.rollout_steps long."""
    max_weight_lag: int = 1
    """Weight versions a runner's fragment may lag the learner's and still be used (older
    ones are dropped). >= 1 lets runners sample while the learner updates; 0 samples
    every fragment with the newest weights."""
    restart_failed_env_runners: bool = True
    """Restart an env runner that dies or whose env raises (its fragment is lost); false
    stops the run with the runner's error."""
    max_restarts: int = 10
    """Restarts allowed per env runner before the run stops with its error."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray settings (ray.address, ray.dashboard, ray.num_cpus_per_runner)."""
    num_learners: int = 1
    """Learner processes sharing every update (ppo and sac): each computes the gradient of
    its shard of every minibatch and the gradients are all-reduced over torch.distributed
    (gloo on CPU, NCCL with one GPU per learner on CUDA). 1: one learner, in process."""
    max_learner_restarts: int = 0
    """Times a run whose learner group broke (a learner process died) restarts the group
    from its newest checkpoint and goes on; 0: stop with an error instead."""
    hparams: Any = None
    """The algorithm's config dataclass (YAML section named after the algorithm)."""

    def __post_init__(self) -> None:
        check_finite("", self)
        if self.algo not in ALGORITHMS:
            raise ConfigError(unknown_algorithm(self.algo))
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; choose one of {list(BACKENDS)}")
        check_device_name(self.device)
        for name in ("num_envs", "total_env_steps", "eval_episodes", "solve_episodes",
                     "keep_checkpoints", "torch_threads"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every", "mlflow_interval_s",
                     "mlflow_close_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        self._check_learners()
        self._check_cadence()
        if self.step_timeout is not None and self.step_timeout <= 0:
            raise ConfigError(f"step_timeout must be > 0 (seconds) or null (no limit), got "
                              f"{self.step_timeout}")
        self._check_ranges()
        if self.horizons_per_env_reset == 0:
            raise ConfigError("horizons_per_env_reset must be > 0 (reset every k iterations) "
                              "or < 0 (reset once), not 0")
        k = self.horizons_per_env_reset
        if (k > 0 and self.eval_every > 0 and self.eval_every % k
                and ALGORITHMS[self.algo].kind != "off_policy"):
            raise ConfigError(f"eval_every={self.eval_every} must be a multiple of "
                              f"horizons_per_env_reset={k} (evaluations fall on env-reset "
                              f"boundaries): set eval_every to a multiple of {k}, or 0")
        if self.hparams is None:
            self.hparams = ALGORITHMS[self.algo].config_cls()
        if self.compile is not None:
            if not hasattr(self.hparams, "compile"):
                raise ConfigError(f"compile: {self.algo} has no compiled update (ppo, ma_ppo, "
                                  "dqn, sac and td3 have); drop the setting")
            self.hparams.compile = self.compile
            self.hparams.__post_init__()  # re-check the combination (dqn.manual_backward)
        check_env_runners(self)

    def _check_cadence(self) -> None:
        """``eval_every`` and ``checkpoint_every`` count iterations of rl8's loop; the
        off-policy algorithms' own settings count optimisation steps: set to anything but
        their defaults there, they would be ignored."""
        if ALGORITHMS[self.algo].kind != "off_policy":
            return
        for name, theirs in (("eval_every", "eval_interval"),
                             ("checkpoint_every", "save_interval")):
            if getattr(self, name) != FIELD_DEFAULTS[name]:
                raise ConfigError(f"{name} counts iterations of PPO's loop; {self.algo} "
                                  f"counts optimisation steps: set {self.algo}.{theirs} "
                                  f"instead (and drop {name})")

    def _check_learners(self) -> None:
        if self.num_learners < 1:
            raise ConfigError(f"num_learners must be >= 1, got {self.num_learners}")
        if self.num_learners > 1 and self.algo not in DISTRIBUTED_ALGOS:
            raise ConfigError(f"num_learners={self.num_learners} needs one of "
                              f"{list(DISTRIBUTED_ALGOS)}, not {self.algo}; use num_learners=1")
        if self.num_learners > 1 and getattr(self.hparams, "recurrent", None):
            raise ConfigError(f"num_learners={self.num_learners} shards minibatches of steps; "
                              f"{self.algo}.recurrent trains on sequences, which it does not "
                              "shard: use num_learners=1")
        if self.max_learner_restarts < 0:
            raise ConfigError(f"max_learner_restarts must be >= 0, got "
                              f"{self.max_learner_restarts}")

    def _check_ranges(self) -> None:
        if not isinstance(self.env, str) or not self.env.strip():
            raise ConfigError(f"env must be an env id such as CartPole-v1, got {self.env!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed must be in [0, {MAX_SEED}], got {self.seed}")
        cpus = os.cpu_count() or 1
        if self.torch_threads > cpus:
            raise ConfigError(f"torch_threads={self.torch_threads} is more than the {cpus} CPUs "
                              f"of this machine; use at most {cpus}")
        for name in ("eval_episodes", "solve_episodes"):
            if getattr(self, name) > MAX_EVAL_EPISODES:
                raise ConfigError(f"{name} must be <= {MAX_EVAL_EPISODES:,}, got "
                                  f"{getattr(self, name):,}")
        if self.total_env_steps > MAX_ENV_STEPS:
            raise ConfigError(f"total_env_steps must be <= {MAX_ENV_STEPS:.0e} (decades at "
                              f"a million steps a second), got {self.total_env_steps:.3g}")
        if self.mlflow_interval_s < 0:
            raise ConfigError(f"mlflow_interval_s must be >= 0 (0: write every iteration), got "
                              f"{self.mlflow_interval_s}")
        if not 0 <= self.max_skipped_share <= 1:
            raise ConfigError(f"max_skipped_share must be in [0, 1] (1: never stop for skipped "
                              f"updates), got {self.max_skipped_share}")
        check_finite_values("env_kwargs", self.env_kwargs)  # (check_finite sees no entries)
        limit = self.env_kwargs.get("max_episode_steps")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit <= 0):
            raise ConfigError(f"env_kwargs.max_episode_steps must be an integer > 0 (or null: "
                              f"the env's own limit), got {limit!r}")

    @property
    def planned_env_steps(self) -> int:
        """The env steps the budget really trains: PPO and A2C round ``total_env_steps`` up to
        whole rollouts of ``num_envs x rollout_steps`` (the progress line's target)."""
        if self.algo not in ("ppo", "a2c") or self.num_env_runners or self.num_learners > 1:
            return self.total_env_steps  # other schedules stop at the budget's own step
        rollout = self.num_envs * self.hparams.rollout_steps
        return -(-self.total_env_steps // rollout) * rollout

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML; the algorithm section is keyed by the algorithm's name."""
        data = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name != "hparams"}
        data[self.algo] = dataclasses.asdict(self.hparams)
        return data


#: RunConfig's default values, by field.
FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)}


def _plain(value: Any) -> Any:
    """A nested config section (``profile``) as a mapping, anything else as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value
