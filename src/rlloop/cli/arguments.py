"""The ``rlloop`` command's arguments: every subcommand's flags, their help and examples.

Torch-free: ``rlloop --help`` and a mistyped flag answer at once.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from rlloop.cli.collect import add_collect_parser
from rlloop.config.loading import parse_int
from rlloop.config.registry import ALGORITHMS
from rlloop.config.run_config import BACKENDS
from rlloop.errors import ConfigError
from rlloop.system.device_names import DEVICE_CHOICES


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as one-line ConfigErrors instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message}; see `{self.prog} --help`")


def _integer(text: str) -> int:
    """An integer flag; ``1e6`` counts, as in config files."""
    try:
        return parse_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


TRAIN_EXAMPLES = """examples:
  rlloop train ppo --env CartPole-v1
  rlloop train sac --env Pendulum-v1 --seed 1 --total-env-steps 20000
  rlloop train ppo --env CartPole-v1 --set ppo.lr=0.001 --set ppo.ent_coef=0.01
  rlloop train ppo --resume runs/ppo-CartPole-v1-<time>
the --set keys and their values: rlloop presets ALGO --env ID"""

EVAL_EXAMPLES = """examples:
  rlloop eval runs/ppo-CartPole-v1-<time>
  rlloop eval runs/ppo-CartPole-v1-<time> --episodes 50 --json
  rlloop eval runs/ppo-CartPole-v1-<time> --video cartpole.mp4"""

TUNE_EXAMPLES = """examples:
  rlloop tune ppo --env CartPole-v1 --trials 20 --total-env-steps 50000
  rlloop tune --resume runs/tune-ppo-CartPole-v1-<time> --trials 40"""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rlloop", description="Train and evaluate RL agents.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train an agent (or resume a run)", epilog=TRAIN_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("algo", help=f"algorithm, any case: {', '.join(sorted(ALGORITHMS))}")
    t.add_argument("--env", help="env id, e.g. CartPole-v1 (default: CartPole-v1)")
    t.add_argument("--config", help="YAML config file")
    t.add_argument("--dataset", help="bc, cql, iql: the dataset to learn from (a directory "
                   "`rlloop collect` wrote, or minari:ID); without --env, the env it names "
                   "evaluates")
    t.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set ppo.lr=0.001 (repeatable); "
                   "`rlloop presets ALGO --env ID` prints every key with its value")
    t.add_argument("--seed", type=_integer, help="seed of the envs, the networks and the "
                   "sampling (default 0); the same seed repeats a run")
    t.add_argument("--run-dir", help="run directory (default runs/<algo>-<env>-<time>)")
    t.add_argument("--backend", choices=BACKENDS, help="how the envs are stepped (default "
                   "auto: native torch envs where rlloop has one, else Gymnasium's)")
    t.add_argument("--num-envs", type=_integer, help="envs stepped side by side (default: "
                   "the preset's, else 16)")
    t.add_argument("--device", help=f"{DEVICE_CHOICES} (default auto: CUDA when present)")
    t.add_argument("--total-env-steps", type=_integer, help="step budget summed over the "
                   "envs (default: the preset's); training stops earlier once solved")
    t.add_argument("--ray-address", help="Ray cluster for env runners (auto, host:6379, "
                   "ray://host:10001; default: a local instance on 127.0.0.1)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue this run from its last "
                   "checkpoint with its saved config (--set and flags may change budgets, "
                   "stop rules, evaluation and logging)")
    t.add_argument("--quiet", action="store_true", help="no progress line")
    t.add_argument("--allow-import", action="store_true", help="with --resume: let the run's "
                   "env id or network import the module it names (module:Env-v0, "
                   "ppo.net=module:Class); off, loading a run "
                   "never runs code it names")
    t.add_argument("--callback", dest="callbacks", action="append", default=[],
                   metavar="MODULE:CLASS",
                   help="a rlloop.trainers.callbacks.Callback subclass to call "
                   "on every step, eval and checkpoint (imports MODULE; repeatable)")
    t.add_argument("--profile", action="store_true", help="run torch.profiler over a few "
                   "training iterations and write a trace (Perfetto, TensorBoard) to "
                   "<run>/profile; tune it with --set profile.wait=/warmup=/active=")

    e = sub.add_parser("eval", help="evaluate the best policy of a run", epilog=EVAL_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("run_dir", help="a run directory `rlloop train` wrote (it prints it)")
    e.add_argument("--episodes", type=_integer, default=20, help="deterministic episodes "
                   "to play (default 20)")
    e.add_argument("--backend", choices=BACKENDS, help="how the envs are stepped (default: "
                   "the run's own setting)")
    e.add_argument("--device", help=f"{DEVICE_CHOICES} (default: the run's own setting); a "
                   "run trained on one device evaluates on any other")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--allow-import", action="store_true", help="let the run's env id or "
                   "network import the module it names (module:Env-v0, "
                   "ppo.net=module:Class); off, loading a run never runs code it names")
    e.add_argument("--video", metavar="OUT.mp4", help="also film one deterministic episode "
                   "of the policy to this mp4")

    x = sub.add_parser("export", help="write a run's deterministic policy (observation "
                       "normalisation included) as ONNX or TorchScript")
    x.add_argument("run_dir", help="a run directory `rlloop train` wrote")
    x.add_argument("--format", required=True, choices=("onnx", "torchscript"),
                   help="onnx (needs pip install 'rlloop[export]') or torchscript")
    x.add_argument("-o", "--output", help="output file (default <run>/policy.onnx or "
                   "<run>/policy.pt)")
    x.add_argument("--allow-import", action="store_true", help="let the run's env id or "
                   "network import the module it names (module:Env-v0, ppo.net=module:Class)")

    g = sub.add_parser("plot", help="overlay the learning curves of runs (seeds of one "
                       "setting as mean and min-max band) in one PNG")
    g.add_argument("run_dirs", nargs="+", metavar="RUN", help="run directories to overlay")
    g.add_argument("-o", "--output", default="runs.png", help="PNG to write (default runs.png)")
    g.add_argument("--metric", default="eval/return_mean", help="metrics.jsonl key to plot")
    g.add_argument("--x", default="env/steps", choices=("env/steps", "wall"),
                   help="x axis: env steps (default) or wall-clock seconds")

    u = sub.add_parser("tune", help="tune hyperparameters with Optuna (TPE, median pruning); "
                       "every trial is a run; writes the best config as YAML (needs pip "
                       "install 'rlloop[tune]')", epilog=TUNE_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    u.add_argument("algo", nargs="?", help="algorithm (may be left out with --resume)")
    u.add_argument("--env", help="env id (default: the config's, else CartPole-v1)")
    u.add_argument("--trials", type=_integer, help="finished trials the study runs to "
                   "(default 20; with --resume: raise it to run more)")
    u.add_argument("--jobs", type=_integer, default=1, help="trials run at once, each in its "
                   "own process (default 1)")
    u.add_argument("--space", help="search space YAML (key: {low, high, log} or [choices]); "
                   "default: the algorithm's own")
    u.add_argument("--config", help="YAML config every trial starts from")
    u.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value in every trial (repeatable); "
                   "`rlloop presets ALGO --env ID` prints every key")
    u.add_argument("--seed", type=_integer, help="seed of every trial and of the sampler")
    u.add_argument("--total-env-steps", type=_integer, help="each trial's step budget")
    u.add_argument("--num-envs", type=_integer, help="envs stepped side by side in each "
                   "trial")
    u.add_argument("--backend", choices=BACKENDS, help="how each trial's envs are stepped")
    u.add_argument("--device", help=f"{DEVICE_CHOICES} (default auto)")
    u.add_argument("--startup-trials", type=_integer, help="trials sampled at "
                   "random before TPE models the space and before pruning starts (default 5)")
    u.add_argument("--warmup-evals", type=_integer, help="evaluations a trial "
                   "makes before it may be pruned (default 1)")
    u.add_argument("--run-dir", help="the study's directory (default runs/tune-<algo>-<env>-"
                   "<time>); one that holds a study continues it")
    u.add_argument("--resume", metavar="DIR", help="continue the study in DIR (after a kill, "
                   "or with a higher --trials)")
    u.add_argument("--allow-import", action="store_true", help="with --resume: let the "
                   "study's saved env id, networks (module:Env-v0, ppo.net=module:Class) and "
                   "endpoints (mlflow_tracking_uri, ray.address) be used; off, resuming a study "
                   "never runs code or contacts a server it names")
    u.add_argument("--quiet", action="store_true", help="no progress line in trials")

    sub.add_parser("algos", help="list algorithms")
    c = sub.add_parser("check-env", help="check a Gymnasium env (spaces, dtypes, reset/step, "
                       "seeding, rendering): one line per problem, naming the fix")
    c.add_argument("env_id", help="a registered env id, or module:Env-v0 to import its module")
    _add_presets_parser(sub)
    add_collect_parser(sub, _integer)
    return p


def _add_presets_parser(sub: Any) -> None:
    s = sub.add_parser("presets", help="list the tuned presets (env, algorithm, rl-zoo budget "
                       "and score), or print one as YAML for --config")
    s.add_argument("algo", nargs="?", help="only this algorithm's presets")
    s.add_argument("--env", help="only this env's presets; with ALGO, print that preset as a "
                   "YAML config layer")
