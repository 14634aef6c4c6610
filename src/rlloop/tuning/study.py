"""``rlloop tune``: an Optuna study over a search space, every trial a full rlloop run.

Tune directory layout::

    <dir>/.lock            held (flock) by the one ``rlloop tune`` process driving the study
    <dir>/tune.json        the study's settings (algo, env, budgets, base config), for resuming
    <dir>/base.yaml        the --config file the trials start from (a copy)
    <dir>/space.yaml       the search space
    <dir>/study.db         the Optuna study (SQLite): a killed study resumes from it
    <dir>/trials/trial-NNNN/   each trial's run directory (checkpoints, metrics, MLflow run)
    <dir>/best.yaml        the best trial's config, for ``rlloop train ALGO --config``

Trials sample with TPE and report every evaluation's return to the median pruner, which
stops a trial whose return falls below the median of earlier trials at the same evaluation
(rl-zoo's setup). A trial's value is its last evaluation's mean return. A trial cut short
by a kill is marked failed when the study resumes, and its parameters are tried again.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from rlloop.config.loading import build_config
from rlloop.config.run_config import RunConfig
from rlloop.errors import ConfigError, EnvError
from rlloop.runs.lock import RunLock
from rlloop.system.run_files import STUDY_FILE, write_file
from rlloop.system.signals import installed
from rlloop.trainers.callbacks import Callback
from rlloop.tuning.settings import TuneSettings
from rlloop.tuning.space import as_set
from rlloop.tuning.study_dir import fit_batch
from rlloop.tuning.trust import check_study_links, check_trial_dir

STUDY_NAME = "rlloop"
_SETTINGS = STUDY_FILE


@dataclass
class TuneResult:
    dir: Path
    best_value: float | None
    best_params: dict[str, Any]
    best_config: Path | None
    counts: dict[str, int]


class OptunaPruning(Callback):
    """Reports each evaluation's mean return to the trial; stops the run when pruned."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial
        self.evals = 0
        self.pruned_at: int | None = None

    def on_eval(self, stats: dict[str, float]) -> bool | None:
        value = stats.get("eval/return_mean", math.nan)
        if not math.isfinite(value):
            return None
        self.trial.report(float(value), step=self.evals)
        self.evals += 1
        if self.pruned_at is None and self.trial.should_prune():
            self.pruned_at = self.evals - 1
            return False
        return None


class Study:
    """An Optuna study in a tune directory, and the trials it runs as rlloop runs."""

    def __init__(self, path: Path, settings: TuneSettings, *, quiet: bool = False,
                 say: Callable[[str], None] = print, worker: int = 0) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)  # one line per trial is ours
        self.path = path
        self.settings = settings
        self.quiet = quiet
        self.say = say
        self.space = settings.params()
        self.storage = optuna.storages.RDBStorage(f"sqlite:///{(path / 'study.db').resolve()}")
        self.study = optuna.create_study(
            study_name=STUDY_NAME, storage=self.storage, direction="maximize",
            load_if_exists=True,
            pruner=optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials,
                                               n_warmup_steps=settings.warmup_evals))
        # Workers of one study draw different random points: a seed each; and a resumed
        # study a seed of its own (the same seed drew the first trials' points again).
        sitting = len(self.study.get_trials(deepcopy=False))
        self.study.sampler = optuna.samplers.TPESampler(
            n_startup_trials=settings.startup_trials,
            seed=settings.seed + worker + 10_007 * sitting)

    # ---- bookkeeping ------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        return {state.name.lower(): sum(t.state == state for t in trials)
                for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                              TrialState.RUNNING, TrialState.WAITING)}

    def finished(self) -> int:
        counts = self.counts()
        return counts["complete"] + counts["pruned"]

    def recover(self) -> None:
        """Trials left running by a killed study: marked failed, their parameters queued
        again. Only called by the lock holder, so no other process is running them."""
        from optuna.trial import TrialState

        study_id = self.storage.get_study_id_from_name(STUDY_NAME)
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id,
                                                                            trial.number)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
            self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            self.say(f"trial {trial.number} was cut short (the study was killed); its "
                     "parameters are tried again")

    # ---- running trials -----------------------------------------------------------------
    def optimize(self) -> None:
        """Run trials one at a time until the study holds ``trials`` finished ones (with
        workers beside this process, the running ones count too)."""
        from optuna.trial import TrialState

        failures = 0
        while True:
            counts = self.counts()
            if counts["complete"] + counts["pruned"] + counts["running"] >= self.settings.trials:
                return
            self.study.optimize(self._objective, n_trials=1, catch=(ConfigError,),
                                callbacks=[self._report])
            last = self.study.get_trials(deepcopy=False)[-1]
            failures = failures + 1 if last.state == TrialState.FAIL else 0
            if failures >= 5:
                raise ConfigError(f"5 trials in a row failed (last: "
                                  f"{last.user_attrs.get('error', 'see its run directory')}); "
                                  "fix the search space or base config")

    def trial_config(self, sets: Sequence[str]) -> RunConfig:
        s = self.settings
        base = self.path / "base.yaml"
        file = base if base.is_file() else None
        flags = dict(s.flags)
        if self.quiet:
            flags["progress"] = False
        mentioned = " ".join(s.sets) + (base.read_text(encoding="utf-8") if file else "")
        if "save_video" not in mentioned:  # a film of every trial costs seconds each
            flags["save_video"] = False
        config = build_config(s.algo, s.env, file=file, flags=flags, sets=[*s.sets, *sets])
        return fit_batch(config)

    def _objective(self, trial: Any) -> float:
        import optuna

        from rlloop.learners.nonfinite import NonFiniteError
        from rlloop.runs.start import train

        values = {p.key: p.suggest(trial) for p in self.space}
        sets = [as_set(k, v) for k, v in values.items()]
        run_dir = self.path / "trials" / f"trial-{trial.number:04d}"
        check_trial_dir(run_dir)  # a link planted there would take the run elsewhere
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("sets", sets)
        try:
            config = self.trial_config(sets)
        except ConfigError as e:
            trial.set_user_attr("error", str(e))
            raise
        pruning = OptunaPruning(trial)
        try:
            result = train(config, run_dir, callbacks=[pruning])
        # E.g. the algorithm does not fit the env, or these values make every update NaN
        # (a failed trial; the study goes on).
        except (ConfigError, EnvError, NonFiniteError) as e:
            trial.set_user_attr("error", str(e))
            raise ConfigError(str(e)) from None
        if result.stopped_by.startswith("signal"):
            # Stopped by the user: not a result. The next `--resume` tries it again.
            self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            raise KeyboardInterrupt
        trial.set_user_attr("env_steps", result.env_steps)
        if pruning.pruned_at is not None:
            raise optuna.TrialPruned(f"pruned at evaluation {pruning.pruned_at}")
        value = result.last_stats.get("eval/return_mean", result.best_eval_return)
        return float("nan" if value is None else value)

    def _report(self, study: Any, trial: Any) -> None:
        values = " ".join(f"{k}={v}" for k, v in _short(trial.user_attrs.get("sets", [])).items())
        if trial.state.name == "COMPLETE":
            what = f"return {trial.value:.4g}"
        elif trial.state.name == "PRUNED":
            last = trial.last_step
            what = (f"pruned at evaluation {last} (return "
                    f"{trial.intermediate_values.get(last, math.nan):.4g})")
        else:
            what = f"failed ({trial.user_attrs.get('error', 'see its run directory')})"
        done = self.finished()
        self.say(f"trial {trial.number} [{done}/{self.settings.trials}]: {what}  {values}")

    # ---- the result ---------------------------------------------------------------------
    def write_best(self) -> TuneResult:
        """``best.yaml``: the best complete trial's config as ``rlloop train --config``
        reads it (without tune's own settings: trials skip the video)."""
        from optuna.trial import TrialState

        counts = self.counts()
        complete = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        scored = [t for t in complete if t.value is not None and math.isfinite(t.value)]
        if not scored:
            return TuneResult(self.path, None, {}, None, counts)
        best = max(scored, key=lambda t: float(t.value))  # type: ignore[arg-type]
        s = self.settings
        base = self.path / "base.yaml"
        sets = [*s.sets, *best.user_attrs["sets"]]
        config = fit_batch(build_config(s.algo, s.env, file=base if base.is_file() else None,
                                         flags=s.flags, sets=sets))
        header = (f"# rlloop tune: trial {best.number} of {self.path}, last eval return "
                  f"{best.value:.6g}\n# train it: rlloop train {s.algo} --config "
                  f"{self.path / 'best.yaml'}\n")
        out = self.path / "best.yaml"
        write_file(out, header + yaml.safe_dump(config.to_dict(), sort_keys=False))
        params = _short(best.user_attrs["sets"])
        return TuneResult(self.path, float(best.value), params, out, counts)  # type: ignore[arg-type]


