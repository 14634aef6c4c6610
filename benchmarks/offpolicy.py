"""Off-policy training throughput: rlloop vs Stable-Baselines3, in one process, one run.

Run: ``python benchmarks/offpolicy.py [--quick] [--dqn-steps N] [--sac-steps N]
[--tasks dqn sac] [--paths default autograd compiled manual] [--seeds 0 1 2] [--jobs N]
[--threads N]``, or ``python benchmarks/offpolicy.py --whole-process [...]``
(several seeds add a summary of means and
of how rlloop's returns compare with SB3's; ``--jobs`` trains that many seeds at once, one
process each, for machines with more cores than the two this project's is measured on).

Two tasks, each trained by both libraries for the same number of env steps with rl-zoo's
hyperparameters (``hyperparams/dqn.yml`` CartPole-v1, ``hyperparams/sac.yml`` Pendulum-v1;
rlloop's shipped presets are the same values):

- DQN on CartPole-v1: lr 2.3e-3, batch 64, buffer 100k, 1000 warm-up steps, train_freq
  256 with 128 gradient steps, target synced every 128 updates (SB3: every 10 env steps,
  which is the same thing at this train_freq), epsilon 1 -> 0.04 over 16% of the budget,
  [256, 256] ReLU Q-network. SB3 steps Gymnasium's CartPole. rlloop runs on its native
  batched CartPole with 1 env (rl-zoo's setup) and with 4 envs (its preset; every
  setting counts transitions, so the update-to-data ratio is the same), and on
  Gymnasium's CartPole with 1 env ("gym": the very env SB3 steps).
- SAC on Pendulum-v1: lr 1e-3 for actor, critics and alpha, batch 256, 100 warm-up
  steps, one gradient step per env step, [256, 256] networks, tau 0.005, 1 env. Both
  step Gymnasium's Pendulum.

rlloop's gradient paths run side by side on one env (``--paths``): ``default`` (no
setting: eager, ``Adam(fused=True)``; DQN's gradient from its hand-derived backward pass
on a CPU, ``dqn.manual_backward=auto``, SAC's from autograd), ``autograd`` (the same with
autograd's gradient for DQN too, ``dqn.manual_backward=false``), ``compiled`` (the same update,
gradient, clipping and Adam included, through ``torch.compile`` as one graph,
``<algo>.compile=true``; its first updates include the compilation) and, for DQN,
``manual`` (the hand-derived backward pass asked for, ``dqn.manual_backward=true``). The
Gymnasium-env run takes the default path, the 4-env run the default path and, with
``compiled`` among ``--paths``, the compiled one. Runs on the default path carry no
suffix in the tables.

Budgets (defaults): 40k env steps for DQN and 5k for SAC, which keeps the whole run near
ten minutes on two cores; rl-zoo trains 50k and 20k (``--dqn-steps``, ``--sac-steps``).
Neither evaluates while training. The runs alternate every few thousand (DQN) or hundred
(SAC) env steps inside one process, so all of them see the same machine load; each one's
clock runs only during its own training. Reported per run:

- ``env/s``: env steps per second of training; ``warm s``: the longest single trainer
  step (for ``compiled``, the one that compiled the update); ``env/s*``: env steps per
  second without that step (the steady state);
- ``upd/s``: gradient updates per second over the same time; ``opt/s``: rlloop's border
  optimisation steps per second (one optimisation step = ``gradient_steps`` updates);
- ``return``: mean return of the trained policy on 20 deterministic Gymnasium episodes
  (the same eval code and seeds for every run; ``--eval-episodes`` takes fewer, only to
  smoke-test the script);
- ``late``: the mean of that evaluation at 80%, 90% and 100% of the budget (same env
  step for every run; at the 80% and 90% marks SB3 is evaluated before the updates of
  the rollout that reaches the mark, which rlloop has made: one rollout's updates apart,
  not a bias of either sign). DQN's greedy policy on CartPole swings between 500 and much less
  from one optimisation step to the next, in both libraries, so the final return alone
  is mostly seed luck; ``late`` averages over the end of the learning curve;
- ``share``: FLOPs of one gradient update (counted with
  ``torch.utils.flop_counter.FlopCounterMode``) times updates per second, divided by the
  matmul FLOP/s this CPU reaches on the run's threads (the best of square fp32 matmuls): the
  share of the machine's compute bound that training reaches.

Everything runs with one torch thread (``--threads N``: N for both libraries; CPU time
then counts every thread). The machine may be shared: the load average is
printed with the results, and ``--clock cpu`` times training by this process's CPU time
instead of the wall clock.

SBX (Stable-Baselines in JAX) races in fresh processes, not in this one:
``--whole-process`` hands the rest of the command line to ``whole_process.py`` (rlloop's
default path against SBX, one process per run, alternating, whole-process time and steady
env steps/s; DQN CartPole-v1 40k, SAC and TD3 Pendulum-v1 3k and 20k, PPO CartPole-v1 to
475).

Returns at these budgets vary far more between seeds than between the libraries (DQN's
final return on CartPole ranges from under 100 to 500 in both), so the summary states
the comparison as a 95% confidence interval of the difference of mean returns
(rlloop - SB3, Welch's normal approximation over seeds; seeds are independent draws, not
pairs, since no two contenders share a random stream): ``better`` when the interval lies
above zero, ``worse`` when below, otherwise ``equal`` (no difference this many seeds can
detect, the interval's width saying how large one could hide).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from rlloop.system.numerics import flushed_denormals

EVAL_EPISODES = 20
EVAL_SEED = 10_000
#: The training clocks: wall time, or this process's CPU time (``--clock cpu``, for a
#: shared machine, where other jobs' load would otherwise fall on whoever runs then).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]
#: SB3 trains under flush-to-zero (``--sb3-flush``).
SB3_FLUSH = True


@dataclass
class Result:
    library: str
    task: str
    env_steps: int
    seconds: float
    updates: int
    opt_steps: int
    eval_return: float
    flops_per_update: float
    load: tuple[float, float]
    seed: int = 0
    late_returns: tuple[float, ...] = ()
    warm_seconds: float = 0.0

    @property
    def late_return(self) -> float:
        """Mean of the evaluations near the end of the budget, the final one included."""
        returns = [*self.late_returns, self.eval_return]
        return sum(returns) / len(returns)

    @property
    def env_sps(self) -> float:
        return self.env_steps / self.seconds

    @property
    def steady_sps(self) -> float:
        return self.env_steps / (self.seconds - self.warm_seconds)

    @property
    def updates_ps(self) -> float:
        return self.updates / self.seconds


def load_average() -> float:
    return os.getloadavg()[0]


def matmul_peak_flops(seconds: float = 1.0, device: str = "cpu",
                      sizes: Sequence[int] = (256, 512, 1024)) -> float:
    """Best fp32 matmul FLOP/s over square ``sizes`` on ``device``, with torch's current
    thread count (this benchmark sets it: one unless ``--threads``)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        for _ in range(3):
            a @ b
        sync()
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / len(sizes):
            a @ b
            reps += 1
        sync()  # a GPU queues matmuls: the clock stops when they are done
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
    return best


