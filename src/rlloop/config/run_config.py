"""Run configuration: a dataclass validated on construction, loadable from YAML.

Layers, each overriding the one before: defaults, the (algo, env) preset, a YAML
file, command-line flags, and ``--set key=value`` pairs. The algorithm's own
hyperparameters live in a section named after it (``ppo:``, set with
``--set ppo.lr=1e-3``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import numbers
import operator
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from rlloop.config.presets import preset
from rlloop.config.registry import ALGORITHMS, unknown_algorithm
from rlloop.errors import ConfigError, check_finite, check_finite_values
from rlloop.runners.ray_cluster import RayConfig, check_env_runners
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
DISTRIBUTED_ALGOS = ("ppo", "sac")
#: The same inside an algorithm's section (the off-policy cadence and evaluator).
RESUMABLE_SECTION_KEYS = frozenset({
    "eval_interval", "record_interval", "save_interval", "max_opts", "evaluator", "recorder"})


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
            if getattr(self, name) != _FIELD_DEFAULTS[name]:
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
        """The env steps the budget really trains: PPO rounds ``total_env_steps`` up to
        whole rollouts of ``num_envs x rollout_steps`` (the progress line's target)."""
        if self.algo != "ppo" or self.num_env_runners or self.num_learners > 1:
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
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)}


def _plain(value: Any) -> Any:
    """A nested config section (``profile``) as a mapping, anything else as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def build_config(
    algo: str,
    env: str | None = None,
    *,
    file: str | Path | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> RunConfig:
    """Resolve a :class:`RunConfig` from its layers (see module docstring).

    ``base`` replaces defaults + preset (used when resuming from a saved config).
    """
    return from_dict(config_layers(algo, env, file=file, flags=flags, sets=sets, base=base))


def config_layers(
    algo: str,
    env: str | None = None,
    *,
    file: str | Path | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The plain data :func:`build_config` validates: its layers merged, nothing checked
    but the algorithm's name and the file. Reading a setting here needs no torch."""
    if algo not in ALGORITHMS:
        raise ConfigError(unknown_algorithm(algo))
    file_data = load_yaml(file) if file else {}
    # An explicit empty id (``--env=``) is an error for RunConfig, not the default env.
    env_id = next((e for e in (env, (flags or {}).get("env"), file_data.get("env"),
                               (base or {}).get("env")) if e is not None), "CartPole-v1")
    data: dict[str, Any] = {"algo": algo, "env": env_id}
    layers = [base] if base is not None else [preset(algo, env_id)]
    layers += [file_data, {k: v for k, v in (flags or {}).items() if v is not None}]
    for layer in layers:
        _merge(data, layer)
    if file_data.get("algo", algo) != algo:
        raise ConfigError(f"config file {str(file)!r} is for {file_data['algo']}, not {algo}; "
                          f"train it with rlloop train {file_data['algo']} --config {file}")
    others = [k for k in file_data if k in ALGORITHMS and k != algo]
    if others:  # it would be dropped unread, as `--set sac.lr=...` on td3 is refused
        raise ConfigError(f"config file {str(file)!r} has settings for {', '.join(others)}, "
                          f"not {algo}, which this run trains; train "
                          f"{' or '.join(others)} with it, or rename the section to {algo}:")
    data["algo"], data["env"] = algo, env_id
    for item in sets or []:
        key, value = parse_set(item)
        _check_set_target(algo, key)
        _assign(data, key, value)
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (the plain loader
    keeps the last value silently: ``ppo: {lr: 1e-3, lr: 0.5}`` trains at 0.5)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: list[Any] = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, as before
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
            except TypeError:  # unhashable keys compare too; the parent refuses them
                twice = False
            if twice:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {key!r} twice in one mapping; keep one",
                    key_node.start_mark)
            seen.append(key)
        return super().construct_mapping(node, deep=deep)


def _safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no tags


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; pass a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass an existing YAML file")
    try:
        data = _safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not text (not UTF-8); pass a YAML "
                          "file") from None
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read ({e.strerror}); pass a "
                          "readable YAML file") from None
    except yaml.YAMLError as e:
        line = " ".join(str(e).split())  # PyYAML's messages span lines
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of keys to values")
    return data


