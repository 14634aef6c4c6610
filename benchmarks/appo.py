"""APPO against synchronous PPO when one env runner is slow: env steps/s to the same return.

Run: ``python benchmarks/appo.py [--runners 2] [--envs-per-runner 4] [--sleep 0.002]
[--slower-by 10] [--target 150] [--budget-s 300] [--rllib] [--json OUT]``.

The env is ``benchmarks/scale.py``'s ``sleep`` env (``rlloop.envs.slow``: CartPole that
sleeps in every step, stepped in threads within a runner), with runner 0's envs sleeping
``--slower-by`` times as long: its episodes take that much longer. Contenders, built one
after the other on the same machine, with the same network, fragments of 32 steps per env
and a batch of one fragment per runner, 4 epochs of minibatches of 128, lr 3e-4:

- **PPO, synchronous**: rlloop's PPO on Ray env runners with ``max_weight_lag=0``: every
  iteration waits for every runner's fragment, the slow one's too.
- **APPO**: rlloop's APPO on runner processes (its defaults: a queue of 2, lag up to 8).
- **RLlib APPO** (``--rllib``, where ``ray.rllib`` imports in this interpreter): RLlib's
  own APPO with the same runners, envs and slow runner (its env runner 1).

Each trains until its training return (mean of the last 100 episodes) reaches
``--target`` or ``--budget-s`` pass; reported are the env steps, seconds (start-up left
out), env steps/s and whether the target was reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rllib_runs import end_report, parse_or_serve, run_worker, start_ray  # a script beside this one

ENV_ID = "rlloop.envs.slow:SlowCartPole-v1"
FRAGMENT, EPOCHS, MINIBATCH, HIDDEN = 32, 4, 128, [64, 64]


def rlloop_run(algo: str, args: argparse.Namespace) -> dict[str, Any]:
    from rlloop.config.loading import build_config
    from rlloop.envs.ids import resolve_env_id
    from rlloop.runs.build import build_algorithm
    from rlloop.system.seeding import derive_seed
    from rlloop.trainers.loop import Trainer

    resolve_env_id(ENV_ID, allow_import=True)
    m = args.envs_per_runner
    first = derive_seed(0, "env-runner-0") % 2**32  # runner 0's envs are seeded from it
    sets = ["seed=0", "mlflow=false", "progress=false", "backend=gymnasium-thread",
            f"num_env_runners={args.runners}", f"num_envs_per_runner={m}",
            f"env_kwargs.sleep_s={args.sleep}", f"env_kwargs.slower_by={args.slower_by}",
            f"env_kwargs.slow_seeds=[{first}, {first + m}]",
            f"{algo}.rollout_steps={FRAGMENT}", f"{algo}.num_epochs={EPOCHS}",
            f"{algo}.minibatch_size={MINIBATCH}", f"{algo}.hidden={HIDDEN}", f"{algo}.lr=3e-4"]
    sets += (["max_weight_lag=0"] if algo == "ppo"
             else [f"appo.fragments_per_batch={args.runners}"])
    t0 = time.perf_counter()
    algorithm = build_algorithm(build_config(algo, ENV_ID, sets=sets))
    try:
        trainer = Trainer(algorithm)
        trainer.step()  # the runners' first fragments: start-up, left out
        start_s, steps0 = time.perf_counter(), trainer.state["env/steps"]
        ret = 0.0
        while time.perf_counter() - start_s < args.budget_s and ret < args.target:
            ret = trainer.step().get("episode/return_mean", ret)
        seconds = time.perf_counter() - start_s
        steps = trainer.state["env/steps"] - steps0
        return {"env_steps": steps, "seconds": seconds, "return": ret,
                "reached": ret >= args.target, "startup_s": start_s - t0}
    finally:
        algorithm.close()


def rllib_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """RLlib's APPO on the same slow env (its env runner 1 slow), as one JSON object."""
    import ray
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.tune.registry import register_env

    runners, m = int(spec["runners"]), int(spec["envs"])
    start_ray(runners + 1)
    from rlloop.envs.slow import make as make_slow

    register_env("sleep_lag", lambda cfg: make_slow(sleep_s=spec["sleep"] * (
        spec["slower_by"] if cfg.worker_index == 1 else 1.0)))
    config = (APPOConfig().framework("torch").environment("sleep_lag")
              .env_runners(num_env_runners=runners, num_envs_per_env_runner=m,
                           rollout_fragment_length=FRAGMENT, gym_env_vectorize_mode="sync")
              .training(train_batch_size_per_learner=FRAGMENT * m * runners,
                        minibatch_size=MINIBATCH, num_epochs=EPOCHS, lr=3e-4)
              .rl_module(model_config={"fcnet_hiddens": HIDDEN, "fcnet_activation": "tanh"}))
    algo = config.build_algo()

    def sampled(result: dict[str, Any]) -> int:  # absent until the first fragments arrive
        return int(result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", 0))

    try:
        result = algo.train()
        while not sampled(result):  # start-up: the runners' first fragments, left out
            result = algo.train()
        start, steps0 = time.perf_counter(), sampled(result)
        ret = 0.0
        while time.perf_counter() - start < spec["budget_s"] and ret < spec["target"]:
            result = algo.train()
            ret = float(result.get("env_runners", {}).get("episode_return_mean", ret) or ret)
        steps = sampled(result) - steps0
        return {"env_steps": steps, "seconds": time.perf_counter() - start, "return": ret,
                "reached": ret >= spec["target"]}
    finally:
        algo.stop()
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runners", type=int, default=2)
    p.add_argument("--envs-per-runner", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.002)
    p.add_argument("--slower-by", type=float, default=10.0)
    p.add_argument("--target", type=float, default=150.0)
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--rllib", action="store_true", help="also RLlib's APPO")
    p.add_argument("--only", nargs="+", choices=["ppo", "appo"], default=["ppo", "appo"])
    p.add_argument("--json", help="write the rows to this file")
    args = parse_or_serve(p, argv, rllib_worker)
    if args is None:
        return 0
    rows = []
    for name in args.only:
        got = rlloop_run(name, args)
        rows.append({"contender": f"rlloop {name}", **got})
        print(json.dumps(rows[-1]), flush=True)
    if args.rllib:
        spec = {"runners": args.runners, "envs": args.envs_per_runner, "sleep": args.sleep,
                "slower_by": args.slower_by, "target": args.target, "budget_s": args.budget_s}
        try:
            got = run_worker(sys.executable, __file__, spec, args.budget_s + 300)
        except RuntimeError as e:
            got = {"error": str(e)}
        rows.append({"contender": "RLlib appo", **got})
        print(json.dumps(rows[-1]), flush=True)
    print("| contender | env steps | seconds | env steps/s | return | reached |\n|---|---|---|"
          "---|---|---|")
    for r in rows:
        if "env_steps" in r:
            print(f"| {r['contender']} | {r['env_steps']:,.0f} | {r['seconds']:.1f} | "
                  f"{r['env_steps'] / r['seconds']:,.0f} | {r['return']:.1f} | {r['reached']} |")
    end_report(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
