"""Fixed-length fragments of experience, what an env runner sends to the learner.

A runner holds M envs and a copy of the algorithm (its policy, its in-process
:class:`~rlloop.runners.env_runner.EnvRunner`); each call samples T steps per env and
returns them as a :class:`Fragment` tagged with the ``weights_seq_no`` of the weights that
acted. Episodes are cut at fragment borders and continue in the next fragment, so one
long episode never holds the others back. Nothing here imports Ray: the same code runs
inside a Ray actor and, in tests, in this process.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from rlloop.envs.core import EnvSpec, StepResult


@dataclass(frozen=True)
class Fragment:
    """T steps of M envs (``[T, M, ...]``), in the order they were taken.

    ``next_obs[t]`` is the observation after step t (the final one where an episode
    ended); ``last_obs`` ``[M, ...]`` is where the next fragment starts (PPO bootstraps
    from it). ``log_probs`` are the behaviour log-probabilities (PPO), None off-policy.
    """

    obs: Tensor
    actions: Tensor
    rewards: Tensor
    next_obs: Tensor
    terminated: Tensor
    truncated: Tensor
    last_obs: Tensor
    log_probs: Tensor | None
    weights_seq_no: int
    runner: int
    env_s: float = 0.0
    inference_s: float = 0.0
    instance: int = 0
    """Which life of the runner sampled it: a restarted runner gets a new number."""

    @property
    def steps(self) -> int:
        return self.rewards.numel()

    def tagged(self, weights_seq_no: int, runner: int, instance: int) -> Fragment:
        return replace(self, weights_seq_no=weights_seq_no, runner=runner, instance=instance)


class FragmentSampler:
    """Samples fragments from an algorithm built for one runner (M envs, no env runners).

    On-policy (PPO): the algorithm's own runner and rollout buffer, exactly as in
    process. Off-policy (DQN, SAC, TD3): T batched steps of its behaviour policy (uniform
    random actions while the learner's env-step count is below ``learning_starts``), as
    raw transitions; the learner's step processor turns them into replay entries.
    """

    def __init__(self, algorithm: Any, fragment_steps: int) -> None:
        """``algorithm``: an ``AlgorithmBase`` built for this runner (typed loosely: the
        algorithms sit above this package)."""
        self.algorithm = algorithm
        self.steps = fragment_steps
        self.on_policy = hasattr(algorithm, "buffer")

    def sample(self, env_steps: int) -> Fragment:
        """One fragment; ``env_steps`` is the learner's count (warm-up, exploration)."""
        if self.on_policy:
            return self._rollout()
        return self._transitions(env_steps)

    def _rollout(self) -> Fragment:
        algo: Any = self.algorithm
        runner, buf = algo.runner, algo.buffer
        algo.start_rollout()  # a fragment is the runner's rollout (PPO's gSDE noise)
        runner.collect(algo._behaviour, buf)
        times = runner.pop_times()
        # Only where an episode ended does the in-process runner write next_obs. ``[:]``
        # reads Dict observations' per-entry storage back as rows.
        return Fragment(buf.obs[:].clone(), buf.actions.clone(), buf.rewards.clone(),
                        buf.next_obs[:].clone(), buf.terminated.clone(), buf.truncated.clone(),
                        runner.obs.clone(), buf.log_probs.clone(), -1, -1,
                        times["time/env_s"], times["time/inference_s"])

    @torch.inference_mode()
    def _transitions(self, env_steps: int) -> Fragment:
        algo: Any = self.algorithm
        runner, loop = algo.runner, algo.loop
        # The learner's count drives the exploration schedule (DQN's epsilon).
        loop.env_steps = env_steps
        n = runner.env.num_envs
        algo.start_rollout()  # a fragment is the runner's rollout (SAC's gSDE noise)
        obs, actions, rewards, next_obs, terminated, truncated = [], [], [], [], [], []
        for _ in range(self.steps):
            # As the in-process loop acts: warm-up (legal actions where masked, the
            # policy with SAC's use_sde_at_warmup), then the behaviour policy.
            action = loop.choose_actions(runner.obs, algo._explore)
            res = runner.env.step(action if loop.to_env is None else loop.to_env(action))
            loop.episodes_ended(res.terminated | res.truncated)  # TD3's OU noise restarts
            # Clones: a batched env may hand out the same tensors at every step.
            obs.append(runner.obs.clone())
            actions.append(action)
            rewards.append(res.reward.clone())
            next_obs.append(res.final_obs.clone())
            terminated.append(res.terminated.clone())
            truncated.append(res.truncated.clone())
            runner.obs = res.obs
            loop.env_steps += n
        return Fragment(torch.stack(obs), torch.stack(actions), torch.stack(rewards),
                        torch.stack(next_obs), torch.stack(terminated), torch.stack(truncated),
                        runner.obs.clone(), None, -1, -1)



def weights_lag(published: list[int], weights_seq_no: int) -> int:
    """Weight versions in ``published`` (ascending) newer than ``weights_seq_no``."""
    return len(published) - bisect.bisect_right(published, weights_seq_no)


class FragmentEpisodes:
    """Episode statistics of the runners' envs, from the fragments' rewards and ends:
    the same keys as :class:`~rlloop.runners.env_runner.EpisodeTracker`."""

    def __init__(self, num_runners: int, envs: int, window: int = 100) -> None:
        self.totals = torch.zeros((2, num_runners, envs), dtype=torch.float64)
        self.recent: deque[tuple[float, float]] = deque(maxlen=window)
        self.count = 0

    def add(self, frag: Fragment) -> None:
        totals = self.totals[:, frag.runner]
        done = (frag.terminated | frag.truncated).cpu()
        rewards = frag.rewards.detach().cpu().double()
        for t in range(rewards.shape[0]):
            totals[0] += rewards[t]
            totals[1] += 1
            if done[t].any():
                for k in done[t].nonzero().flatten().tolist():
                    self.recent.append((float(totals[0, k]), float(totals[1, k])))
                    self.count += 1
                totals[:, done[t]] = 0.0

    def restart(self, runner: int | None = None) -> None:
        """Forget running episodes (all, or one runner's: its envs start over)."""
        if runner is None:
            self.totals.zero_()
        else:
            self.totals[:, runner] = 0.0

    def stats(self) -> dict[str, float]:
        if not self.recent:
            return {"episode/count": float(self.count)}
        returns = [r for r, _ in self.recent]
        return {"episode/return_mean": sum(returns) / len(returns),
                "episode/return_max": max(returns),
                "episode/length_mean": sum(n for _, n in self.recent) / len(self.recent),
                "episode/count": float(self.count)}

    def get_state(self) -> dict[str, Any]:
        return {"recent_returns": [r for r, _ in self.recent],
                "recent_lengths": [n for _, n in self.recent], "episodes": self.count}

    def set_state(self, state: dict[str, Any]) -> None:
        self.count = int(state.get("episodes", 0))
        self.recent.clear()
        self.recent.extend(zip(map(float, state.get("recent_returns", [])),
                               map(float, state.get("recent_lengths", [])), strict=True))


class RunnerGroup(Protocol):
    """What :class:`RemoteEnvs` needs of a group of env runners (Ray actors or processes)."""

    obs: Tensor

    def reset(self, seed: int | None = None) -> None: ...

    def close(self) -> None: ...


class RemoteEnvs:
    """The learner's view of the runners' envs: their spec and count; closing it stops
    the runners. They are stepped only inside the runners."""

    #: Stepped elsewhere: an env_config cannot rebuild them (AlgorithmBase.begin_horizon).
    remote = True

    def __init__(self, spec: EnvSpec, num_envs: int, group: RunnerGroup) -> None:
        self.spec, self.num_envs, self.group = spec, num_envs, group

    def reset(self, seed: int | None = None) -> Tensor:
        self.group.reset(seed)
        return self.group.obs

    def step(self, actions: Tensor) -> StepResult:
        raise RuntimeError("the envs run inside env runners; they are stepped there")

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        self.group.close()
