"""Large-batch PPO throughput: rlloop vs rl8, both stepping rlloop's native CartPole.

Run: ``python benchmarks/ppo_throughput.py --rl8-python PATH [--num-envs 1024]
[--device cpu] [--iters 3] [--rounds 2] [--compile] [--cuda-graph]``
(``benchmarks/gpu.py`` is the same benchmark with GPU defaults). ``PATH`` is a Python
interpreter that can import rl8 (rl8 pins its own mlflow, psutil and torchrl, so it
usually lives in a virtualenv of its own, next to torch, numpy and gymnasium); without
it, rl8 runs in this interpreter when it can import rl8, and otherwise only rlloop is
measured.

Both libraries train the same PPO: ``--steps`` (64) env steps per env per iteration, an
actor and a critic MLP of 256x256 ReLU units each, 4 epochs over the whole batch as one
minibatch (``steps * num_envs`` samples), Adam, gamma 0.99, lambda 0.95, no reward or
observation normalisation, no tracking (rlloop's trainer without a sink; rl8's algorithm
``collect()`` + ``step()``, which is its trainer's step without MLflow). Both step the same
dynamics: rl8's side wraps rlloop's ``CartPoleVecEnv`` in rl8's ``Env`` interface.

Each measurement builds a fresh trainer (rlloop in this process, rl8 in a process of its
own), runs ``--warmup`` untimed iterations (the first counts FLOPs), then ``--iters`` timed
ones. rlloop and rl8 alternate for ``--rounds`` rounds, so both see the same machine load;
each one's fastest round, the one least slowed by other load, is reported. ``--compile``
adds a third contender, rlloop with ``ppo.compile=true`` (in a process of its own; its
warm-up iteration compiles the update); ``--cuda-graph`` (CUDA only) one more, rlloop with
``ppo.cuda_graph=true`` (rollouts replayed from a CUDA graph, captured in one more untimed
iteration). Every run uses
``--threads`` torch threads (default 1: on a shared machine, more threads than idle cores
make torch's thread pool wait on each other, and throughput collapses). Reported per
library:

- ``env/s``: env steps per second of training, collection and update included;
- ``GFLOP/it``: FLOPs of one iteration (``torch.utils.flop_counter.FlopCounterMode``);
- ``peak``: those FLOPs per second as a share of the best fp32 square matmul this device
  reaches with the same thread count, the bound on both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

SRC = Path(__file__).resolve().parents[1] / "src"
HIDDEN = [256, 256]
EPOCHS = 4
GAMMA, LAMBDA, LR = 0.99, 0.95, 3e-4


@dataclass(frozen=True)
class Measurement:
    """One library's timed iterations in one process."""

    library: str
    device: str
    num_envs: int
    env_steps: int
    seconds: float
    flops_per_iter: float
    iters: int

    @property
    def env_sps(self) -> float:
        return self.env_steps / self.seconds

    @property
    def flops_ps(self) -> float:
        return self.flops_per_iter * self.iters / self.seconds


def timed(device: str, iterate: Callable[[], Any], warmup: int,
          iters: int, count_flops: bool = True) -> tuple[float, float]:
    """Seconds that ``iters`` calls of ``iterate`` take after ``warmup`` (>= 1) untimed
    ones, and the FLOPs of one call (counted on the first, which is not timed; 0.0
    without ``count_flops``)."""
    from torch.utils.flop_counter import FlopCounterMode

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    flops = 0.0
    if count_flops:
        with FlopCounterMode(display=False) as counter:
            iterate()
        flops = float(counter.get_total_flops())
    else:
        iterate()
    for _ in range(warmup - 1):
        iterate()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        iterate()
    sync()
    return time.perf_counter() - start, flops


# ---------------------------------------------------------------- rlloop (this process)


def rlloop_side(device: str, num_envs: int, steps: int, warmup: int, iters: int,
                seed: int, compile: bool = False, cuda_graph: bool = False) -> Measurement:
    """rlloop's trainer; with ``compile`` its update runs through ``torch.compile``
    (``ppo.compile=true``; the warm-up iteration compiles it, and the FLOPs, the same
    maths, are the eager run's); with ``cuda_graph`` its rollouts replay a CUDA graph
    (``ppo.cuda_graph=true``; one more untimed iteration captures it)."""
    from rlloop.config.loading import build_config
    from rlloop.runs.build import build_algorithm
    from rlloop.trainers.loop import Trainer

    sets = ["mlflow=false", "progress=false", f"num_envs={num_envs}",
            f"ppo.rollout_steps={steps}", f"ppo.hidden={HIDDEN}", "ppo.activation=relu",
            f"ppo.num_epochs={EPOCHS}", f"ppo.minibatch_size={steps * num_envs}",
            f"ppo.lr={LR}", "ppo.lr_schedule=constant", f"ppo.gamma={GAMMA}",
            f"ppo.gae_lambda={LAMBDA}", "ppo.normalize_obs=false",
            "ppo.normalize_rewards=false", f"device={device}",
            f"ppo.compile={str(compile).lower()}", f"ppo.cuda_graph={str(cuda_graph).lower()}"]
    config = build_config("ppo", "CartPole-v1", flags={"seed": seed, "backend": "native"},
                          sets=sets)
    algo = build_algorithm(config)
    trainer = Trainer(algo)
    try:
        seconds, flops = timed(device, trainer.step, warmup + cuda_graph, iters,
                               count_flops=not compile)
    finally:
        algo.close()
        del algo, trainer
        if device.startswith("cuda"):
            torch.cuda.empty_cache()  # rl8 runs next, in another process, on the same GPU
    library = "rlloop-compiled" if compile else "rlloop-graphed" if cuda_graph else "rlloop"
    return Measurement(library, device, num_envs, iters * steps * num_envs, seconds, flops,
                       iters)


