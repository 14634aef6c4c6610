"""A saved run read back: its config, its best policy, and evaluating that policy.

A run directory is untrusted data: env ids and network paths in it that would import a
module by name are refused unless the caller consents (``allow_import``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlloop.algorithms import AlgorithmBase, PPOConfig
from rlloop.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    load_checkpoint,
    restoring,
    verify_checkpoint,
)
from rlloop.config.loading import build_config, load_yaml
from rlloop.config.run_config import RunConfig
from rlloop.envs.ids import resolve_env_id
from rlloop.envs.imports import check_saved_imports
from rlloop.errors import RunDirError, SavedStateError, saved_count
from rlloop.runs.build import COMPONENTS, build_algorithm
from rlloop.system.run_files import check_run_dir

_log = logging.getLogger(__name__)


def acting_config(config: RunConfig) -> RunConfig:
    """``config`` with one training env, for loading a policy and acting with it.

    Evaluation runs on the algorithm's own eval envs; building the run's ``num_envs``
    training envs too would start a process per env for an async run. PPO's batch rule
    (minibatch <= rollout_steps * num_envs) is relaxed to match: nothing is trained.
    """
    hparams = config.hparams
    if isinstance(hparams, PPOConfig):
        hparams = dataclasses.replace(
            hparams, minibatch_size=min(hparams.minibatch_size, hparams.rollout_steps))
    return dataclasses.replace(config, num_envs=1, num_env_runners=0, hparams=hparams)


def load_run_config(run_dir: str | Path, *, allow_import: bool = False,
                    **flags: Any) -> RunConfig:
    """The saved config of a run, with ``flags`` (e.g. total_env_steps) overriding it.

    A run directory is untrusted data: an env id in it that would import a module by name
    is refused unless ``allow_import`` (see ``rlloop.envs.imports``).
    """
    path = check_run_dir(run_dir)
    saved = load_yaml(path / "config.yaml")
    check_saved_imports(saved, allow_import=allow_import, source=str(path))
    env = saved.get("env")
    if allow_import and isinstance(env, str):  # consented: import it now (make_env never
        # imports a module:Id), from the working directory too, as for a typed id
        resolve_env_id(env, allow_import=True, search_cwd=True)
    return build_config(saved.get("algo", "ppo"), env, base=saved, flags=flags)


def policy_checkpoint(run_dir: Path, notify: Callable[[str], None] | None = None) -> Path:
    """The best checkpoint of a run, else its latest one.

    A damaged or incomplete ``best/`` is passed over for the newest intact checkpoint, with
    one line to ``notify`` (default: a logged warning) saying so. Only its files are
    checked here; :func:`restore_policy` checks the values too, as it loads them.
    """
    best = run_dir / "best"
    latest = CheckpointManager(run_dir / "checkpoints").latest
    if best.exists():
        try:
            verify_checkpoint(best)
            return best
        except CheckpointError as e:
            fallback = latest()
            if fallback is None:
                raise _nothing_intact(best, e) from e
            (notify or _log.warning)(_passed_over(best, e, fallback))
            return fallback
    found = latest()
    if found is None:
        raise RunDirError(f"{run_dir} has no checkpoint yet; train it first")
    return found


def restore_policy(algorithm: AlgorithmBase, run_dir: Path,
                   notify: Callable[[str], None] | None = None) -> Path:
    """Load into ``algorithm`` the policy of ``run_dir``'s ``best/``, else of its newest
    intact checkpoint; return the checkpoint's path.

    A checkpoint is intact when its files verify and ``algorithm`` takes its values: the
    weights fit the built modules and are finite (NaN weights would be evaluated or
    exported as they are). A damaged ``best/`` is passed over as in :func:`policy_checkpoint`
    (one line to ``notify``), a damaged numbered checkpoint with a logged warning.
    """
    def restore(ckpt: Checkpoint) -> None:
        algorithm.set_policy_state(ckpt.components["algorithm"])
        check_finite_policy(algorithm)

    best = run_dir / "best"
    manager = CheckpointManager(run_dir / "checkpoints")
    if best.exists():
        try:
            ckpt = load_checkpoint(best, expected_components=COMPONENTS)
            with restoring(best):
                restore(ckpt)
            return best
        except CheckpointError as e:
            fallback = manager.load_latest(expected_components=COMPONENTS, restore=restore)
            if fallback is None:
                raise _nothing_intact(best, e) from e
            (notify or _log.warning)(_passed_over(best, e, fallback.path))
            return fallback.path
    found = manager.load_latest(expected_components=COMPONENTS, restore=restore)
    if found is None:
        if manager.all():
            raise RunDirError(f"{run_dir} has no intact checkpoint (each one is damaged: see "
                              "the warnings above); train the run again")
        raise RunDirError(f"{run_dir} has no checkpoint yet; train it first")
    return found.path


def check_finite_policy(algorithm: AlgorithmBase) -> None:
    """``SavedStateError`` naming the weights or observation statistics of ``algorithm``
    that hold a NaN or an infinity: a policy with them acts on NaN."""
    bad = algorithm.learner.nonfinite_weights()  # type: ignore[attr-defined]
    stats = getattr(algorithm, "obs_stats", None)
    if stats is not None and not bool(torch.isfinite(torch.cat([stats.mean.flatten(),
                                                                stats.var.flatten()])).all()):
        bad.append("obs_norm")
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise SavedStateError(f"non-finite weights (NaN or inf) in {', '.join(bad[:3])}{more}")


def _passed_over(best: Path, error: CheckpointError, fallback: Path) -> str:
    return (f"{best} is damaged ({_first_clause(error)}); using the newest intact "
            f"checkpoint {fallback} instead")


def _nothing_intact(best: Path, error: CheckpointError) -> RunDirError:
    return RunDirError(f"{best} is damaged ({_first_clause(error)}) and {best.parent} has "
                       "no intact checkpoint; train the run again")


def _first_clause(error: Exception) -> str:
    """``<file>: <problem>`` of a checkpoint error, without its advice."""
    return str(error).split(". ", 1)[0]


def evaluate_run(run_dir: str | Path, episodes: int = 20, backend: str | None = None,
                 device: str | None = None, *, allow_import: bool = False,
                 notify: Callable[[str], None] | None = None) -> dict[str, float]:
    """Load a run's best policy and evaluate it deterministically on ``episodes`` episodes
    (on ``device``, default the run's own: checkpoints load on any device).

    ``notify`` gets one line if a damaged ``best/`` is passed over (see `policy_checkpoint`).
    """
    algorithm = load_run_policy(run_dir, backend, device, allow_import=allow_import,
                                notify=notify)
    try:
        return algorithm.evaluate(episodes)
    finally:
        algorithm.close()


def replay_config(run_dir: str | Path, backend: str | None = None, device: str | None = None,
                  *, allow_import: bool = False) -> RunConfig:
    """A run's saved config for acting with its policy again: no MLflow, and the
    ``backend`` and ``device`` given (default: the run's own)."""
    flags: dict[str, Any] = {"mlflow": False}
    if backend:
        flags["backend"] = backend
    if device:
        flags["device"] = device
    return load_run_config(run_dir, allow_import=allow_import, **flags)


def load_run_policy(run_dir: str | Path, backend: str | None = None, device: str | None = None,
                    *, allow_import: bool = False,
                    notify: Callable[[str], None] | None = None) -> AlgorithmBase:
    """A run's algorithm with its best policy loaded, built for acting (one training env);
    the caller closes it. Arguments as for :func:`evaluate_run`."""
    config = replay_config(run_dir, backend, device, allow_import=allow_import)
    # The run's thread count, as in training: torch's default (every core) makes each small
    # op of acting wait on the others, several times slower on a busy machine.
    torch.set_num_threads(config.torch_threads)
    return load_policy(config, Path(run_dir), notify)


def load_policy(config: RunConfig, run_dir: Path | None,
                notify: Callable[[str], None] | None = None) -> AlgorithmBase:
    """The algorithm of ``config`` built for acting (see `acting_config`), with the policy
    of ``run_dir``'s `policy_checkpoint` loaded; untrained when ``run_dir`` is None."""
    algorithm = build_algorithm(acting_config(config))
    if run_dir is None:
        return algorithm
    try:
        restore_policy(algorithm, run_dir, notify)
    except BaseException:
        algorithm.close()
        raise
    return algorithm


def saved_best_return(best: Path) -> float | None:
    """The eval return a ``best/`` policy checkpoint was saved for; None when there is no
    intact one."""
    if not best.exists():
        return None
    try:
        trainer = load_checkpoint(best).components.get("trainer") or {}
        return checked_return(trainer.get("best_eval_return"))
    except (CheckpointError, SavedStateError, AttributeError):  # (AttributeError: not a dict)
        return None


def checked_return(value: Any) -> float | None:
    """A saved best eval return: None, or a finite number (``SavedStateError`` if not)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SavedStateError(f"trainer.best_eval_return is {value!r:.40}, not a return")
    return float(value)


def checked_step(value: Any, name: str) -> int | None:
    """A saved env step that may be unset: None, or a count (``SavedStateError`` if not)."""
    return None if value is None else saved_count(value, f"trainer.{name}")
