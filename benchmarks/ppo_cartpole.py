"""PPO on CartPole-v1: rlloop (native and Gymnasium backends) vs Stable-Baselines3.

Run: ``python benchmarks/ppo_cartpole.py [--seeds 0 1 2] [--budget 200000] [--compile]
[--sbx]``

For each contender and seed, training runs until a deterministic evaluation of
``--eval-episodes`` episodes, every ``--eval-every`` env steps, reaches 475 (the
env's reward threshold). Reported per contender (median over seeds):

- ``solve_s``: training wall time to the solving evaluation, evaluations excluded;
- ``solve_total_s``: the same with evaluation time included;
- ``solve_steps``: env steps at the solving evaluation;
- ``train_sps``: env steps per second of training (evaluations excluded).

SB3 runs twice: with its rl-zoo CartPole-v1 hyperparameters (each library's tuned
settings: the time-to-solve comparison) and with rlloop's preset values in SB3's units
(16 envs x 32 steps, 4 epochs of 256, the same lr, schedules and network: the equal-
hyperparameter throughput comparison, ``train_sps``). rl-zoo's settings take 20 gradient
steps per 256 env steps, rlloop's preset 8 per 512, so the throughput ratio against the
rl-zoo run mostly counts that difference. rlloop uses its shipped preset (``--compile``
adds it with ``ppo.compile=true``, each seed compiling afresh, as a new run would: the
compilation counts as training time). Both run with one torch thread
(for these small MLPs, more threads do not help; see DESIGN.md), in the same process, one
after another.

``--sbx`` adds SBX (Stable-Baselines in JAX, ``pip install sbx-rl``) at rl-zoo's CartPole
settings, its XLA CPU client on one thread (``jax_peer.py``); its first seed in the process
includes JAX's jit compilation, later seeds reuse the compiled functions. The whole-process
race (a fresh process per run, imports and compilation included) is
``python benchmarks/whole_process.py --rows ppo``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

THRESHOLD = 475.0


@dataclass
class Outcome:
    solved: bool
    solve_steps: int
    solve_s: float
    solve_total_s: float
    train_sps: float
    final_eval: float


def run_rlloop(seed: int, backend: str, budget: int, eval_every: int, episodes: int,
               compile: bool = False) -> Outcome:
    from rlloop.config.loading import build_config

    config = build_config("ppo", "CartPole-v1", flags={"seed": seed, "backend": backend},
                          sets=["mlflow=false", "progress=false",
                                f"ppo.compile={str(compile).lower()}"])
    if compile:
        import torch._dynamo

        torch._dynamo.reset()  # no graph of an earlier seed: this run compiles its own
    return solve_rlloop(config, budget, eval_every, episodes)


def solve_rlloop(config: Any, budget: int, eval_every: int, episodes: int) -> Outcome:
    """Train ``config``'s run until a deterministic evaluation of ``episodes`` episodes
    every ``eval_every`` env steps reaches :data:`THRESHOLD`, or ``budget`` env steps."""
    from rlloop.runs.build import build_algorithm
    from rlloop.trainers.loop import Trainer

    algo = build_algorithm(config)
    trainer = Trainer(algo, eval_episodes=episodes)
    train_s = eval_s = 0.0
    next_eval = eval_every
    score = float("-inf")
    try:
        while trainer.state["env/steps"] < budget:
            t0 = time.perf_counter()
            trainer.step()
            train_s += time.perf_counter() - t0
            if trainer.state["env/steps"] >= next_eval:
                next_eval += eval_every
                t0 = time.perf_counter()
                score = trainer.eval()["eval/return_mean"]
                eval_s += time.perf_counter() - t0
                if score >= THRESHOLD:
                    break
    finally:
        algo.close()
    steps = trainer.state["env/steps"]
    return Outcome(score >= THRESHOLD, steps, train_s, train_s + eval_s, steps / train_s, score)


def run_sb3(seed: int, budget: int, eval_every: int, episodes: int) -> Outcome:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    def linear(start: float) -> Callable[[float], float]:
        return lambda progress_remaining: progress_remaining * start

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1000)
    # rl-zoo's hyperparams/ppo.yml for CartPole-v1
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
                seed=seed, device="cpu", verbose=0)

    def evaluate() -> float:
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
        return float(mean)  # type: ignore[arg-type]  # a float unless asked for lists

    return sb3_until_solved(model, evaluate, budget, eval_every, [env, eval_env])


def run_sbx(seed: int, budget: int, eval_every: int, episodes: int) -> Outcome:
    """SBX (JAX) with rl-zoo's CartPole-v1 hyperparameters, as :func:`run_sb3`."""
    from jax_peer import sbx_model
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    model = sbx_model("ppo", "CartPole-v1", seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1000)

    def evaluate() -> float:
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
        return float(mean)  # type: ignore[arg-type]  # a float unless asked for lists

    return sb3_until_solved(model, evaluate, budget, eval_every, [model.get_env(), eval_env])