# ---------------------------------------------------------------- rl8 (its own interpreter)


def rl8_cartpole() -> type:
    """rlloop's native CartPole as an rl8 ``Env``: the same tensors, rl8's shapes.

    rl8's envs report no episode ends; the native env restarts finished episodes inside
    ``step`` (as it does for rlloop), so rl8 sees the reset observation in their place.
    """
    from rl8 import Env
    from tensordict import TensorDict
    from torchrl.data import Categorical, Unbounded

    from rlloop.envs.native.cartpole import CartPoleVecEnv

    class NativeCartPole(Env):
        def __init__(self, num_envs: int, /, horizon: int | None = None, *,
                     device: str = "cpu") -> None:
            super().__init__(num_envs, horizon, device=device)
            self.cartpole = CartPoleVecEnv(num_envs, seed=0, device=device)
            self.observation_spec = Unbounded(4, device=device)
            self.action_spec = Categorical(2, shape=torch.Size([1]), device=device)

        def reset(self, *, config: dict[str, Any] | None = None) -> torch.Tensor:
            return self.cartpole.reset()

        def step(self, action: torch.Tensor) -> TensorDict:
            result = self.cartpole.step(action.reshape(-1))
            return TensorDict({"obs": result.obs, "rewards": result.reward.unsqueeze(-1)},
                              batch_size=self.num_envs, device=self.device)

    return NativeCartPole


def rl8_side(device: str, num_envs: int, steps: int, warmup: int, iters: int,
             seed: int) -> Measurement:
    from rl8 import Algorithm, AlgorithmConfig

    from rlloop.system.devices import keep_freed_host_memory

    # The allocator settings rlloop's own side runs with (its build step makes them):
    # without them rl8 would pay the kernel's page zeroing that rlloop is spared.
    keep_freed_host_memory()
    torch.manual_seed(seed)
    config = AlgorithmConfig(
        num_envs=num_envs, horizon=steps, horizons_per_env_reset=-1,
        model_config={"hiddens": HIDDEN, "activation_fn": "relu"},
        optimizer_config={"lr": LR}, num_sgd_iters=EPOCHS, sgd_minibatch_size=None,
        gamma=GAMMA, gae_lambda=LAMBDA, normalize_rewards=False, device=device)
    algo = Algorithm(rl8_cartpole(), config)

    def iterate() -> None:
        algo.collect()
        algo.step()

    seconds, flops = timed(device, iterate, warmup, iters)
    return Measurement("rl8", device, num_envs, iters * steps * num_envs, seconds, flops,
                       iters)


SIDES = {"rlloop": rlloop_side, "rlloop-compiled": partial(rlloop_side, compile=True),
         "rlloop-graphed": partial(rlloop_side, cuda_graph=True), "rl8": rl8_side}


# ---------------------------------------------------------------- orchestration


def measure(library: str, python: str, args: argparse.Namespace, num_envs: int,
            device: str) -> Measurement | None:
    """rlloop in this process (compiled: in a fresh one, as rl8, so that no compiled
    graph outlives its round); the others each in a fresh ``python`` process (its last
    stdout line is the result; None, its error printed, where it failed)."""
    if library == "rlloop":
        return rlloop_side(device, num_envs, args.steps, args.warmup, args.iters, args.seed)
    cmd = [python, str(Path(__file__).resolve()), "--side", library, "--device", device,
           "--num-envs", str(num_envs), "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--iters", str(args.iters), "--threads", str(args.threads),
           "--seed", str(args.seed)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"{library} side failed (exit {done.returncode}):\n{done.stderr[-4000:]}",
              file=sys.stderr, flush=True)
        return None
    return Measurement(**json.loads(done.stdout.strip().splitlines()[-1]))


def rl8_interpreter(given: str | None) -> str | None:
    """The interpreter that runs rl8: ``given``, else this one when it can import rl8."""
    if given:
        return given
    try:
        import rl8  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def best_round(runs: Sequence[Measurement]) -> Measurement:
    return max(runs, key=lambda m: m.env_sps)


