"""Scaling out with env runners: rlloop on Ray against RLlib's PPO, at equal runner counts.

Run: ``python benchmarks/scale.py [--rllib-python PATH] [--runners 0 1 2 4]
[--seconds 10] [--envs-per-runner 4] [--rlloop-backend B ...] [--rllib-vectorize M ...]
[--solve] [--json OUT]``.

``PATH`` is an interpreter that can import ``ray.rllib`` (``pip install "ray[rllib]"``,
in a virtualenv of its own where its pins clash with rlloop's); without it only rlloop is
measured. Both libraries train the same PPO: ``--envs-per-runner`` envs in each runner,
fragments of 32 steps per env, the batch of one iteration is every runner's fragment,
4 epochs of minibatches of 128, actor and critic MLPs of 64x64 tanh units. With 0 runners
the envs are stepped in the learner's own process (rlloop's in-process runner, RLlib's
local env runner).

Envs, and how each library steps a runner's envs (its vectorisation):

- ``sleep``: CartPole that sleeps 2 ms in every step (``rlloop.envs.slow``), standing in
  for a slow simulator: its step time is waiting, not CPU, so sampling can scale past the
  core count. rlloop steps a runner's envs at once in threads (``backend=gymnasium-thread``);
- ``acrobot``: Gymnasium's Acrobot-v1, a cheap CPU-bound env. rlloop steps a runner's envs
  one after another (``backend=gymnasium``): threads only add overhead to an env that
  holds the GIL.

``--rlloop-backend`` measures rlloop with other backends instead (e.g. ``gymnasium`` for
the sequential baseline on ``sleep``). RLlib is measured with each of its
``gym_env_vectorize_mode`` values in ``--rllib-vectorize`` (default both): ``sync``
(Gymnasium's ``SyncVectorEnv``, one env after another) and ``async``
(``AsyncVectorEnv``, one subprocess per env).

For each env, library and runner count, a fresh trainer is built on one local Ray
instance per library (started once, loopback only); its first iterations (actor start-up)
are left out, then iterations are timed for ``--seconds``. Reported: env steps per second
of training (sampling and update included) and the scaling efficiency, steps/s with K
runners over K times steps/s with one.

``--solve`` also times PPO to solve CartPole-v1 with 2 runners: rlloop with its CartPole
preset until its evaluation reaches 475 (and 100 fresh episodes confirm it), RLlib with
its own tuned CartPole example settings until its training return (mean of the last 100
episodes) reaches 475. Ray's start-up is left out of both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rllib_runs import end_report, parse_or_serve, run_worker, start_ray  # a script beside this one

FRAGMENT, EPOCHS, MINIBATCH, HIDDEN = 32, 4, 128, [64, 64]
#: env -> (id, sleep per step, rlloop's backend for it)
ENVS = {"sleep": ("rlloop.envs.slow:SlowCartPole-v1", 0.002, "gymnasium-thread"),
        "acrobot": ("Acrobot-v1", 0.0, "gymnasium")}
RLLIB_MODES = ("sync", "async")
SOLVE_BUDGET_S = 600.0


# ---------------------------------------------------------------- rlloop (this process)


def rlloop_throughput(env: str, runners: int, envs: int, seconds: float,
                      backend: str) -> dict[str, Any]:
    from rlloop.config.loading import build_config
    from rlloop.envs.ids import resolve_env_id
    from rlloop.runs.build import build_algorithm
    from rlloop.trainers.loop import Trainer

    env_id, sleep_s, _ = ENVS[env]
    resolve_env_id(env_id, allow_import=True)
    sets = [f"backend={backend}", "mlflow=false", "progress=false", f"num_envs={envs}",
            f"num_env_runners={runners}",
            f"ppo.rollout_steps={FRAGMENT}", f"ppo.num_epochs={EPOCHS}",
            f"ppo.minibatch_size={MINIBATCH}", f"ppo.hidden={HIDDEN}", "ppo.activation=tanh",
            "ppo.normalize_obs=false", "ppo.normalize_rewards=false"]
    if runners:
        sets.append(f"num_envs_per_runner={envs}")
    if sleep_s:
        sets.append(f"env_kwargs.sleep_s={sleep_s}")
    algorithm = build_algorithm(build_config("ppo", env_id, sets=sets))
    try:
        trainer = Trainer(algorithm)
        for _ in range(3):  # runners start (seconds), the first weights go out
            trainer.step()
        steps, t0 = trainer.state["env/steps"], time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            trainer.step()
        elapsed = time.perf_counter() - t0
        return {"env_steps": trainer.state["env/steps"] - steps, "seconds": elapsed}
    finally:
        algorithm.close()


def rlloop_solve(runners: int) -> dict[str, Any]:
    from rlloop.config.loading import build_config
    from rlloop.runs.session import Session

    config = build_config("ppo", "CartPole-v1", sets=[
        "mlflow=false", "progress=false", "save_video=false", f"num_env_runners={runners}"])
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        session = Session(config, Path(tmp) / "run")
        built = time.perf_counter()
        result = session.run()
        return {"solved": result.stopped_by == "solved", "env_steps": result.env_steps,
                "seconds": time.perf_counter() - built, "build_s": built - t0}


# ---------------------------------------------------------------- RLlib (its own interpreter)


def rllib_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs under the RLlib interpreter: throughput or time to solve, as one JSON object."""
    import gymnasium
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env

    torch.set_num_threads(1)  # as rlloop's learner (Ray gives its actors one thread each)
    runners, envs = int(spec["runners"]), int(spec["envs"])
    start_ray(runners)
    from rlloop.envs.slow import make as make_slow  # a Gymnasium env; no rlloop trainer

    register_env("sleep", lambda cfg: make_slow(sleep_s=0.002))
    register_env("acrobot", lambda cfg: gymnasium.make("Acrobot-v1"))
    config = PPOConfig().framework("torch")
    if spec["mode"] == "solve":
        # RLlib's tuned CartPole example (rllib/tuned_examples/ppo/cartpole_ppo.py).
        config = (config.environment("CartPole-v1")
                  .env_runners(num_env_runners=runners)
                  .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
                  .rl_module(model_config={"fcnet_hiddens": [32], "fcnet_activation": "linear",
                                           "vf_share_layers": True}))
    else:
        config = (config.environment(spec["env"])
                  .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs,
                               rollout_fragment_length=FRAGMENT,
                               gym_env_vectorize_mode=spec["vectorize"])
                  .training(train_batch_size_per_learner=FRAGMENT * envs * max(runners, 1),
                            minibatch_size=MINIBATCH, num_epochs=EPOCHS, lr=3e-4)
                  .rl_module(model_config={"fcnet_hiddens": HIDDEN,
                                           "fcnet_activation": "tanh"}))
    algo = config.build_algo()

    def sampled(result: dict[str, Any]) -> int:
        return int(result["env_runners"]["num_env_steps_sampled_lifetime"])

    try:
        if spec["mode"] == "solve":
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < SOLVE_BUDGET_S:
                result = algo.train()
                ret = result["env_runners"].get("episode_return_mean", 0.0)
                if ret >= 475:
                    return {"solved": True, "env_steps": sampled(result),
                            "seconds": time.perf_counter() - t0}
            return {"solved": False, "env_steps": sampled(result),
                    "seconds": time.perf_counter() - t0}
        for _ in range(3):
            result = algo.train()
        steps, t0 = sampled(result), time.perf_counter()
        while time.perf_counter() - t0 < float(spec["seconds"]):
            result = algo.train()
        return {"env_steps": sampled(result) - steps, "seconds": time.perf_counter() - t0}
    finally:
        algo.stop()
        ray.shutdown()


