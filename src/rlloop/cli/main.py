"""``rlloop`` command line: train, resume, evaluate, export, plot, tune.

Exit codes: 0 done; 2 bad input (a flag, config value, env, path or checkpoint that cannot
work, or a run directory another training process holds), with one line on stderr naming
the problem and the fix; 3 a full disk (one line naming the directory and the space
needed; the run resumes once there is room); 1 anything else that stopped the command (a
bug, a logging store failing), also as one line on stderr (``RLLOOP_TRACEBACK=1`` shows
the traceback instead).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlloop.cli.arguments import build_parser as _parser
from rlloop.cli.collect import apply_dataset_flag, check_offline_run, collect_command
from rlloop.cli.early_checks import (
    algorithm_arg,
    check_action_space,
    check_extras,
    check_new_run_dir,
    check_saved_run,
    check_video_file,
)
from rlloop.cli.tune import tune_command
from rlloop.config.loading import check_set_keys
from rlloop.config.registry import ALGORITHMS
from rlloop.config.run_config import MAX_EVAL_EPISODES
from rlloop.errors import CheckpointError, ConfigError, EnvError, RlloopError, RunDirError
from rlloop.system.run_files import check_run_dir
from rlloop.system.user_code import callback_note, one_line

#: What ``rlloop eval --json`` prints besides ``episodes``: the evaluation's own names, also
#: logged as ``eval/<name>`` in metrics.jsonl and returned by the API's ``evaluate()``.
EVAL_KEYS = ("return_mean", "return_std", "return_min", "return_max", "length_mean")
#: ``eval --json``'s names before 0.2.0 (old name -> new name), printed beside the new ones
#: for one release so that scripts written against them keep working; deprecated in
#: CHANGELOG.md and removed in 0.3.0.
DEPRECATED_EVAL_KEYS = {"mean_return": "return_mean", "std_return": "return_std",
                        "min_return": "return_min", "max_return": "return_max",
                        "mean_length": "length_mean"}

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_DISK_FULL = 3


def _check_env(args: argparse.Namespace) -> int:
    """Each finding on its own line; exit 1 when one is an error (warnings do not stop
    training, so they alone exit 0)."""
    from rlloop.envs.checker import check_env

    findings = check_env(args.env_id)
    for finding in findings:
        print(finding)
    if not findings:
        print(f"{args.env_id}: no problems found")
    return EXIT_FAILED if any(not f.warning for f in findings) else 0


def _presets(args: argparse.Namespace) -> int:
    from rlloop.config.presets import listing, preset_yaml

    if args.algo and args.algo.lower() in ALGORITHMS:  # any case, as train takes it
        args.algo = args.algo.lower()
    if args.algo and args.env:
        print(preset_yaml(args.algo, args.env), end="")
        return 0
    rows = listing(args.algo, args.env)
    width = max(len(row.env) for row in rows)
    print(f"{'env':{width}s}  {'algo':6s} {'budget':>10s}  rl-zoo score (at that budget)")
    for row in rows:
        budget = f"{row.budget:,}" if row.budget else "-"
        zoo = ("-" if row.zoo_score is None else f"{row.zoo_score:g}" if row.zoo_std is None
               else f"{row.zoo_score:g} +- {row.zoo_std:g}")
        print(f"{row.env:{width}s}  {row.algo:6s} {budget:>10s}  {zoo}")
    offline = sorted({row.algo for row in rows if ALGORITHMS[row.algo].offline})
    if offline:
        print(f"({', '.join(offline)}: the budget counts gradient updates)")
    print("print one as YAML: rlloop presets ALGO --env ENV (use it with --config)")
    return 0


def _train(args: argparse.Namespace) -> int:
    args.algo = algorithm_arg(args.algo)  # before torch is imported: a typo answers at once
    if args.resume is not None:
        if not args.resume.strip():
            raise RunDirError("--resume is empty; pass the run directory to continue")
        check_run_dir(args.resume)
        if args.run_dir is not None and Path(args.run_dir).resolve() != Path(
                args.resume).resolve():
            raise RunDirError(f"--run-dir {args.run_dir} with --resume {args.resume}: a "
                              "resumed run stays in its own directory; drop --run-dir (copy "
                              "the run first to continue it elsewhere)")
        check_saved_run(args.resume, allow_import=args.allow_import)
    apply_dataset_flag(args)  # bc, cql, iql: --dataset, and the env it names
    # Typos in the env id or a --set key answer here, before torch's second of import.
    check_set_keys(args.algo, args.sets)
    settings = _settings(args)
    env_id = None
    if not args.resume:
        # An env the user typed, or named in the --config file they gave (e.g. the
        # best.yaml `rlloop tune` suggests): its module may be imported.
        from rlloop.config.loading import load_yaml
        from rlloop.envs.ids import resolve_env_id

        env = args.env or (load_yaml(Path(args.config)).get("env") if args.config else None)
        if isinstance(env, str) and env:
            env_id = resolve_env_id(env, allow_import=True, search_cwd=True)
    if settings is not None:
        check_extras(settings)
        if env_id is not None:
            check_action_space(args.algo, env_id, settings.get("env_kwargs"))
        if not args.resume:
            check_offline_run(args.algo, settings, env_id)
    from rlloop.logging.process_sink import prestart
    from rlloop.runs.report import FIGURE_PRELOAD

    if _wants_mlflow(args, settings):
        from rlloop.logging.mlflow_sink import PRELOAD

        # MLflow's import (~2 s) then runs in its child on another core while this process
        # imports torch and builds the run; unused (bad input), it is killed when the
        # command ends.
        prestart(PRELOAD)
    # Likewise matplotlib's, for the report's figures (rlloop.runs.report.FigureWriter). Niced:
    # the MLflow child's import is the longer one, and the figures are needed last.
    prestart(FIGURE_PRELOAD, niceness=5)
    try:
        return _train_run(args)
    finally:
        from rlloop.logging.process_sink import discard_spares

        discard_spares()


def _settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The settings ``rlloop train`` is asked for (the preset, the config file, the saved
    config on resume and ``--set``), read without importing torch; None when they do not
    even merge (the run's own checks then say why)."""
    from rlloop.config.loading import config_layers, load_yaml

    try:
        base = load_yaml(Path(args.resume) / "config.yaml") if args.resume else None
        algo = str(base.get("algo", args.algo)) if base else args.algo
        flags = {"backend": getattr(args, "backend", None)}
        return config_layers(algo, args.env, file=args.config, sets=args.sets, base=base,
                             flags=flags)
    except RlloopError:
        return None


