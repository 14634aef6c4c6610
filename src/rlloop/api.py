"""The Python API: ``PPO("CartPole-v1", lr=3e-4).learn(100_000)``, ``save``, ``load``,
``predict``, ``evaluate``.

A thin layer on the CLI's code path: ``learn`` runs the same :class:`~rlloop.runs.session.Session`
(run directory, MLflow run, checkpoints, report), and ``predict`` / ``evaluate`` act with
the policy ``rlloop eval`` loads (the run's ``best/``, else its latest checkpoint). The
offline algorithms learn from a dataset: ``BC("data/cartpole-expert").learn(20_000)`` trains
20,000 gradient updates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rlloop.algorithms import AlgorithmBase
from rlloop.checkpoint import CheckpointManager, load_checkpoint
from rlloop.config.api_arguments import (
    NETS,
    SB3_POLICY,
    dataset_arguments,
    env_argument,
    learn_count,
    path_argument,
)
from rlloop.config.loading import build_config, integer, sb3_hint
from rlloop.config.registry import ALGORITHMS
from rlloop.config.run_config import MAX_EVAL_EPISODES, RunConfig
from rlloop.data.offline_dataset import check_dataset
from rlloop.envs.ids import check_registered
from rlloop.envs.objects import (
    copies_of,
    env_id_of,
    is_object_env,
    register_object_env,
    reward_threshold_of,
)
from rlloop.errors import ConfigError, RunDirError
from rlloop.modules.custom import NetFactory, net_path
from rlloop.runs.predict import predict_actions
from rlloop.runs.preflight import check_action_space
from rlloop.runs.run_dir import claimed_default_run_dir
from rlloop.runs.saved import evaluate_run, load_policy, load_run_config
from rlloop.runs.start import resume, resume_config, train
from rlloop.system.run_files import links_under
from rlloop.trainers.callbacks import Callback, as_callbacks
from rlloop.trainers.result import RunResult

EnvLike = str | Any
"""An env id, a ``gymnasium.Env`` instance or a function returning one."""
_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig)) - {"algo", "env",
                                                                            "hparams"}


class Model:
    """One algorithm on one env, trained into one run directory.

    Keyword arguments are run settings (``seed``, ``device``, ``num_envs``, ``mlflow``,
    ... : the fields of :class:`~rlloop.config.run_config.RunConfig`) or the algorithm's
    hyperparameters (``lr=3e-4`` sets ``ppo.lr``); the preset for (algorithm, env) fills
    in the rest, as on the command line.

    ``policy`` is a custom network for PPO's actor and critic (see
    :mod:`rlloop.modules.custom`): a class or factory ``f(obs_shape) -> nn.Module`` whose
    module has a ``features_dim`` attribute, or its ``"module:Class"`` path.
    """

    algo: ClassVar[str]

    def __init__(self, env: EnvLike | None = None, /, *sb3_args: Any,
                 run_dir: str | Path | None = None, policy: NetFactory | str | None = None,
                 **kwargs: Any) -> None:
        env = env_argument(type(self).__name__, env, sb3_args, kwargs)
        section = {f.name for f in dataclasses.fields(ALGORITHMS[self.algo].config_cls)}
        if isinstance(policy, str) and SB3_POLICY.fullmatch(policy):
            raise ConfigError(f"policy={policy!r} is a Stable-Baselines3 policy name; rlloop "
                              f"builds the network from the observation space ({NETS}): drop "
                              "policy= (it takes a custom network, module:Class or a class)")
        if "total_env_steps" in kwargs:
            raise ConfigError(f"total_env_steps is learn()'s argument, not a setting: "
                              f"{type(self).__name__}(...).learn({kwargs['total_env_steps']!r})")
        if policy is not None:
            if "net" not in section:
                raise ConfigError(f"policy= (a custom network) is supported by PPO, not "
                                  f"{self.algo}; drop it")
            kwargs["net"] = net_path(policy)
        unknown = sorted(set(kwargs) - _RUN_FIELDS - section)
        if unknown:
            hint = "".join(sb3_hint(k, ("", sorted(section | _RUN_FIELDS))) for k in unknown)
            raise ConfigError(f"{type(self).__name__} got unknown settings {unknown}; {hint}valid "
                              f"run settings: {', '.join(sorted(_RUN_FIELDS))}; valid "
                              f"{self.algo} settings: {', '.join(sorted(section))}")
        flags = {k: v for k, v in kwargs.items() if k in _RUN_FIELDS}
        flags[self.algo] = {k: v for k, v in kwargs.items() if k in section}
        self.config = build_config(self.algo, env_id_of(env), flags=flags)
        check_action_space(self.config)  # TD3("CartPole-v1") is refused here, as in SB3
        # Absolute, as every path the model keeps: a later os.chdir must not move the run.
        self.run_dir: Path | None = (path_argument(run_dir, "run_dir") if run_dir is not None
                                     else None)
        if self.run_dir is not None and self.run_dir.exists() and not self.run_dir.is_dir():
            raise RunDirError(f"run_dir {self.run_dir} is a file, not a directory; pass a "
                              "directory path that does not exist or is empty")
        if self.run_dir is not None and (self.run_dir / "config.yaml").exists():
            # Training it would resume that run with its own settings, not these.
            raise RunDirError(f"{self.run_dir} already holds a run; continue it with "
                              f"rlloop.load({str(self.run_dir)!r}).learn(...) or pass "
                              "another run_dir")
        self.allow_import = True  # the env id is the caller's own choice
        self._overrides: dict[str, Any] = {}  # load()'s flags, for a resumed run too
        self._own_config = True  # False for a loaded run: its saved settings are data
        self._actor: AlgorithmBase | None = None

    @classmethod
    def _from_run(cls, config: RunConfig, run_dir: Path, allow_import: bool,
                  overrides: dict[str, Any]) -> Model:
        model = cls.__new__(cls)
        model.config, model.run_dir, model.allow_import = config, run_dir, allow_import
        model._overrides = dict(overrides)
        model._own_config = False
        model._actor = None
        return model

    @classmethod
    def load(cls, path: str | Path, *, allow_import: bool = False,
             env: EnvLike | None = None, **flags: Any) -> Model:
        """:func:`load` (SB3's ``PPO.load(path)``), refusing a run of another algorithm."""
        model = load(path, allow_import=allow_import, env=env, **flags)
        if not isinstance(model, cls):
            raise ConfigError(f"{path} is a {model.algo} run, not {cls.algo}; load it with "
                              f"{type(model).__name__}.load or rlloop.load")
        return model

    # ---- training ---------------------------------------------------------------------
    def learn(self, total_env_steps: int | float | None = None,
              callbacks: Callback | Sequence[Callback] = (), **sb3: Any) -> RunResult:
        """Train for ``total_env_steps`` env steps; a later call trains that many more,
        continuing the same run (and MLflow run) from its last checkpoint. Returns the
        :class:`~rlloop.runs.session.RunResult` (not the model, as SB3's ``learn`` does).

        Ctrl-C (``SIGINT``) stops at the next boundary, writes the final checkpoint and
        report, then raises ``KeyboardInterrupt``; a later ``learn()`` continues from there."""
        return self._learn(learn_count(total_env_steps, "total_env_steps", sb3), callbacks)

    def _learn(self, count: int, callbacks: Callback | Sequence[Callback]) -> RunResult:
        """``learn``: train ``count`` more in its unit (:meth:`_with_budget`)."""
        callbacks = as_callbacks(callbacks)
        self._drop_actor()
        latest = _latest(self.run_dir)
        if self.run_dir is not None and latest is not None:
            done = self._trained(latest)
            # As `rlloop train --resume`: a saved profile section profiles only when asked
            # for again (the run directory does not choose to run the profiler).
            sets = [] if self._own_config or "profile" in self._overrides else ["profile=null"]
            result = resume(self.run_dir, allow_import=self.allow_import, callbacks=callbacks,
                            sets=sets, **self._resume_flags(done + count))
        else:
            config = self._with_budget(self.config, count)
            with (claimed_default_run_dir(config) if self.run_dir is None
                  else contextlib.nullcontext(self.run_dir)) as claimed:
                run_dir = claimed.absolute()
                try:
                    result = train(config, run_dir, callbacks=callbacks)
                finally:  # a callback's exception leaves a run to continue, or none
                    if _latest(run_dir) is not None:
                        self.run_dir = run_dir
        assert self.run_dir is not None
        self.config = load_run_config(self.run_dir, allow_import=self.allow_import,
                                      **self._overrides)
        if result.stopped_by == "signal SIGINT":
            # Python's word for Ctrl-C, raised once the checkpoint and report are written: a
            # script must not go on to its next line (SIGTERM, a scheduler's, still returns).
            raise KeyboardInterrupt
        return result

    # The budget ``learn`` counts: env steps here, gradient updates for offline models.
    def _with_budget(self, config: RunConfig, total: int) -> RunConfig:
        """``config`` trained to ``total``."""
        return dataclasses.replace(config, total_env_steps=total)

    def _resume_flags(self, total: int) -> dict[str, Any]:
        """``load``'s overrides and the budget of a resume that trains to ``total``."""
        return {**self._overrides, "total_env_steps": total}

    def _trained(self, checkpoint: Path) -> int:
        """What ``checkpoint`` holds trained."""
        return int(load_checkpoint(checkpoint).metadata["env_steps"])

    def save(self, path: str | Path) -> Path:
        """Copy the run to ``path`` as a run directory that `load`, ``rlloop eval`` and
        ``rlloop train --resume`` accept (without its MLflow store and identity: a
        resumed copy starts a new MLflow run)."""
        dest = path_argument(path, "save() path")
        if self.run_dir is None or _latest(self.run_dir) is None:
            raise RunDirError("nothing to save yet: call learn() first")
        if dest.resolve() == self.run_dir.resolve():
            return dest
        file = next((p for p in (dest, *dest.parents) if p.exists() and not p.is_dir()), None)
        if file is not None:  # copytree would raise NotADirectoryError / FileExistsError
            raise RunDirError(f"cannot save to {dest}: {file} is a file, not a directory; save "
                              "to a directory path that does not exist or is empty")
        if dest.exists() and any(dest.iterdir()):
            raise RunDirError(f"{dest} is not empty; save to a new or empty directory")
        link = next(links_under(self.run_dir), None)  # a copy would hold its target
        if link is not None:
            raise RunDirError(f"{link} is a symbolic link; a saved run holds the run's own "
                              "files only: remove the link, then save")
        shutil.copytree(self.run_dir, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".lock", "run.json", "mlflow.db*"))
        return dest

    # ---- acting -------------------------------------------------------------------------
    def predict(self, obs: Any, deterministic: bool = True,
                episode_start: bool | np.ndarray = False) -> np.ndarray:
        """The action for one observation (shaped as the env's), or actions for a batch
        ``[B, *obs_shape]``; observations are normalised as in evaluation.

        A recurrent policy (``ppo.recurrent``) carries its memory from one call to the next
        (call once per env step); ``episode_start`` (True, or a bool per row of a batch)
        marks observations that begin an episode, whose memory starts afresh, as SB3's
        ``RecurrentPPO.predict`` takes it. Other policies ignore it."""
        return predict_actions(self._acting(), obs, deterministic, episode_start)

    def evaluate(self, episodes: int = 20) -> dict[str, float]:
        """Deterministic returns over ``episodes`` episodes, as ``rlloop eval`` reports them
        (``return_mean``, ``return_std``, ..., and ``episodes`` as an int)."""
        count = integer(episodes)
        if count is None or not 1 <= count <= MAX_EVAL_EPISODES:
            raise ConfigError(f"episodes must be an integer in 1..{MAX_EVAL_EPISODES}, got "
                              f"{episodes!r}")
        episodes = count
        if self.run_dir is not None and _latest(self.run_dir) is not None:
            stats = evaluate_run(self.run_dir, episodes, device=self.config.device,
                                 allow_import=self.allow_import)
        else:
            stats = self._acting().evaluate(episodes)
        return {**stats, "episodes": int(stats["episodes"])}

    def _acting(self) -> AlgorithmBase:
        if self._actor is None:
            trained = _latest(self.run_dir) is not None
            config = dataclasses.replace(self.config, mlflow=False)
            self._actor = load_policy(config, self.run_dir if trained else None)
        return self._actor

    def _drop_actor(self) -> None:
        if self._actor is not None:
            self._actor.close()
            self._actor = None

    def close(self) -> None:
        """Close the envs of the acting policy (``predict`` makes them again if called)."""
        self._drop_actor()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config.env!r}, run_dir={self.run_dir})"