def run_rllib(python: str, spec: dict[str, Any]) -> dict[str, Any]:
    return run_worker(python, __file__, spec, SOLVE_BUDGET_S + 300)


# ---------------------------------------------------------------- report


def contender(row: dict[str, Any]) -> str:
    """A row's library and vectorisation, as the table names it."""
    if row["library"] == "rlloop":
        return f"rlloop {row['vectorize'].removeprefix('gymnasium-')}".replace(
            "gymnasium", "sequential")
    return f"RLlib {row['vectorize']}"


def efficiency(rows: list[dict[str, Any]]) -> None:
    """Adds ``efficiency``: steps/s with K runners over K x steps/s with one."""
    for row in rows:
        one = next((r for r in rows if contender(r) == contender(row) and r["env"] == row["env"]
                    and r["runners"] == 1), None)
        k = row["runners"]
        row["efficiency"] = row["steps_per_s"] / (k * one["steps_per_s"]) if one and k else None


def table(rows: list[dict[str, Any]]) -> str:
    """One line per env and runner count: each contender's steps/s (efficiency), then the
    first rlloop contender's steps/s over each RLlib contender's."""
    names = list(dict.fromkeys(contender(r) for r in rows))
    mine = next((n for n in names if n.startswith("rlloop")), None)
    theirs = [n for n in names if n.startswith("RLlib")]
    ratios = [f"{mine} / {n}" for n in theirs] if mine else []
    out = [f"| env | runners | {' | '.join(names + ratios)} |",
           "|" + "---|" * (2 + len(names) + len(ratios))]

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        eff = "" if r["efficiency"] is None else f" ({r['efficiency']:.0%})"
        return f"{r['steps_per_s']:,.0f}{eff}"

    for env in dict.fromkeys(r["env"] for r in rows):
        for k in sorted({r["runners"] for r in rows if r["env"] == env}):
            at = {contender(r): r for r in rows if r["env"] == env and r["runners"] == k}
            cells = [cell(at.get(n)) for n in names]
            if mine:
                cells += [f"{at[mine]['steps_per_s'] / at[n]['steps_per_s']:.2f}x"
                          if mine in at and n in at else "-" for n in theirs]
            out.append(f"| {env} | {k} | {' | '.join(cells)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rllib-python", help="interpreter that can import ray.rllib")
    p.add_argument("--runners", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--envs-per-runner", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rlloop-backend", nargs="+", metavar="BACKEND",
                   help="rlloop's env backends to measure (default: each env's own)")
    p.add_argument("--rllib-vectorize", nargs="+", default=list(RLLIB_MODES),
                   choices=RLLIB_MODES, help="RLlib's gym_env_vectorize_mode values to measure")
    p.add_argument("--solve", action="store_true", help="also time PPO to solve CartPole")
    p.add_argument("--solve-runners", type=int, default=2)
    p.add_argument("--json", help="write every measurement to this file")
    args = parse_or_serve(p, argv, rllib_worker)
    if args is None:
        return 0
    from rlloop.config.ray import RayConfig
    from rlloop.runners.ray_cluster import connect

    started = connect(RayConfig(), max(args.runners))  # one local instance for every run
    rows: list[dict[str, Any]] = []
    try:
        for env in args.envs:
            contenders = [("rlloop", b) for b in args.rlloop_backend or [ENVS[env][2]]]
            if args.rllib_python:
                contenders += [("rllib", mode) for mode in args.rllib_vectorize]
            for k in args.runners:
                for lib, how in contenders:  # alternate, so all see the same machine load
                    spec = {"mode": "throughput", "env": env, "runners": k, "vectorize": how,
                            "envs": args.envs_per_runner, "seconds": args.seconds}
                    got = (rlloop_throughput(env, k, args.envs_per_runner, args.seconds, how)
                           if lib == "rlloop" else run_rllib(args.rllib_python, spec))
                    row = {"library": lib, "vectorize": how, "env": env, "runners": k, **got,
                           "steps_per_s": got["env_steps"] / got["seconds"],
                           "load": os.getloadavg()[0]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        efficiency(rows)
        print(table(rows))
        if args.solve:
            solve = {"rlloop": rlloop_solve(args.solve_runners)}
            if args.rllib_python:
                solve["rllib"] = run_rllib(args.rllib_python, {
                    "mode": "solve", "runners": args.solve_runners, "envs": 1})
            for lib, got in solve.items():
                print(f"solve CartPole-v1, {lib}, {args.solve_runners} runners: {got} "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
            rows.append({"solve": solve, "runners": args.solve_runners})
    finally:
        if started:
            import ray

            ray.shutdown()
    end_report(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