def _wants_mlflow(args: argparse.Namespace, settings: dict[str, Any] | None = None) -> bool:
    """Whether the run ``rlloop train`` is asked for logs to MLflow: its ``mlflow``
    setting after every layer (``_settings``). Input the run will refuse counts as yes."""
    settings = _settings(args) if settings is None else settings
    return settings is None or settings.get("mlflow", True) is not False


def _train_run(args: argparse.Namespace) -> int:
    from rlloop.config.loading import build_config
    from rlloop.logging import format_number, print_summary
    from rlloop.trainers.callbacks import load_callback

    _allow_import_needs_resume(args)

    callbacks = [load_callback(spec) for spec in args.callbacks]
    if args.ray_address is not None:  # before --set: an explicit ray.address wins
        args.sets.insert(0, f"ray.address={json.dumps(args.ray_address)}")

    flags: dict[str, Any] = {"seed": args.seed, "backend": args.backend,
                             "num_envs": args.num_envs, "total_env_steps": args.total_env_steps,
                             "device": args.device}
    if args.quiet:
        flags["progress"] = False
    if args.profile:  # the defaults, under any profile: section the config file has
        flags["profile"] = {}
    if args.resume:
        from rlloop.runs.saved import load_run_config
        from rlloop.runs.start import resume

        saved = load_run_config(args.resume, allow_import=args.allow_import)
        if saved.algo != args.algo:
            raise ConfigError(f"{args.resume} is a {saved.algo} run, not {args.algo}; "
                              f"use `rlloop train {saved.algo} --resume {args.resume}`")
        # --quiet and --profile hold for the invocation that passes them: a resume without
        # them shows progress and does not profile, whatever the run's config.yaml says.
        flags["progress"] = not args.quiet
        sets = args.sets if args.profile else ["profile=null", *args.sets]
        result = resume(args.resume, allow_import=args.allow_import, env=args.env,
                        file=args.config, sets=sets, callbacks=callbacks,
                        started_at=_process_start(),
                        **{k: v for k, v in flags.items() if v is not None})
    else:
        check_new_run_dir(args.run_dir)
        # Every setting is checked here, before torch's second of import.
        config = build_config(args.algo, args.env, file=args.config, flags=flags,
                              sets=args.sets)
        from rlloop.runs.start import train

        result = train(config, args.run_dir, callbacks=callbacks, started_at=_process_start())
    best = result.best_eval_return
    lines = {
        "env steps": f"{result.env_steps:,}",
        # The whole command's, start-up and the end-of-run report and video included.
        "wall time": f"{time.time() - _process_start():.1f} s",
        "best eval return": "n/a" if best is None else format_number(best),
        # "signal SIGINT (Ctrl-C)": the name scripts match, and the key the user pressed.
        "stopped by": result.stopped_by + (" (Ctrl-C)" if result.stopped_by == "signal SIGINT"
                                           else ""),
        "run directory": str(result.run_dir),
        "best policy": str(result.run_dir / "best") if (result.run_dir / "best").is_dir()
        else "none (no evaluation saved one)",
        "metrics": str(result.run_dir / "metrics.jsonl"),
    }
    if result.mlflow_ui:  # absent with mlflow=false or when the store was never reached
        lines["mlflow ui"] = result.mlflow_ui
    print_summary(lines)
    return 0