def count_flops(fn: Callable[[], Any]) -> float:
    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def evaluate_gym(env_id: str, act: Callable[[np.ndarray], Any],
                 episodes: int | None = None) -> float:
    """Mean return of ``act`` on ``episodes`` (default ``EVAL_EPISODES``) Gymnasium
    episodes seeded from ``EVAL_SEED``."""
    episodes = EVAL_EPISODES if episodes is None else episodes
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + episode)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


# ---------------------------------------------------------------- both, interleaved


class RlloopRun:
    """rlloop's trainer, advanced in chunks; ``seconds`` counts only its own training."""

    def __init__(self, algo: str, env_id: str, steps: int, seed: int, num_envs: int,
                 backend: str = "auto", path: str = "default") -> None:
        from rlloop.config.loading import build_config
        from rlloop.runs.build import build_algorithm
        from rlloop.trainers.loop import Trainer
        from rlloop.trainers.offpolicy_schedule import OffPolicyAlgorithm, OffPolicySchedule

        never = 10**12
        sets = ["mlflow=false", "progress=false", f"num_envs={num_envs}", f"backend={backend}",
                f"{algo}.eval_interval={never}", f"{algo}.record_interval={never}",
                f"{algo}.save_interval=0"]
        if algo == "dqn":  # SB3's exploration_fraction is relative to the budget
            sets.append(f"dqn.exploration_steps={int(0.16 * steps)}")
        sets += PATHS[path](algo)
        self.config = build_config(algo, env_id, flags={"seed": seed, "total_env_steps": steps},
                                   sets=sets)
        self.algo, self.env_id, self.num_envs, self.seed = algo, env_id, num_envs, seed
        self.label = (f"rlloop {num_envs} env{'s' if num_envs > 1 else ''}"
                      + (" gym" if backend == "gymnasium" and algo == "dqn" else "")
                      + (f" {path}" if PATHS[path](algo) else ""))
        self.algorithm: Any = build_algorithm(self.config)
        self.trainer = Trainer(self.algorithm, schedule=OffPolicySchedule(
            cast(OffPolicyAlgorithm, self.algorithm)))
        self.seconds = 0.0
        self.warm_seconds = 0.0  # the longest trainer step
        self.late_returns: list[float] = []

    def advance(self, env_steps: int) -> None:
        start = clock()
        while self.trainer.state["env/steps"] < env_steps:
            t0 = clock()
            self.trainer.step()
            self.warm_seconds = max(self.warm_seconds, clock() - t0)
        self.seconds += clock() - start

    def act(self, obs: np.ndarray) -> Any:
        action = self.algorithm.act(torch.as_tensor(obs, dtype=torch.float32)[None])[0]
        return int(action) if self.algo == "dqn" else action.numpy()

    def evaluate_late(self) -> None:
        self.late_returns.append(evaluate_gym(self.env_id, self.act))

    def result(self, load: tuple[float, float]) -> Result:
        algorithm = self.algorithm
        batch = algorithm.loop.replay.sample(
            self.config.hparams.batch_size, torch.Generator().manual_seed(0)).for_update()
        final = evaluate_gym(self.env_id, self.act)  # before the FLOP count's extra update
        hparams = algorithm.learner.config
        compiled, hparams.compile = hparams.compile, False  # count the same maths, eager
        flops = count_flops(lambda: algorithm.learner.update(batch))
        hparams.compile = compiled
        result = Result(self.label,
                        f"{self.algo} {self.env_id}", self.trainer.state["env/steps"],
                        self.seconds, algorithm.learner.updates,
                        self.trainer.state["algorithm/steps"], final, flops, load, self.seed,
                        tuple(self.late_returns), self.warm_seconds)
        algorithm.close()
        return result