def parse_set(item: str) -> tuple[str, Any]:
    """``"ppo.lr=1e-3"`` -> ``("ppo.lr", 0.001)``; values are parsed as YAML scalars."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. ppo.lr=0.001), got {item!r}")
    try:
        value = _safe_load(raw) if raw.strip() else None
    except yaml.constructor.ConstructorError as e:  # a key twice: no string meant that
        raise ConfigError(f"--set {item!r}: {e.problem}") from None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from plain data, with typed errors for bad input."""
    data = dict(data)
    algo = data.get("algo", "ppo")
    if algo not in ALGORITHMS:
        raise ConfigError(unknown_algorithm(algo))
    section = data.pop(algo, None) or {}
    _check_recurrent(algo, section)
    other_algos = [k for k in data if k in ALGORITHMS]
    for key in other_algos:
        data.pop(key)
    section_keys = [f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)]
    hparams = _build(ALGORITHMS[algo].config_cls, section, prefix=f"{algo}.",
                     other=("", list(_FIELD_DEFAULTS)))
    run = _build(RunConfig, {**data, "hparams": hparams}, prefix="",
                 other=(f"{algo}.", section_keys))
    return run  # type: ignore[no-any-return]


#: Settings of recurrent policies, which only these algorithms have.
RECURRENT_KEYS = ("recurrent", "recurrent_hidden", "seq_len")
RECURRENT_ALGOS = ("ppo",)


def _check_recurrent(algo: str, section: Any) -> None:
    if algo in RECURRENT_ALGOS or not isinstance(section, dict):
        return
    # ma_ppo's config has these fields (it extends PPO's), left at their feed-forward values.
    fields = {f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)}
    key = next((k for k in RECURRENT_KEYS if k in section and (
        k not in fields or (k == "recurrent" and section[k] is not None))), None)
    if key is not None:
        raise _no_recurrent_policy(algo, key)


def _no_recurrent_policy(algo: str, key: str) -> ConfigError:
    return ConfigError(f"{algo}.{key}: {algo} has no recurrent policy; use rlloop train ppo "
                       "--set ppo.recurrent=lstm (or gru), or drop the setting")


def _build(cls: type, data: dict[str, Any], prefix: str,
           other: tuple[str, Sequence[str]] = ("", ())) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.')} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(prefix, key, names, other)
        kwargs[key] = value if key == "hparams" else _coerce(value, hints[key], prefix + key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid {prefix.rstrip('.') or 'config'}: {e}") from None


#: Stable-Baselines3 / rl-zoo names a newcomer types, and the rlloop keys they are (the
#: README's translation table): the refusal of such a key names them.
SB3_NAMES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr",), "n_steps": ("rollout_steps",),
    "batch_size": ("minibatch_size",), "n_epochs": ("num_epochs",),
    "clip_range": ("clip_coef",), "clip_range_vf": ("clip_vf",),
    "train_freq": ("opt_interval",), "ent_coef": ("init_alpha", "autotune_alpha"),
    "exploration_fraction": ("exploration_steps",), "log_std_init": ("init_log_std",),
    "normalize": ("normalize_obs", "normalize_rewards"), "n_envs": ("num_envs",),
    "n_timesteps": ("total_env_steps",), "total_timesteps": ("total_env_steps",),
    "policy_kwargs": ("hidden", "activation", "ortho_init"), "net_arch": ("hidden",),
    "activation_fn": ("activation",), "verbose": ("progress",),
    "tensorboard_log": ("tensorboard",),
}


def sb3_hint(key: str, *layers: tuple[str, Sequence[str]]) -> str:
    """"Stable-Baselines3's <key> is <rlloop keys> here; " naming the keys (each with its
    layer's prefix) among ``layers`` ``(prefix, keys)``; "" for a key SB3 does not name so."""
    names = [prefix + n for prefix, keys in layers for n in SB3_NAMES.get(key, ()) if n in keys]
    return f"Stable-Baselines3's {key} is {' / '.join(names)} here; " if names else ""


def _unknown_key(prefix: str, key: str, names: Sequence[str],
                 other: tuple[str, Sequence[str]] = ("", ())) -> ConfigError:
    """The refusal of ``prefix + key``; ``other`` is the other layer's ``(prefix, keys)``
    (the algorithm's section for a run key, the run keys for a section's), where the key
    may belong."""
    valid = [n for n in names if n != "hparams"]
    there, elsewhere = other
    hint = sb3_hint(key, (prefix, valid), other)
    close = difflib.get_close_matches(key, valid, n=1)
    if not hint and key in elsewhere:
        hint = f"did you mean {there}{key}? "
    elif not hint and close:
        hint = f"did you mean {prefix}{close[0]}? "
    return ConfigError(f"unknown config key '{prefix}{key}'; {hint}valid keys: "
                       f"{', '.join(prefix + n for n in valid)}")


