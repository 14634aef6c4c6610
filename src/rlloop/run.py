"""A training run on disk: run directory, sinks, checkpoints, signals, resume.

This is the composition root the CLI calls. The :class:`~rlloop.trainer.Trainer`
knows nothing about files; everything that touches the run directory lives here.

Run directory layout::

    <run>/config.yaml        the full resolved config
    <run>/run.json           run identity (MLflow run id, algo, env)
    <run>/metrics.jsonl      one JSON object per logged step
    <run>/checkpoints/<env steps>/   periodic checkpoints (last N kept) + the final one;
                             named by optimisation steps for off-policy algorithms
    <run>/best/              checkpoint with the best eval return so far
    <run>/mlflow.db          the embedded MLflow store (``mlflow ui`` reads it)
    <run>/video.mp4          one episode of the best policy (``save_video``)
    <run>/report.md, summary.json, learning_curve.svg
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from rlloop.algorithms import ALGORITHMS, AlgorithmBase, EnvSettings
from rlloop.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    is_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_replacing,
)
from rlloop.conditions import Condition, HitsUpperBound
from rlloop.config import RunConfig, build_config, load_yaml, resumable
from rlloop.envs.core import Box, Discrete
from rlloop.envs.registry import env_spec
from rlloop.errors import ConfigError, RunDirError
from rlloop.logging import ConsoleSink, JsonlSink, MultiSink, ProcessSink, Sink, ThrottledSink
from rlloop.numerics import flushed_denormals
from rlloop.offpolicy_trainer import OffPolicyTrainer
from rlloop.report import write_report
from rlloop.signals import handle_signals
from rlloop.trainer import Stats, Trainer

COMPONENTS = ("algorithm", "trainer", "rng")


def build_algorithm(config: RunConfig) -> AlgorithmBase:
    """Validate the config against the env's spaces, then build the algorithm.

    Checks that need no env run first, so bad sizes fail before any env is created.
    """
    check = getattr(config.hparams, "check_batch", None)
    if check is not None:
        check(config.num_envs)
    spec = env_spec(config.env, config.backend, env_kwargs=config.env_kwargs)
    entry = ALGORITHMS[config.algo]
    space = spec.action_space
    if isinstance(space, Discrete) and not entry.discrete:
        raise ConfigError(f"{config.algo} needs continuous (Box) actions but {config.env} has "
                          "discrete ones; use ppo or dqn for this env")
    if isinstance(space, Box) and not entry.continuous:
        raise ConfigError(f"{config.algo} needs discrete actions but {config.env} has "
                          "continuous ones; use ppo, sac or td3 for this env")
    settings = EnvSettings(config.env, spec, config.num_envs, config.backend, config.seed,
                           config.total_env_steps, config.horizons_per_env_reset,
                           dict(config.env_kwargs), config.on_nonfinite)
    return entry.build(config.hparams, settings)


def default_run_dir(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # One path component whatever the id holds ("ale_py:ALE/Pong-v5" -> ale_py-ALE-Pong-v5).
    env = re.sub(r"[^\w.-]+", "-", config.env)
    return Path("runs") / f"{config.algo}-{env}-{stamp}"


def solve_threshold(config: RunConfig) -> float | None:
    if config.solve_threshold is not None:
        return config.solve_threshold
    return env_spec(config.env, config.backend, env_kwargs=config.env_kwargs).reward_threshold


@dataclass
class RunResult:
    """What a finished run reports."""

    run_dir: Path
    env_steps: int
    wall_time_s: float
    best_eval_return: float | None
    last_stats: Stats = field(default_factory=dict)
    stopped_by: str = "budget"


class _Checkpoints:
    """Trainer callback: periodic, on-request (SIGUSR1) and best-so-far checkpoints."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def on_step(self, trainer: Trainer, stats: Stats) -> None:
        every = self.session.checkpoint_every
        steps = trainer.state["algorithm/steps"]
        if (every and steps % every == 0) or self.session.save_requested:
            self.session.save_requested = False
            self.session.save()

    def on_eval(self, trainer: Trainer, stats: Stats) -> None:
        value = stats.get("eval/return_mean", math.nan)
        best = self.session.best_eval_return
        if not math.isnan(value) and (best is None or value > best):
            self.session.best_eval_return = value
            save_replacing(self.session.run_dir / "best", self.session.components(),
                           metadata=self.session.metadata())