class PPO(Model):
    algo = "ppo"


class A2C(Model):
    algo = "a2c"


class APPO(Model):
    algo = "appo"  # needs num_env_runners >= 1 (its runners are processes)


class IMPALA(Model):
    algo = "impala"


class DQN(Model):
    algo = "dqn"


class QRDQN(Model):
    algo = "qrdqn"


class SAC(Model):
    algo = "sac"


class TD3(Model):
    algo = "td3"


class TQC(Model):
    algo = "tqc"


class CrossQ(Model):
    algo = "crossq"


class OfflineModel(Model):
    """An offline algorithm learning from a recorded dataset, never from its env:
    ``BC("data/cartpole-expert").learn(20_000)``.

    ``dataset`` is a directory ``rlloop collect`` wrote, or ``minari:ID`` for one in Minari's
    local store; ``env`` is where the policy is evaluated, by default the env the dataset
    was recorded in. Keyword arguments are as for :class:`Model` (``lr=1e-3`` sets
    ``cql.lr``; the preset for (algorithm, env) fills in the rest). ``learn`` counts gradient
    updates; ``predict``, ``evaluate``, ``save`` and ``load`` are :class:`Model`'s.
    """

    def __init__(self, dataset: str | Path, env: EnvLike | None = None, /, *,
                 run_dir: str | Path | None = None, **kwargs: Any) -> None:
        text, env = dataset_arguments(type(self).__name__, dataset, env, kwargs)
        super().__init__(env, run_dir=run_dir, dataset=text, **kwargs)
        check_dataset(text, check_action_space(self.config))

    # Model.learn's count renamed for its unit: learn(total_env_steps=n) is refused here.
    def learn(self, total_gradient_steps: int | float | None = None,  # type: ignore[override]
              callbacks: Callback | Sequence[Callback] = (), **sb3: Any) -> RunResult:
        """Train ``total_gradient_steps`` gradient updates on the dataset (``env/steps``
        stays 0); a later call trains that many more, continuing the run, as
        :meth:`Model.learn` does."""
        return self._learn(learn_count(total_gradient_steps, "total_gradient_steps", sb3),
                           callbacks)

    def _with_budget(self, config: RunConfig, total: int) -> RunConfig:
        return dataclasses.replace(config, hparams=dataclasses.replace(
            config.hparams, total_gradient_steps=total))

    def _resume_flags(self, total: int) -> dict[str, Any]:
        section = self._overrides.get(self.algo)
        return {**self._overrides, self.algo: {**(section if isinstance(section, dict) else {}),
                                               "total_gradient_steps": total}}

    def _trained(self, checkpoint: Path) -> int:
        return int(checkpoint.name)  # an offline run's checkpoints are named by its updates

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.config.hparams.dataset!r}, "
                f"{self.config.env!r}, run_dir={self.run_dir})")