def sb3_model(algo: str, env_id: str, seed: int) -> Any:
    from stable_baselines3 import DQN, SAC

    env = gym.make(env_id)
    if algo == "dqn":
        return DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                   learning_starts=1000, gamma=0.99, target_update_interval=10,
                   train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                   exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
                   seed=seed, device="cpu")
    return SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu")


def train_all(algo: str, env_id: str, steps: int, seed: int, chunk: int,
              rlloop_runs: Sequence[tuple[int, str, str]]) -> list[Result]:
    """Train SB3 and rlloop (once per ``(num_envs, backend, path)`` of ``rlloop_runs``)
    on the same budget, alternating every ``chunk`` env steps so that all see the same
    machine load; each one's time counts only its own work."""
    from stable_baselines3.common.callbacks import BaseCallback

    ours = [RlloopRun(algo, env_id, steps, seed, n, backend, path)
            for n, backend, path in rlloop_runs]
    model = sb3_model(algo, env_id, seed)
    late_marks = [-(-int(f * steps) // chunk) * chunk for f in (0.8, 0.9)]  # chunk multiples
    sb3_late: list[float] = []
    paused = [0.0]  # seconds spent evaluating, off SB3's clock

    def sb3_act(obs: np.ndarray) -> Any:
        action, _ = model.predict(obs, deterministic=True)
        return int(action) if algo == "dqn" else action

    class Alternate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % chunk == 0:
                for run in ours:
                    run.advance(self.num_timesteps)
                if self.num_timesteps in late_marks:
                    t0 = clock()
                    sb3_late.append(evaluate_gym(env_id, sb3_act))
                    for run in ours:
                        run.evaluate_late()
                    paused[0] += clock() - t0
            return True

    load0 = load_average()
    start = clock()
    # rlloop's trainer flushes subnormal floats to zero around its own steps (its default
    # flush_denormal): SB3 trains under the same mode, or its Adam moments' subnormals
    # would cost it a few percent that rlloop is spared.
    with flushed_denormals(SB3_FLUSH):
        model.learn(total_timesteps=steps, callback=Alternate())
    sb3_seconds = (clock() - start - sum(run.seconds for run in ours)
                   - paused[0])
    for run in ours:
        run.advance(steps)
    load = (load0, load_average())
    updates = int(model._n_updates)
    final = evaluate_gym(env_id, sb3_act)
    flops = count_flops(lambda: model.train(gradient_steps=1, batch_size=model.batch_size))
    theirs = Result("sb3 1 env", f"{algo} {env_id}", int(model.num_timesteps), sb3_seconds,
                    updates, updates, final, flops, load, seed, tuple(sb3_late))
    return [*(run.result(load) for run in ours), theirs]


# ---------------------------------------------------------------- report


def report(results: list[Result], peak: float) -> None:
    print(f"\nmatmul peak ({torch.get_num_threads()} thread(s), fp32): "
          f"{peak / 1e9:.1f} GFLOP/s")
    head = (f"{'task':20s} {'seed':>4s} {'library':24s} {'env steps':>9s} {'train s':>8s} "
            f"{'env/s':>8s} {'warm s':>6s} {'env/s*':>8s} {'upd/s':>8s} {'opt/s':>8s} "
            f"{'return':>8s} {'late':>7s} {'MFLOP/upd':>9s} {'share':>6s} {'load':>9s}")
    print(head)
    print("-" * len(head))
    for r in results:
        share = r.flops_per_update * r.updates_ps / peak
        print(f"{r.task:20s} {r.seed:4d} {r.library:24s} {r.env_steps:9d} {r.seconds:8.1f} "
              f"{r.env_sps:8.1f} {r.warm_seconds:6.1f} {r.steady_sps:8.1f} "
              f"{r.updates_ps:8.1f} {r.opt_steps / r.seconds:8.2f} "
              f"{r.eval_return:8.1f} {r.late_return:7.1f} {r.flops_per_update / 1e6:9.1f} "
              f"{share:6.1%} "
              f"{r.load[0]:4.1f}/{r.load[1]:4.1f}")
    print()
    for task, seed in dict.fromkeys((r.task, r.seed) for r in results):
        runs = [r for r in results if r.task == task and r.seed == seed]
        theirs = next(r for r in runs if r.library.startswith("sb3"))
        for mine in (r for r in runs if r.library.startswith("rlloop")):
            print(f"{task} seed {seed}: {mine.library} / SB3 env steps/s "
                  f"{mine.env_sps / theirs.env_sps:.2f}x (steady "
                  f"{mine.steady_sps / theirs.steady_sps:.2f}x), updates/s "
                  f"{mine.updates_ps / theirs.updates_ps:.2f}x, return "
                  f"{mine.eval_return:.1f} vs {theirs.eval_return:.1f}, late "
                  f"{mine.late_return:.1f} vs {theirs.late_return:.1f}")


#: ``(num_envs, backend, gradient path)`` of every rlloop run, per task.
TASKS = {"dqn": ("CartPole-v1", 1024, ((1, "native", "default"), (1, "native", "compiled"),
                                       (1, "native", "autograd"), (4, "native", "default"),
                                       (4, "native", "compiled"),
                                       (1, "gymnasium", "default"))),
         "sac": ("Pendulum-v1", 100, ((1, "auto", "default"), (1, "auto", "compiled")))}
#: The settings of each gradient path.
PATHS: dict[str, Callable[[str], list[str]]] = {
    "default": lambda algo: [],
    "autograd": lambda algo: ["dqn.manual_backward=false"] if algo == "dqn" else [],
    "compiled": lambda algo: [f"{algo}.compile=true"],
    "manual": lambda algo: ["dqn.manual_backward=true"],
}


def train_seed(algo: str, steps: int, seed: int, paths: Sequence[str] = tuple(PATHS),
               clock_name: str = "wall", threads: int = 1,
               sb3_flush: bool = True, eval_episodes: int = EVAL_EPISODES) -> list[Result]:
    """Every contender of ``algo`` on one seed with ``threads`` torch threads (a worker's
    entry point); rlloop's runs on the gradient ``paths`` only, timed by ``clock_name``;
    SB3 flushing subnormal floats as rlloop does (``sb3_flush``) or at its own default;
    returns over ``eval_episodes`` episodes."""
    global clock, SB3_FLUSH, EVAL_EPISODES
    clock, SB3_FLUSH, EVAL_EPISODES = CLOCKS[clock_name], sb3_flush, eval_episodes
    torch.set_num_threads(threads)
    env_id, chunk, runs = TASKS[algo]
    return train_all(algo, env_id, steps, seed, chunk, [r for r in runs if r[2] in paths])


def train_seeds(jobs: Sequence[tuple[str, int, int, Sequence[str], str, int, bool, int]],
                workers: int) -> list[Result]:
    """``train_seed`` for each ``(algo, steps, seed)``, ``workers`` processes at a time
    (in this process when 1); results in job order."""
    if workers <= 1:
        return [r for job in jobs for r in report_seed(train_seed(*job))]
    context = multiprocessing.get_context("spawn")  # no fork of a process torch has threaded
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(train_seed, *job) for job in jobs]
        return [r for future in futures for r in report_seed(future.result())]


def report_seed(results: list[Result]) -> list[Result]:
    for result in results:
        print(f"seed {result.seed}: {result.library} {result.task}: {result.env_steps} env "
              f"steps in {result.seconds:.1f} s, return {result.eval_return:.1f}", flush=True)
    return results


def main() -> None:
    import sys

    if "--whole-process" in sys.argv:
        import whole_process

        sys.argv.remove("--whole-process")
        whole_process.main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--dqn-steps", type=int, default=None)
    parser.add_argument("--sac-steps", type=int, default=None)
    parser.add_argument("--tasks", nargs="+", choices=["dqn", "sac"], default=["dqn", "sac"])
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS),
                        help="rlloop's gradient paths to run (default: all)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="time training by wall clock (default) or by this process's "
                             "CPU time (steadier on a machine other jobs load)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="one run of every task per seed; the summary averages them")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds trained at once, one process each (default 1: in turn, "
                             "as the README's figures on two cores)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, the same for both libraries (default 1)")
    parser.add_argument("--sb3-flush", choices=("on", "off"), default="on",
                        help="SB3 trains flushing subnormal floats to zero, as rlloop's "
                             "trainer does by default (on, the like-for-like default), or "
                             "at torch's default (off: each library's own defaults)")
    parser.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES,
                        help=f"Gymnasium episodes per return evaluation (default "
                             f"{EVAL_EPISODES}; fewer only for a smoke test: the returns "
                             f"then compare nothing)")
    args = parser.parse_args()
    if args.jobs < 1 or args.threads < 1 or args.eval_episodes < 1:
        parser.error(f"--jobs, --threads and --eval-episodes must be >= 1, got {args.jobs}, "
                     f"{args.threads}, {args.eval_episodes}")
    torch.set_num_threads(args.threads)
    steps = {"dqn": args.dqn_steps or (6_000 if args.quick else 40_000),
             "sac": args.sac_steps or (600 if args.quick else 5_000)}
    peak = matmul_peak_flops()
    print(f"clock: {args.clock}, torch threads: {args.threads}")
    print(f"SB3 flushes subnormal floats: {args.sb3_flush == 'on'} (rlloop does by default)")
    jobs = [(algo, steps[algo], seed, tuple(args.paths), args.clock, args.threads,
             args.sb3_flush == "on", args.eval_episodes)
            for seed in args.seeds for algo in args.tasks]
    results = train_seeds(jobs, args.jobs)
    report(results, peak)
    if len(args.seeds) > 1:
        summary(results)