def run_sb3_preset(seed: int, budget: int, eval_every: int, episodes: int) -> Outcome:
    """SB3 with rlloop's CartPole preset in SB3's units: rlloop's vf_coef 0.5 is SB3's
    0.25 (rlloop's value loss carries a factor 1/2); the lr decays linearly to 0 over the
    budget (rlloop: over ``lr_decay_steps`` = 200k, the default budget)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    env = make_vec_env("CartPole-v1", n_envs=16, seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1000)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, vf_coef=0.25, ent_coef=0.0, max_grad_norm=0.5,
                learning_rate=lambda progress_remaining: progress_remaining * 3e-3,
                policy_kwargs={"net_arch": [64, 64], "activation_fn": torch.nn.Tanh},
                seed=seed, device="cpu", verbose=0)

    def evaluate() -> float:
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
        return float(mean)  # type: ignore[arg-type]  # a float unless asked for lists

    return sb3_until_solved(model, evaluate, budget, eval_every, [env, eval_env])


def sb3_until_solved(model: Any, evaluate: Callable[[], float], budget: int, eval_every: int,
                     envs: list[Any]) -> Outcome:
    """``model.learn`` until ``evaluate()`` (run every ``eval_every`` env steps, its time
    left out of the training time) reaches :data:`THRESHOLD`, or ``budget`` env steps."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Evaluate(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = eval_every
            self.eval_s = 0.0
            self.score = float("-inf")

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += eval_every
            t0 = time.perf_counter()
            self.score = evaluate()
            self.eval_s += time.perf_counter() - t0
            return self.score < THRESHOLD

    cb = Evaluate()
    t0 = time.perf_counter()
    model.learn(total_timesteps=budget, callback=cb)
    total = time.perf_counter() - t0
    train_s = total - cb.eval_s
    steps = model.num_timesteps
    for env in envs:
        env.close()
    return Outcome(cb.score >= THRESHOLD, steps, train_s, total, steps / train_s, cb.score)


def run_seeds(contenders: dict[str, Callable[[int], Outcome]], seeds: list[int], *,
              width: int, digits: int) -> dict[str, list[Outcome]]:
    """Each contender on each seed, one progress line per run."""
    results: dict[str, list[Outcome]] = {}
    for name, fn in contenders.items():
        results[name] = []
        for seed in seeds:
            out = fn(seed)
            results[name].append(out)
            print(f"  {name:{width}s} seed {seed}: solved={out.solved} "
                  f"steps={out.solve_steps:,} train {out.solve_s:.{digits}f}s "
                  f"(+eval {out.solve_total_s:.{digits}f}s) {out.train_sps:,.0f} steps/s "
                  f"eval={out.final_eval:.1f}", flush=True)
    return results


def median(outs: list[Outcome], field: str) -> float:
    return statistics.median(getattr(o, field) for o in outs)