def check_set_keys(algo: str, sets: Sequence[str]) -> None:
    """The `ConfigError` `build_config` would raise for an unknown key in ``sets`` (``--set``
    items), raised without importing the algorithm (torch's second of import): the keys
    are the fields of its config class, whose module is torch-free. Keys inside sections
    are left to `build_config`.
    """
    run_keys = [f.name for f in dataclasses.fields(RunConfig)]
    for item in sets:
        key = parse_set(item)[0]
        top, _, sub = key.partition(".")
        _check_set_target(algo, key)
        if top == algo and sub:
            name = sub.partition(".")[0]
            keys = [f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)]
            if name not in keys:
                if name in RECURRENT_KEYS and algo not in RECURRENT_ALGOS:
                    raise _no_recurrent_policy(algo, name)
                raise _unknown_key(f"{algo}.", name, keys, ("", run_keys))
        elif top not in ALGORITHMS and top not in run_keys:
            keys = [f.name for f in dataclasses.fields(ALGORITHMS[algo].config_cls)]
            raise _unknown_key("", top, run_keys, (f"{algo}.", keys))


def _check_set_target(algo: str, key: str) -> None:
    """ConfigError for a ``--set`` key that would be dropped or switch what the preset
    was chosen for: ``env`` (the id; ``env.<option>`` is fine), ``algo`` or another
    algorithm's section."""
    top = key.partition(".")[0]
    if key == "env":
        raise ConfigError("--set env=... would keep the preset of the other env; pass the "
                          "env as --env ID")
    if top == "algo":
        raise ConfigError(f"--set algo=... cannot change the algorithm; it is the command's "
                          f"argument (rlloop train ALGO), here {algo}")
    if top in ALGORITHMS and top != algo:
        raise ConfigError(f"--set {top}.... does not apply: this run trains {algo}; use "
                          f"--set {algo}.KEY=VALUE")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a section: true = defaults
        if isinstance(value, bool):
            return _build(tp, {}, prefix=f"{key}.") if value else None
        return _build(tp, value, prefix=f"{key}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if tp is int:
        number = _number(value)
        if isinstance(number, int):
            return number
        if isinstance(number, float) and number.is_integer():
            return int(number)
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        number = _number(value)
        if number is None:
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(number)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    return value


def _number(value: Any) -> int | float | None:
    """``value`` as a number, or None. Strings count when Python reads them as one: PyYAML
    (YAML 1.1) reads ``4e-3`` and ``1E5`` as strings, though a Python user writes them
    as numbers. So do NumPy integers (anything ``operator.index`` takes), as plain ints,
    and NumPy floats, as plain floats; bools (Python's, NumPy's, torch's) are no numbers
    here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        try:
            return float(value)
        except ValueError:
            return None
    if (whole := integer(value)) is not None:
        return whole
    # NumPy floats (np.float32(1e-3): np.float64 is a float already) as plain floats
    return float(value) if isinstance(value, numbers.Real) else None


def integer(value: object) -> int | None:
    """``value`` as a plain int when it is an integer: an int or a NumPy (or torch) integer,
    anything ``operator.index`` takes; None otherwise. Bools (Python's, NumPy's, torch's)
    are no integers."""
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        return None  # torch.tensor(True) passes operator.index
    try:
        return operator.index(value)  # type: ignore[arg-type]  # np.True_ raises TypeError
    except TypeError:
        return None


def parse_int(text: str) -> int:
    """An integer flag, also written as ``1e6``; ValueError for anything else."""
    number = _number(text)
    if isinstance(number, float) and number.is_integer():
        return int(number)
    if not isinstance(number, int):
        raise ValueError(f"not an integer: {text!r}")
    return number


def _merge(into: dict[str, Any], layer: dict[str, Any] | None) -> None:
    for key, value in (layer or {}).items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "env_kwargs":
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)  # never alias a preset: --set mutates in place


def _assign(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if len(parts) > 1 and parts[0] == "env":  # env is the id; env.X sets an env option
        parts[0] = "env_kwargs"
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value