def summary(results: list[Result]) -> None:
    """Means over seeds: total env steps / total training time, and mean return."""
    print(f"\n{'task':20s} {'library':24s} {'env/s':>8s} {'ratio':>6s} {'mean return':>12s} "
          f"{'mean late':>10s} {'seeds':>5s}")
    for task in dict.fromkeys(r.task for r in results):
        runs: dict[str, list[Result]] = {}
        for r in results:
            if r.task == task:
                runs.setdefault(r.library, []).append(r)
        sb3 = runs.pop("sb3 1 env")
        base = sum(r.env_steps for r in sb3) / sum(r.seconds for r in sb3)
        for library, group in [*runs.items(), ("sb3 1 env", sb3)]:
            sps = sum(r.env_steps for r in group) / sum(r.seconds for r in group)
            mean = sum(r.eval_return for r in group) / len(group)
            late = sum(r.late_return for r in group) / len(group)
            print(f"{task:20s} {library:24s} {sps:8.1f} {sps / base:5.2f}x {mean:12.1f} "
                  f"{late:10.1f} {len(group):5d}")
        for library, group in runs.items():
            for name, value in (("final", "eval_return"), ("late", "late_return")):
                ours = [getattr(r, value) for r in group]
                theirs = [getattr(r, value) for r in sb3]
                print(f"{task:20s} {library:24s} {name:5s} return vs SB3: "
                      f"{compare_returns(ours, theirs)}")