def print_medians(results: dict[str, list[Outcome]], title: str, *, width: int,
                  digits: int) -> None:
    """The table of seeds solved and median figures per contender."""
    print(f"\n{title}")
    print(f"{'contender':{width}s} {'solved':>7s} {'solve_steps':>11s} {'solve_s':>8s} "
          f"{'total_s':>8s} {'train_sps':>10s}")
    for name, outs in results.items():
        solved = sum(o.solved for o in outs)
        print(f"{name:{width}s} {solved:>4d}/{len(outs):<2d} "
              f"{median(outs, 'solve_steps'):>11,.0f} {median(outs, 'solve_s'):>8.{digits}f} "
              f"{median(outs, 'solve_total_s'):>8.{digits}f} "
              f"{median(outs, 'train_sps'):>10,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=200_000)
    parser.add_argument("--eval-every", type=int, default=2560)
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--compile", action="store_true",
                        help="also run rlloop's native preset with ppo.compile=true")
    parser.add_argument("--sbx", action="store_true",
                        help="also run SBX (JAX) at rl-zoo's settings (needs sbx-rl)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.sbx:
        from jax_peer import one_jax_thread, require_sbx

        one_jax_thread()  # before jax is first imported
        require_sbx()

    contenders: dict[str, Callable[[int], Outcome]] = {
        "rlloop native": lambda s: run_rlloop(s, "native", args.budget, args.eval_every,
                                              args.eval_episodes),
        "rlloop gymnasium": lambda s: run_rlloop(s, "gymnasium", args.budget, args.eval_every,
                                                 args.eval_episodes),
        **({"rlloop compiled": lambda s: run_rlloop(s, "native", args.budget, args.eval_every,
                                                    args.eval_episodes, compile=True)}
           if args.compile else {}),
        "sb3 (rl-zoo)": lambda s: run_sb3(s, args.budget, args.eval_every, args.eval_episodes),
        "sb3 (rlloop preset)": lambda s: run_sb3_preset(s, args.budget, args.eval_every,
                                                        args.eval_episodes),
        **({"sbx (rl-zoo)": lambda s: run_sbx(s, args.budget, args.eval_every,
                                              args.eval_episodes)} if args.sbx else {}),
    }
    results = run_seeds(contenders, args.seeds, width=19, digits=2)
    print_medians(results, f"PPO CartPole-v1, median over seeds {args.seeds} (threshold "
                  f"{THRESHOLD:.0f}, {args.eval_episodes} deterministic episodes every "
                  f"{args.eval_every} steps)", width=19, digits=2)
    base, equal = "sb3 (rl-zoo)", "sb3 (rlloop preset)"

    def med(name: str, field: str) -> float:
        return median(results[name], field)

    print("\nratios vs SB3 (higher is better for rlloop): solve time against SB3's tuned "
          "rl-zoo run, training throughput against SB3 at rlloop's hyperparameters")
    for name in results:
        if name.startswith(("sb3", "sbx")):
            continue
        print(f"{name:19s} solve time {med(base, 'solve_s') / med(name, 'solve_s'):6.1f}x   "
              f"with eval {med(base, 'solve_total_s') / med(name, 'solve_total_s'):6.1f}x   "
              f"train steps/s {med(name, 'train_sps') / med(equal, 'train_sps'):6.1f}x "
              f"(vs rl-zoo's {med(name, 'train_sps') / med(base, 'train_sps'):.1f}x)")
        if "sbx (rl-zoo)" in results:
            sbx_s, sbx_total = med("sbx (rl-zoo)", "solve_s"), med("sbx (rl-zoo)", "solve_total_s")
            print(f"{'':19s} vs SBX (rl-zoo): solve time {sbx_s / med(name, 'solve_s'):6.2f}x"
                  f"   with eval {sbx_total / med(name, 'solve_total_s'):6.2f}x")


if __name__ == "__main__":
    main()