class BC(OfflineModel):
    algo = "bc"


class CQL(OfflineModel):
    algo = "cql"


class IQL(OfflineModel):
    algo = "iql"  # Box actions only


MODELS: dict[str, type[Model]] = {cls.algo: cls for cls in (PPO, A2C, DQN, QRDQN, SAC, TD3, TQC,
                                                            CrossQ, APPO, IMPALA, BC, CQL, IQL)}


def load(path: str | Path, *, allow_import: bool = False, env: EnvLike | None = None,
         **flags: Any) -> Model:
    """The model of a run directory (made by ``learn``, ``save`` or ``rlloop train``),
    ready to ``predict``, ``evaluate`` or ``learn`` on.

    A run directory is untrusted: an env id in it that imports a module is refused unless
    ``allow_import``. A run of an env object needs that object again as ``env`` (a
    factory or an instance; it is registered under the saved id). ``flags`` override saved
    run settings (e.g. ``device="cpu"``).
    """
    run_dir = path_argument(path, "load() path")
    if "total_env_steps" in flags:
        raise ConfigError("total_env_steps is learn()'s argument, not a setting: "
                          f"load(...).learn({flags['total_env_steps']!r}) trains that many more")
    if env is not None:
        _register_again(run_dir, env)
    # The saved config with the overrides a later learn() (a resume) accepts; others refused.
    config = resume_config(run_dir, allow_import=allow_import, **flags)
    check_registered(config.env, source=str(run_dir))  # not first at predict()
    cls = MODELS.get(config.algo)
    if cls is None:
        raise ConfigError(f"{run_dir} is a {config.algo} run; the Python API loads "
                          f"{', '.join(MODELS)} runs (use rlloop.runs.session for others)")
    return cls._from_run(config, run_dir, allow_import, flags)


def _register_again(run_dir: Path, env: EnvLike) -> None:
    import gymnasium
    import yaml

    saved = yaml.safe_load((run_dir / "config.yaml").read_text()) if (
        run_dir / "config.yaml").is_file() else {}
    env_id = saved.get("env") if isinstance(saved, dict) else None
    if not isinstance(env_id, str) or not is_object_env(env_id):
        raise ConfigError(f"{run_dir} was not trained on an env object; load it without env=")
    if env_id in gymnasium.registry:
        return
    if isinstance(env, gymnasium.Env):  # (env_id_of would register it a second time)
        env = copies_of(env)
    if not callable(env):
        raise ConfigError(f"env= must be a gymnasium.Env or a function returning one, got "
                          f"{type(env).__name__}")
    register_object_env(env, "", reward_threshold_of(env), env_id=env_id)


def _latest(run_dir: Path | None) -> Path | None:
    """The newest checkpoint of ``run_dir``; None for no run or a run not trained yet."""
    return None if run_dir is None else CheckpointManager(run_dir / "checkpoints").latest()