@dataclass(frozen=True)
class ReturnComparison:
    """rlloop's mean return minus SB3's, with a 95% confidence interval."""

    difference: float
    low: float
    high: float
    seeds: tuple[int, int]

    @property
    def verdict(self) -> str:
        return "better" if self.low > 0 else "worse" if self.high < 0 else "equal"

    def __str__(self) -> str:
        return (f"{self.difference:+.1f} (95% CI {self.low:+.1f} to {self.high:+.1f}, "
                f"{self.seeds[0]} vs {self.seeds[1]} seeds): {self.verdict}")


def compare_returns(ours: Sequence[float], theirs: Sequence[float]) -> ReturnComparison:
    """Difference of mean returns over independent seeds, Welch's standard error and a
    normal 95% interval (``1.96`` standard errors; each side needs two seeds or more)."""
    if len(ours) < 2 or len(theirs) < 2:
        raise ValueError("comparing returns needs at least two seeds on each side")
    difference = statistics.fmean(ours) - statistics.fmean(theirs)
    error = math.sqrt(statistics.variance(ours) / len(ours)
                      + statistics.variance(theirs) / len(theirs))
    return ReturnComparison(difference, difference - 1.96 * error, difference + 1.96 * error,
                            (len(ours), len(theirs)))


if __name__ == "__main__":
    main()
