"""Deterministic evaluation: run whole episodes on a separate eval env."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlloop.envs.core import VecEnv
from rlloop.system.devices import stats_dtype
from rlloop.system.signals import check_eval_stop

#: ``act(obs [N, *obs]) -> actions`` for evaluation (deterministic or sampled).
ActFn = Callable[[Tensor], Tensor]


@torch.inference_mode()
def evaluate(act: ActFn, env: VecEnv, episodes: int, seed: int | None = None,
             max_steps: int = 1_000_000,
             begin_episodes: Callable[[Tensor], None] | None = None) -> dict[str, float]:
    """Mean/std/min/max return and mean length over exactly ``episodes`` episodes.

    Env ``i`` contributes its first ``ceil((episodes - i) / N)`` episodes, so the result
    does not favour envs whose episodes are short. ``begin_episodes`` (for policies with
    memory) hears ``[N]`` bool flags of the envs whose next observation begins an episode,
    before ``act`` sees it: all of them after the reset, then those that just ended.
    Inside a training run, a stop signal ends it early (see
    :func:`~rlloop.system.signals.check_eval_stop`).
    """
    n = env.num_envs
    obs = env.reset(seed=seed)
    device = obs.device  # the env's: all bookkeeping stays beside its tensors
    if begin_episodes is not None:
        begin_episodes(torch.ones(n, dtype=torch.bool, device=device))
    quota = torch.tensor([len(range(i, episodes, n)) for i in range(n)], device=device)
    running = torch.zeros(n, dtype=stats_dtype(device), device=device)
    lengths = torch.zeros(n, dtype=torch.int64, device=device)
    done_count = torch.zeros(n, dtype=torch.int64, device=device)
    returns: list[float] = []
    ep_lengths: list[int] = []
    for _ in range(max_steps):
        if bool((done_count >= quota).all()):
            break
        check_eval_stop(len(returns), episodes)
        res = env.step(act(obs))
        running += res.reward
        lengths += 1
        done = (res.terminated | res.truncated) & (done_count < quota)
        if bool(done.any()):
            returns.extend(running[done].tolist())
            ep_lengths.extend(lengths[done].tolist())
            done_count += done.long()
        ended = res.terminated | res.truncated
        running.masked_fill_(ended, 0.0)
        lengths.masked_fill_(ended, 0)
        obs = res.obs
        if begin_episodes is not None:
            begin_episodes(ended)
    r = torch.tensor(returns, dtype=torch.float64, device="cpu")
    return {
        "return_mean": float(r.mean()) if len(r) else float("nan"),
        "return_std": float(r.std(unbiased=False)) if len(r) else float("nan"),
        "return_min": float(r.min()) if len(r) else float("nan"),
        "return_max": float(r.max()) if len(r) else float("nan"),
        "length_mean": sum(ep_lengths) / max(len(ep_lengths), 1),
        "episodes": float(len(returns)),
    }
