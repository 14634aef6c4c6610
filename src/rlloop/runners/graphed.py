"""``ppo.cuda_graph``: a rollout's collection captured once as a CUDA graph, then replayed.

On a GPU, collecting from a native env is bound by the host, not the device: every env
step launches a few dozen small kernels (the policy's layers, sampling, the env's
physics, the buffer and episode-log writes), and launching them takes longer than running
them (at 4,096 envs an H100 runs a step's kernels in about a tenth of the time the host
needs to launch them). A CUDA graph records the kernels of a whole rollout once and
launches them all with one call per iteration.

A replay does what an eager collect would, because:

- every tensor the rollout reads or writes keeps its address: the rollout buffer, the
  env's state (stepped in place: envs declare it with ``graph_safe = True``), the
  episode log, the parameters (Adam steps them in place) and the runner's observation,
  which the graph copies back into the tensor it read at its start;
- its random numbers come from generators registered with the graph (the algorithm's and
  the env's), whose offsets each replay advances by the graph's total, as the eager calls
  would have advanced them, so a graphed run draws the same numbers as an eager one;
- the Python-side bookkeeping of a collect is the same on every iteration: the episode
  log starts empty (it is folded at the end of the captured rollout).

The first collect runs eagerly on a side stream (it warms up cuBLAS and the caching
allocator, as capture needs), the second is captured and then replayed, later ones
replay. Anything that would read a value on the host inside the rollout fails the
capture with CUDA's own error instead of producing a wrong graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlloop.data.rollout import RolloutBuffer
from rlloop.runners.env_runner import EnvRunner, PolicyFn


class GraphedCollect:
    """``runner.collect(policy, buf)`` as a CUDA graph, for the same ``policy`` and ``buf``
    on every call.

    Args:
        runner: The runner whose env is graph safe (stepped by in-place device ops; it
            names the generators it draws from as ``env.generators``).
        generators: The other CUDA generators the rollout draws from besides torch's
            default one (the algorithm's).

    A new env (``env_config`` changed at a horizon) is warmed up and captured afresh.
    """

    def __init__(self, runner: EnvRunner, generators: Sequence[torch.Generator]) -> None:
        self.runner = runner
        self.generators = list(generators)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.obs: torch.Tensor | None = None  # the observation tensor the graph reads
        self._env: object = None  # the env the graph (or the warm-up) stepped

    def collect(self, policy: PolicyFn, buf: RolloutBuffer) -> int:
        runner = self.runner
        if runner.env is not self._env:  # the first collect, or an env made anew
            self._env, self.graph, self.obs = runner.env, None, None
            return self._warm_up(policy, buf)
        if self.graph is None or self.obs is None:
            self.graph, self.obs = self._capture(policy, buf)
        elif runner.obs is not self.obs:  # reset or restored since the last collect
            self.obs.copy_(runner.obs)
            runner.obs = self.obs
        runner.episodes.fold()  # the captured rollout starts with an empty log
        self.graph.replay()
        return buf.steps * buf.num_envs

    def _warm_up(self, policy: PolicyFn, buf: RolloutBuffer) -> int:
        device = self.runner.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            steps = self.runner.collect(policy, buf)
        torch.cuda.current_stream(device).wait_stream(side)
        return steps

    def _capture(self, policy: PolicyFn, buf: RolloutBuffer
                 ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Record one rollout (nothing runs until the graph is replayed)."""
        runner = self.runner
        runner.episodes.fold()
        obs = runner.obs.clone()  # owned here: nothing else rebinds or frees it
        runner.obs = obs
        graph = torch.cuda.CUDAGraph()
        env: Any = runner.env  # graph safe: it names its generators
        with torch.cuda.device(runner.device):
            for generator in (*self.generators, *env.generators):
                graph.register_generator_state(generator)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            runner.collect(policy, buf)
            runner.episodes.fold()
            obs.copy_(runner.obs)
        runner.obs = obs
        return graph, obs
