"""``rlloop collect`` and the offline side of ``rlloop train``: record a run's policy as a
Minari dataset, and check ``--dataset`` before torch is imported."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rlloop.config.offline import (
    check_dataset_given,
    check_dataset_output,
    dataset_env_id,
    dataset_metadata,
    space_mismatch,
)
from rlloop.config.registry import ALGORITHMS
from rlloop.errors import ConfigError
from rlloop.system.extras import require
from rlloop.system.run_files import check_run_dir

COLLECT_EXAMPLES = """examples:
  rlloop collect runs/ppo-CartPole-v1-<time> --episodes 200 -o data/cartpole-expert
  rlloop collect runs/sac-Pendulum-v1-<time> --episodes 100 --epsilon 0.5 -o data/pendulum-mixed
  rlloop train bc --dataset data/cartpole-expert"""


def add_collect_parser(sub: Any, integer: Any) -> None:
    c = sub.add_parser("collect", help="record episodes of a run's best policy as a Minari "
                       "dataset (for rlloop train bc/cql/iql --dataset)",
                       epilog=COLLECT_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("run_dir", help="a run directory `rlloop train` wrote")
    c.add_argument("-o", "--output", required=True, help="the dataset's directory (new)")
    c.add_argument("--episodes", type=integer, default=100, help="episodes to record "
                   "(default 100)")
    c.add_argument("--stochastic", action="store_true", help="sample the policy's actions "
                   "(default: greedy)")
    c.add_argument("--epsilon", type=float, default=0.0, help="probability of a uniformly "
                   "random action instead of the policy's, per step (default 0)")
    c.add_argument("--seed", type=integer, default=0, help="seed of the envs and the noise")
    c.add_argument("--num-envs", type=integer, default=8, help="envs stepped side by side")
    c.add_argument("--device", help="where the policy acts (default: the run's own)")
    c.add_argument("--allow-import", action="store_true", help="let the run's env id or "
                   "network import the module it names")


def collect_command(args: argparse.Namespace) -> int:
    check_run_dir(args.run_dir)  # before torch's import: a mistyped path answers at once
    require("minari", "rlloop collect")
    check_dataset_output(args.output)
    from rlloop.runs.collect import collect

    result = collect(args.run_dir, args.episodes, args.output,
                     deterministic=not args.stochastic, epsilon=args.epsilon, seed=args.seed,
                     num_envs=args.num_envs, device=args.device,
                     allow_import=args.allow_import)
    print(f"{result.path}: {result.episodes} episodes, {result.steps:,} steps, "
          f"return_mean {result.return_mean:.2f}")
    return 0


def apply_dataset_flag(args: argparse.Namespace) -> None:
    """``--dataset`` as the algorithm's ``dataset`` setting, and the env the dataset was
    recorded in when ``--env`` is not given. Raises ``ConfigError`` for ``--dataset`` with
    an algorithm that does not take one."""
    if args.dataset is None:
        return
    if not ALGORITHMS[args.algo].offline:
        offline = ", ".join(sorted(a for a, e in ALGORITHMS.items() if e.offline))
        raise ConfigError(f"--dataset is for the offline algorithms ({offline}); {args.algo} "
                          "learns from its env: drop --dataset")
    args.sets.insert(0, f"{args.algo}.dataset={json.dumps(args.dataset)}")
    if args.env is None and args.config is None and args.resume is None:
        check_dataset_given(args.algo, args.dataset)
        args.env = dataset_env_id(args.dataset)
        if args.env is None:
            raise ConfigError(f"dataset {args.dataset} names no env; pass --env ENV_ID (the "
                              "env the policy is evaluated in)")


def check_offline_run(algo: str, settings: dict[str, Any], env_id: str | None) -> None:
    """An offline algorithm's dataset, before torch is imported: given, on disk, and (when
    the env is a Gymnasium one made without torch) recorded in spaces the env has."""
    if not ALGORITHMS[algo].offline:
        return
    section = settings.get(algo)
    dataset = section.get("dataset", "") if isinstance(section, dict) else ""
    check_dataset_given(algo, str(dataset or ""))
    meta = dataset_metadata(str(dataset))
    if env_id is None:
        return
    import gymnasium

    try:
        env = gymnasium.make(env_id)
        obs_shape, space = tuple(env.observation_space.shape or ()), env.action_space
        env.close()
    except Exception:  # the run makes the env again and reports what is wrong in its words
        return
    kind = type(space).__name__
    shape = (int(space.n),) if kind == "Discrete" else tuple(space.shape or ())  # type: ignore[attr-defined]
    problem = space_mismatch(str(dataset), meta, env_id, obs_shape, kind, shape)
    if problem is not None:
        raise ConfigError(problem)