def _ignore_save_requests() -> None:
    """SIGUSR1 (save a checkpoint) is the training loop's: before it starts there is
    nothing to save and after it ends the final checkpoint is written, but the signal's
    default action would kill the process there (a scheduler's checkpoint request during
    start-up or the report). The loop installs its own handler for its duration."""
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _process_start() -> float:
    """When this process started (``time.time()`` scale). On Linux from its start in
    clock ticks since boot and the uptime (to ~10 ms): psutil's ``create_time`` adds
    the boot time, which the kernel gives in whole seconds (up to 1 s off)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        import psutil

        return float(psutil.Process().create_time())


def _allow_import_needs_resume(args: argparse.Namespace) -> None:
    """--allow-import trusts a saved run; a new one imports the modules its command line
    names anyway, so the flag would be silently ignored."""
    if args.allow_import and not args.resume:
        raise ConfigError("--allow-import only applies with --resume (it trusts the modules "
                          "a saved run names); drop it: `rlloop train --env module:Env-v0` "
                          "imports the module you type")


def _eval(args: argparse.Namespace) -> int:
    if not 0 < args.episodes <= MAX_EVAL_EPISODES:
        raise ConfigError(f"--episodes must be in 1..{MAX_EVAL_EPISODES}, got {args.episodes}")
    check_run_dir(args.run_dir)  # before torch is imported
    check_saved_run(args.run_dir, allow_import=args.allow_import)
    if args.video:
        check_video_file(Path(args.video), Path(args.run_dir))
    from rlloop.runs.saved import evaluate_run

    stats = evaluate_run(Path(args.run_dir), args.episodes, args.backend, args.device,
                         allow_import=args.allow_import,
                         notify=lambda line: print(f"rlloop: warning: {line}", file=sys.stderr))
    # The names of metrics.jsonl's eval/ keys and of the API's evaluate(): one name per number.
    out: dict[str, Any] = {key: stats[key] for key in EVAL_KEYS}
    out["episodes"] = int(stats["episodes"])
    if args.video:
        from rlloop.runs.video import record_run_video

        video = record_run_video(args.run_dir, args.video, backend=args.backend,
                                 device=args.device, allow_import=args.allow_import)
        out.update({"video": str(video.path), "video_frames": video.frames})
    if args.json:
        out.update({old: out[new] for old, new in DEPRECATED_EVAL_KEYS.items()})
        print(json.dumps(out))
    else:
        print(f"{out['episodes']} episodes: return_mean {out['return_mean']:.2f} "
              f"+- {out['return_std']:.2f} (return_min {out['return_min']:.2f}, "
              f"return_max {out['return_max']:.2f})")
        if args.video:
            print(f"video: {out['video']} ({out['video_frames']} frames)")
    return 0


def _export(args: argparse.Namespace) -> int:
    check_run_dir(args.run_dir)  # before torch's import: a mistyped path answers at once
    check_saved_run(args.run_dir, allow_import=args.allow_import)
    from rlloop.cli.export import export_run

    path = export_run(args.run_dir, args.format, args.output, allow_import=args.allow_import,
                      notify=lambda line: print(f"rlloop: warning: {line}", file=sys.stderr))
    print(f"{args.format}: {path}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    for run_dir in args.run_dirs:  # before the plotting imports
        check_run_dir(run_dir)
    from rlloop.cli.plot import plot_runs

    drawn = plot_runs(args.run_dirs, args.output, args.metric, args.x)
    print(f"{args.output}: {sum(drawn.values())} runs in {len(drawn)} curves")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from rlloop.errors import DiskFullError, RlloopError

    try:
        args = _parser().parse_args(argv)
        if args.command in ("train", "tune") and argv is None:
            _ignore_save_requests()
        if args.command in ("train", "eval"):
            code = _train(args) if args.command == "train" else _eval(args)
            if argv is None:  # this process is the command: its work is done and saved
                _exit_now(code)
            return code
        if args.command == "tune":
            return tune_command(args)
        if args.command == "collect":
            return collect_command(args)
        if args.command == "presets":
            return _presets(args)
        if args.command == "check-env":
            return _check_env(args)
        if args.command in ("export", "plot"):
            return _export(args) if args.command == "export" else _plot(args)
        for name, entry in sorted(ALGORITHMS.items()):
            kinds = [k for k, ok in (("discrete", entry.discrete),
                                     ("continuous", entry.continuous)) if ok]
            print(f"{name:6s} actions: {', '.join(kinds)}")
        return 0
    except DiskFullError as e:
        print(f"rlloop: error: {e}", file=sys.stderr)
        return EXIT_DISK_FULL
    except (RlloopError, EnvError, CheckpointError) as e:
        print(f"rlloop: error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # a second stop signal: the run saved what it could
        print("rlloop: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # not bad input: a bug, or a store failing at exit
        if isinstance(e, BrokenPipeError) and _stdout_gone():
            # `rlloop presets | head`: the reader has what it wanted. Python would report
            # the pipe again when it flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_FAILED
        if os.environ.get("RLLOOP_TRACEBACK"):
            raise
        where = callback_note(e)  # a user's callback, not rlloop, raised it
        print(f"rlloop: error: {type(e).__name__}: {one_line(e)} "
              f"({'in callback ' + where + '; ' if where else 'unexpected; '}"
              "RLLOOP_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return EXIT_FAILED


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (a BrokenPipeError from
    anywhere else is a failure to report)."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no fileno (a notebook), no poll
        return False


def _exit_now(code: int) -> None:
    """End the process now, skipping the interpreter's module-by-module teardown: with
    torch, matplotlib and gymnasium loaded it costs ~0.5 s of CPU after the command is done.

    Exit handlers still run and the streams are flushed; a non-daemon thread (a user
    callback's) gets the normal exit instead, which waits for it.
    """
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
