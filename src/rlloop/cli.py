"""``rlloop`` command line: train, resume, evaluate.

Bad input ends with exit code 2 and one line on stderr naming the problem and the fix.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlloop.algorithms import ALGORITHMS
from rlloop.config import BACKENDS

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlloop", description="Train and evaluate RL agents.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train an agent (or resume a run)")
    t.add_argument("algo", help=f"algorithm: {', '.join(sorted(ALGORITHMS))}")
    t.add_argument("--env", help="env id, e.g. CartPole-v1 (default: CartPole-v1)")
    t.add_argument("--config", help="YAML config file")
    t.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set ppo.lr=0.001 (repeatable)")
    t.add_argument("--seed", type=int)
    t.add_argument("--run-dir", help="run directory (default runs/<algo>-<env>-<time>)")
    t.add_argument("--backend", choices=BACKENDS)
    t.add_argument("--num-envs", type=int)
    t.add_argument("--total-env-steps", type=int)
    t.add_argument("--resume", metavar="RUN_DIR", help="continue this run from its last "
                   "checkpoint with its saved config (--set and flags may change budgets, "
                   "stop rules, evaluation and logging)")
    t.add_argument("--quiet", action="store_true", help="no progress line")

    e = sub.add_parser("eval", help="evaluate the best policy of a run")
    e.add_argument("run_dir")
    e.add_argument("--episodes", type=int, default=20)
    e.add_argument("--backend", choices=BACKENDS)
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--video", metavar="OUT.mp4", help="also film one deterministic episode "
                   "of the policy to this mp4")

    sub.add_parser("algos", help="list algorithms")
    return p


def _train(args: argparse.Namespace) -> int:
    from rlloop.config import build_config
    from rlloop.envs.registry import resolve_env_id
    from rlloop.logging import print_summary
    from rlloop.run import load_run_config, resume, train

    flags: dict[str, Any] = {"seed": args.seed, "backend": args.backend,
                             "num_envs": args.num_envs, "total_env_steps": args.total_env_steps}
    if args.quiet:
        flags["progress"] = False
    if args.resume:
        saved = load_run_config(args.resume)
        if saved.algo != args.algo:
            from rlloop.errors import ConfigError

            raise ConfigError(f"{args.resume} is a {saved.algo} run, not {args.algo}; "
                              f"use `rlloop train {saved.algo} --resume {args.resume}`")
        result = resume(args.resume, env=args.env, file=args.config, sets=args.sets,
                        **{k: v for k, v in flags.items() if v is not None})
    else:
        if args.env:  # typed by the user: its module:Id may be imported (see resolve_env_id)
            resolve_env_id(args.env, allow_import=True)
        config = build_config(args.algo, args.env, file=args.config, flags=flags,
                              sets=args.sets)
        result = train(config, args.run_dir)
    best = result.best_eval_return
    print_summary({
        "env steps": f"{result.env_steps:,}",
        "wall time": f"{result.wall_time_s:.1f} s",
        "best eval return": "n/a" if best is None else f"{best:.1f}",
        "stopped by": result.stopped_by,
        "run directory": str(result.run_dir),
        "best policy": str(result.run_dir / "best"),
        "metrics": str(result.run_dir / "metrics.jsonl"),
        "mlflow ui": f"mlflow ui --backend-store-uri sqlite:///{result.run_dir / 'mlflow.db'}",
    })
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rlloop.run import evaluate_run

    if args.episodes <= 0:
        from rlloop.errors import ConfigError

        raise ConfigError(f"--episodes must be > 0, got {args.episodes}")
    stats = evaluate_run(Path(args.run_dir), args.episodes, args.backend)
    out: dict[str, Any] = {
        "mean_return": stats["return_mean"], "std_return": stats["return_std"],
        "min_return": stats["return_min"], "max_return": stats["return_max"],
        "mean_length": stats["length_mean"], "episodes": int(stats["episodes"])}
    if args.video:
        from rlloop.video import record_run_video

        video = record_run_video(args.run_dir, args.video, backend=args.backend)
        out.update({"video": str(video.path), "video_frames": video.frames})
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['episodes']} episodes: mean return {out['mean_return']:.2f} "
              f"+- {out['std_return']:.2f} (min {out['min_return']:.1f}, "
              f"max {out['max_return']:.1f})")
        if args.video:
            print(f"video: {out['video']} ({out['video_frames']} frames)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from rlloop.checkpoint import CheckpointError
    from rlloop.envs.core import EnvError
    from rlloop.errors import RlloopError

    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "eval":
            return _eval(args)
        for name, entry in sorted(ALGORITHMS.items()):
            kinds = [k for k, ok in (("discrete", entry.discrete),
                                     ("continuous", entry.continuous)) if ok]
            print(f"{name:6s} actions: {', '.join(kinds)}")
        return 0
    except (RlloopError, EnvError, CheckpointError) as e:
        print(f"rlloop: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