def _short(sets: Sequence[str]) -> dict[str, str]:
    """Sampled ``key=value`` items for display, floats to 4 significant digits."""
    out = {}
    for item in sets:
        key, _, text = item.partition("=")
        value = json.loads(text)
        out[key] = f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
    return out


def tune(path: Path, settings: TuneSettings, *, jobs: int = 1, quiet: bool = False,
         say: Callable[[str], None] = print) -> TuneResult:
    """Run (or continue) the study in ``path`` until it holds ``settings.trials`` finished
    trials, ``jobs`` trials at a time, then write ``best.yaml``."""
    if jobs <= 0:
        raise ConfigError(f"--jobs must be > 0, got {jobs}")
    with RunLock(path):
        check_study_links(path)  # under the lock: neither the writes below nor SQLite's follow one
        write_file(path / _SETTINGS, json.dumps(asdict(settings), indent=2))
        write_file(path / "space.yaml", yaml.safe_dump(settings.space, sort_keys=False))
        study = Study(path, settings, quiet=quiet or jobs > 1, say=say)
        study.recover()
        if jobs == 1:
            study.optimize()
        else:
            _run_workers(path, jobs)
        return study.write_best()


def _run_workers(path: Path, jobs: int) -> None:
    """``jobs`` worker processes sharing the study (Optuna's SQLite storage is safe across
    processes); each runs whole trials in its own main thread, as a single run does."""
    # -P: the working directory (a study's, say) is not put first on the workers' sys.path,
    # where a module in it (yaml.py) would shadow the one rlloop imports.
    cmd = [sys.executable, "-P", "-m", "rlloop.tuning.worker", str(path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH"))
        if p)}
    workers = [subprocess.Popen([*cmd, str(i)], env=env) for i in range(jobs)]

    def forward(signum: int, _: Any) -> None:
        # Ctrl-C reaches the whole process group; a SIGTERM only this process: the
        # workers get it too, then are waited for as after Ctrl-C.
        for w in workers:
            with contextlib.suppress(OSError):
                w.send_signal(signum)
        raise KeyboardInterrupt

    with installed({signal.SIGTERM: forward}):
        try:
            codes = [w.wait() for w in workers]
        except BaseException:
            for w in workers:  # give them time to save their trials
                try:
                    w.wait(60)
                except subprocess.TimeoutExpired:
                    w.kill()
            raise
    if any(codes):
        raise RuntimeError(f"tune workers exited with {codes}; see their messages above")