class Session:
    """One run directory with its algorithm, trainer, sinks and checkpoint manager."""

    def __init__(self, config: RunConfig, run_dir: Path, *, resume: bool = False,
                 console: Any = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.best_eval_return: float | None = None
        self.save_requested = False
        self.stop_requested: str | None = None
        self.solved = False
        torch.set_num_threads(config.torch_threads)
        self.algorithm = build_algorithm(config)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        self.manager = CheckpointManager(run_dir / "checkpoints", keep_last=config.keep_checkpoints)
        identity = _read_json(run_dir / "run.json") if resume else {}
        self.console = ConsoleSink(config.total_env_steps, console=console,
                                   enabled=config.progress)
        sinks: list[Sink] = [JsonlSink(run_dir / "metrics.jsonl"), self.console]
        self.identity = {"algo": config.algo, "env": config.env,
                         "mlflow_run_id": identity.get("mlflow_run_id")}
        self.mlflow: ProcessSink | None = None
        if config.mlflow:
            from rlloop.logging import MlflowSink, sqlite_tracking_uri

            # In a child process: importing MLflow and writing to its store is seconds of
            # pure-Python work that would otherwise stall the training loop.
            uri = config.mlflow_tracking_uri or sqlite_tracking_uri(run_dir / "mlflow.db")
            self.mlflow = ProcessSink(MlflowSink, tracking_uri=uri,
                                      experiment_name=config.experiment,
                                      run_name=run_dir.name,
                                      run_id=self.identity["mlflow_run_id"])
            sinks.append(ThrottledSink(self.mlflow, config.mlflow_interval_s))
        if config.tensorboard:
            from rlloop.logging import TensorBoardSink

            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        self.sink = MultiSink(sinks)
        if not resume:
            self.sink.log_params(config.to_dict())
        _write_json(run_dir / "run.json", self.identity)
        # Off-policy algorithms run on border's cadence: evals and saves counted in
        # optimisation steps (their config section), checkpoints named by them.
        self.off_policy = hasattr(self.algorithm, "optimize")
        self.checkpoint_every = 0 if self.off_policy else config.checkpoint_every
        if self.off_policy:
            self.trainer: Trainer = OffPolicyTrainer(
                self.algorithm,  # type: ignore[arg-type]
                sink=self.sink, eval_episodes=config.eval_episodes,
                callbacks=[_Checkpoints(self)], save=lambda _: self.save())
        else:
            self.trainer = Trainer(self.algorithm, sink=self.sink,
                                   eval_episodes=config.eval_episodes,
                                   callbacks=[_Checkpoints(self)])
        if resume:
            self._restore()

    def _close_sinks(self, status: str) -> None:
        self.sink.close(status)
        if self.mlflow is not None and self.mlflow.info.get("run_id"):
            self.identity["mlflow_run_id"] = self.mlflow.info["run_id"]
            _write_json(self.run_dir / "run.json", self.identity)

    # ---- checkpoint contents -----------------------------------------------------------
    def components(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm.get_state(),
                "trainer": {**self.trainer.get_state(), "best_eval_return": self.best_eval_return},
                "rng": capture_rng_state()}

    def metadata(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "env_steps": self.trainer.state["env/steps"],
                "algo": self.config.algo, "env": self.config.env}

    def save(self, components: dict[str, Any] | None = None) -> Path:
        counter = "algorithm/steps" if self.off_policy else "env/steps"
        return self.manager.save(self.trainer.state[counter], components or self.components(),
                                 metadata=self.metadata())

    def _restore(self) -> None:
        ckpt = self.manager.load_latest(expected_components=COMPONENTS)
        if ckpt is None:
            raise RunDirError(f"{self.run_dir} has no loadable checkpoint to resume from; "
                              "start a new run instead")
        self.algorithm.set_state(ckpt.components["algorithm"])
        self.trainer.set_state(ckpt.components["trainer"])
        self.best_eval_return = ckpt.components["trainer"].get("best_eval_return")
        restore_rng_state(ckpt.components["rng"])

    # ---- the run -------------------------------------------------------------------------
    def stop_conditions(self) -> list[Condition]:
        conditions: list[Condition] = [HitsUpperBound("env/steps", self.config.total_env_steps),
                                       lambda _: self.stop_requested is not None]
        threshold = solve_threshold(self.config)
        if self.config.stop_on_solve and threshold is not None:
            reached = HitsUpperBound("eval/return_mean", threshold)
            conditions.append(lambda stats: reached(stats) and self._confirm_solved(threshold))
        return conditions

    def _confirm_solved(self, threshold: float) -> bool:
        """Solved only if a fresh evaluation over ``solve_episodes`` episodes reaches the
        threshold too: the mean of a few episodes can be lucky (PPO on Acrobot-v1 once
        "solved" at -79.8 right after evaluations of -500 and -295)."""
        cfg = self.config
        if cfg.solve_episodes > cfg.eval_episodes:
            with flushed_denormals(self.trainer.flush_denormal):
                result = self.algorithm.evaluate(cfg.solve_episodes)
            value = float(result["return_mean"])
            self.sink.log_metrics({"eval/solve_return_mean": value,
                                   "eval/solve_episodes": float(result["episodes"])},
                                  self.trainer.state["env/steps"])
            if value < threshold:
                return False
        self.solved = True
        return True

    def run(self) -> RunResult:
        """Train until a stop condition; always writes a final checkpoint and the report."""
        trainer, cfg = self.trainer, self.config
        stats: Stats = {}
        status = "FAILED"
        start = time.perf_counter()
        start_steps = trainer.state["env/steps"]
        final: dict[str, Any] | None = None
        try:
            with handle_signals(self):
                if trainer.state["env/steps"] < cfg.total_env_steps:
                    every = None if self.off_policy else cfg.eval_every or None
                    stats = trainer.run(steps_per_eval=every,
                                        stop_conditions=self.stop_conditions())
                if "eval/return_mean" not in stats:
                    # The final checkpoint holds the state as training left it: this
                    # extra evaluation advances eval seeds (and any global RNG the env
                    # draws from), which a run trained straight through never does.
                    final = self.components()
                    stats = {**stats, **trainer.eval()}
                    final["trainer"].update(latest_eval=dict(trainer.latest_eval),
                                            best_eval_return=self.best_eval_return)
            status = "KILLED" if self.stop_requested else "FINISHED"
        finally:
            if trainer.state["env/steps"] > start_steps or not self.manager.latest():
                self.save(final)
            self._close_sinks(status)
            self.algorithm.close()
        if cfg.save_video and not self.stop_requested:  # a stop signal wants a quick exit
            from rlloop.video import save_run_video

            save_run_video(self.run_dir)
        stopped_by = self._stopped_by(stats)
        result = RunResult(self.run_dir, trainer.state["env/steps"], time.perf_counter() - start,
                           self.best_eval_return, stats, stopped_by)
        write_report(self.run_dir, result, cfg)
        return result

    def _stopped_by(self, stats: Stats) -> str:
        if self.stop_requested:
            return f"signal {self.stop_requested}"
        return "solved" if self.solved else "budget"


def train(config: RunConfig, run_dir: str | Path | None = None, *,
          console: Any = None) -> RunResult:
    """Start a new run in ``run_dir`` (default ``runs/<algo>-<env>-<time>``)."""
    path = Path(run_dir) if run_dir else default_run_dir(config)
    if (path / "config.yaml").exists():
        raise RunDirError(f"{path} already holds a run; resume it with --resume {path} "
                          "or choose another --run-dir")
    return Session(config, path, console=console).run()


def load_run_config(run_dir: str | Path, **flags: Any) -> RunConfig:
    """The saved config of a run, with ``flags`` (e.g. total_env_steps) overriding it."""
    path = check_run_dir(run_dir)
    saved = load_yaml(path / "config.yaml")
    return build_config(saved.get("algo", "ppo"), saved.get("env"), base=saved, flags=flags)


def resume_config(run_dir: str | Path, *, env: str | None = None, file: str | Path | None = None,
                  sets: list[str] | None = None, **flags: Any) -> RunConfig:
    """A run's saved config with the overrides a resume may apply (see
    :func:`rlloop.config.resumable`); ``ConfigError`` names any other changed setting."""
    saved = load_run_config(run_dir)
    old = saved.to_dict()
    config = build_config(saved.algo, env, file=file, flags=flags, sets=sets, base=old)
    new = config.to_dict()
    changed = [f"{key}.{sub}" for key, value in new.items()
               if isinstance(value, dict) and key != "env_kwargs"
               for sub in value if value[sub] != old[key].get(sub)]
    changed += [key for key, value in new.items()
                if not (isinstance(value, dict) and key != "env_kwargs") and value != old[key]]
    fixed = [key for key in changed if not resumable(key, saved.algo)]
    if fixed:
        raise ConfigError(f"--resume cannot change {', '.join(fixed)} (the run's env, "
                          "networks and data depend on it); drop the override or start a new "
                          "run. A resume may change budgets, stop rules, evaluation, "
                          "checkpoint and logging settings")
    return config


def resume(run_dir: str | Path, *, console: Any = None, env: str | None = None,
           file: str | Path | None = None, sets: list[str] | None = None,
           **flags: Any) -> RunResult:
    """Continue a run from its last checkpoint with its saved config, changed by the
    overrides a resume allows (``flags``, ``--set`` items, a YAML ``file``)."""
    config = resume_config(run_dir, env=env, file=file, sets=sets, **flags)
    return Session(config, Path(run_dir), resume=True, console=console).run()


def check_run_dir(run_dir: str | Path) -> Path:
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise RunDirError(f"{path} is not an rlloop run directory (no config.yaml); pass a "
                          "directory made by `rlloop train`, e.g. runs/<run-name>")
    return path


def policy_checkpoint(run_dir: Path) -> Path:
    """The best checkpoint of a run, else its latest one."""
    if is_checkpoint(run_dir / "best"):
        return run_dir / "best"
    latest = CheckpointManager(run_dir / "checkpoints").latest()
    if latest is None:
        raise RunDirError(f"{run_dir} has no checkpoint yet; train it first")
    return latest


def evaluate_run(run_dir: str | Path, episodes: int = 20, backend: str | None = None
                 ) -> dict[str, float]:
    """Load a run's best policy and evaluate it deterministically on ``episodes`` episodes."""
    flags: dict[str, Any] = {"mlflow": False}
    if backend:
        flags["backend"] = backend
    config = load_run_config(run_dir, **flags)
    path = policy_checkpoint(Path(run_dir))
    algorithm = build_algorithm(config)
    try:
        state = load_checkpoint(path, expected_components=COMPONENTS).components["algorithm"]
        algorithm.set_policy_state(state)
        return algorithm.evaluate(episodes)
    finally:
        algorithm.close()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