def report(results: dict[tuple[str, int], list[Measurement]], peak: float,
           device_name: str, threads: int) -> None:
    print(f"\ndevice: {device_name}; torch threads {threads}; matmul peak (fp32) "
          f"{peak / 1e9:,.1f} GFLOP/s; load average {os.getloadavg()[0]:.1f}")
    head = (f"{'library':15s} {'envs':>6s} {'rounds':>6s} {'env/s (best)':>14s} "
            f"{'all rounds':>24s} {'GFLOP/it':>9s} {'peak':>6s}")
    print(head)
    print("-" * len(head))
    for (library, num_envs), runs in results.items():
        best = best_round(runs)
        if not best.flops_per_iter:  # compiled: the eager run's count (the same maths)
            eager = best_round(results["rlloop", num_envs])
            best = replace(best, flops_per_iter=eager.flops_per_iter)
        rounds = " ".join(f"{m.env_sps:,.0f}" for m in runs)
        print(f"{library:15s} {num_envs:6d} {len(runs):6d} {best.env_sps:14,.0f} "
              f"{rounds:>24s} {best.flops_per_iter / 1e9:9.1f} {best.flops_ps / peak:6.1%}")
    for num_envs in dict.fromkeys(n for _, n in results):
        if ("rl8", num_envs) not in results:
            continue
        theirs = best_round(results["rl8", num_envs]).env_sps
        for library in ("rlloop", "rlloop-compiled", "rlloop-graphed"):
            if (library, num_envs) in results:
                ours = best_round(results[library, num_envs]).env_sps
                print(f"{num_envs} envs: {library} / rl8 env steps/s {ours / theirs:.2f}x")


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({os.cpu_count()} logical cores)"


def parse_args(argv: Sequence[str] | None, device: str,
               num_envs: Sequence[int], iters: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=device,
                        help=f"cpu, cuda, cuda:N or auto (CUDA when present); default {device}")
    parser.add_argument("--num-envs", type=int, nargs="+", default=list(num_envs),
                        help="env counts to measure, each in turn")
    parser.add_argument("--steps", type=int, default=64, help="env steps per env per iteration")
    parser.add_argument("--iters", type=int, default=iters, help="timed iterations per run")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed iterations first (at least 1: it counts the FLOPs)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each library, alternating; the fastest is reported")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every run and of the peak measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-seconds", type=float, default=1.0,
                        help="time spent measuring the matmul peak")
    parser.add_argument("--rl8-python", default=None,
                        help="interpreter that can import rl8 (default: this one, if it can)")
    parser.add_argument("--compile", action="store_true",
                        help="also measure rlloop with ppo.compile=true (a third contender)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also measure rlloop with ppo.cuda_graph=true (CUDA only)")
    parser.add_argument("--side", choices=sorted(SIDES), default=None,
                        help="measure one library in this process and print it as JSON")
    args = parser.parse_args(argv)
    for name in ("steps", "iters", "warmup", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.num_envs) < 1:
        parser.error(f"--num-envs must all be >= 1, got {args.num_envs}")
    return args


def main(argv: Sequence[str] | None = None, *, device: str = "cpu",
         num_envs: Sequence[int] = (1024,), iters: int = 3) -> None:
    args = parse_args(argv, device, num_envs, iters)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.side is not None:
        side = SIDES[args.side](device, args.num_envs[0], args.steps, args.warmup,
                                args.iters, args.seed)
        print(json.dumps(asdict(side)))
        return
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"--device {device}: no CUDA device is visible; use --device cpu")
    if args.cuda_graph and not device.startswith("cuda"):
        sys.exit(f"--cuda-graph needs a CUDA device, got --device {device}")
    rl8_python = rl8_interpreter(args.rl8_python)
    if rl8_python is None:
        print("rl8 is not importable here and --rl8-python was not given: "
              "measuring rlloop only")
    contenders = {"rlloop": sys.executable,
                  **({"rlloop-compiled": sys.executable} if args.compile else {}),
                  **({"rlloop-graphed": sys.executable} if args.cuda_graph else {}),
                  **({"rl8": rl8_python} if rl8_python else {})}
    results: dict[tuple[str, int], list[Measurement]] = {}
    failed: set[str] = set()  # a contender that failed once is not run again
    for n in args.num_envs:
        for round_ in range(args.rounds):
            for library, python in contenders.items():
                m = None if library in failed else measure(library, python, args, n, device)
                if m is None:
                    failed.add(library)
                    continue
                results.setdefault((library, n), []).append(m)
                print(f"round {round_}: {library:6s} {n} envs x {args.steps} steps: "
                      f"{m.env_sps:,.0f} env steps/s ({m.seconds:.1f} s)", flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from offpolicy import matmul_peak_flops

    peak = matmul_peak_flops(args.peak_seconds, device,
                             (1024, 2048, 4096) if device.startswith("cuda") else (256, 512, 1024))
    report(results, peak, device_name(device), args.threads)
    if failed:
        sys.exit(f"failed: {', '.join(sorted(failed))} (errors above)")


if __name__ == "__main__":
    main()
