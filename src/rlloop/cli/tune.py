"""``rlloop tune``: a hyperparameter study's flags checked, the study run, its best trial
summed up.

The flags are checked before Optuna or torch is imported, and a resumed study refuses the
flags that would change its settings (it keeps the ones it started with); the study itself
is :mod:`rlloop.tuning`.
"""

from __future__ import annotations

import argparse

from rlloop.cli.early_checks import algorithm_arg, check_new_run_dir
from rlloop.errors import ConfigError
from rlloop.system.extras import require


def tune_command(args: argparse.Namespace) -> int:
    """Run (or resume) the study ``args`` ask for and print its summary; exit code 0."""
    from rlloop.envs.ids import resolve_env_id
    from rlloop.logging import format_number, print_summary

    require("optuna", "rlloop tune")  # before the study's directory is written
    if args.algo is not None:
        args.algo = algorithm_arg(args.algo)
    from rlloop.tuning import prepare, tune

    if min(args.startup_trials or 0, args.warmup_evals or 0) < 0:
        raise ConfigError("--startup-trials and --warmup-evals must be >= 0")
    if args.jobs <= 0:
        raise ConfigError(f"--jobs must be > 0, got {args.jobs}")
    if args.env:
        resolve_env_id(args.env, allow_import=True, search_cwd=True)
    if not args.resume:
        check_new_run_dir(args.run_dir)
    flags = {k: v for k, v in (("seed", args.seed), ("total_env_steps", args.total_env_steps),
                               ("num_envs", args.num_envs), ("backend", args.backend),
                               ("device", args.device)) if v is not None}
    if args.resume:  # a study keeps the settings it started with: they were ignored
        given = [name for name, value in (
            ("--env", args.env), ("--space", args.space), ("--config", args.config),
            ("--set", args.sets), ("--run-dir", args.run_dir),
            ("--startup-trials", args.startup_trials is not None),
            ("--warmup-evals", args.warmup_evals is not None),
            *((f"--{k.replace('_', '-')}", v) for k, v in flags.items())) if value]
        if given:
            raise ConfigError(f"tune --resume continues a study with its own settings; "
                              f"{', '.join(given)} cannot change them (only --trials, "
                              "--jobs and --allow-import may be given): drop them, or start "
                              "a new study")
    path, settings = prepare(args.algo, args.env, trials=args.trials, run_dir=args.run_dir,
                             resume=args.resume, space_file=args.space, config_file=args.config,
                             sets=args.sets, flags=flags,
                             startup_trials=5 if args.startup_trials is None
                             else args.startup_trials,
                             warmup_evals=1 if args.warmup_evals is None else args.warmup_evals,
                             allow_import=args.allow_import)
    result = tune(path, settings, jobs=args.jobs, quiet=args.quiet)
    counts = result.counts
    lines = {"trials": f"{counts['complete']} complete, {counts['pruned']} pruned, "
                       f"{counts['fail']} failed",
             "best eval return": ("n/a" if result.best_value is None
                                  else format_number(result.best_value)),
             **{f"  {k}": v for k, v in result.best_params.items()},
             "study": str(path / "study.db"),
             "trial runs": str(path / "trials")}
    if result.best_config is not None:
        lines["best config"] = str(result.best_config)
        lines["train it"] = f"rlloop train {settings.algo} --config {result.best_config}"
    print_summary(lines)
    return 0
