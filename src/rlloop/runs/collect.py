"""``rlloop collect``: record episodes of a run's best policy as a Minari dataset.

The policy acts greedily or by sampling, optionally with epsilon noise (with probability
``epsilon`` an env's action is drawn uniformly from the action space instead); envs are
stepped side by side and every episode is recorded whole (observations, actions,
rewards, terminations, truncations) until ``episodes`` have ended. The dataset is what
:func:`~rlloop.data.offline_dataset.write_minari` writes: ``minari`` reads it, and
``rlloop train bc|cql|iql --dataset DIR`` trains on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlloop.algorithms.base import AlgorithmBase
from rlloop.config.offline import check_dataset_output
from rlloop.data.offline_dataset import Episode, write_minari
from rlloop.envs.core import Box, VecEnv, sample_random_actions
from rlloop.envs.registry import make_env
from rlloop.errors import ConfigError
from rlloop.runs.saved import load_run_policy
from rlloop.system.seeding import derive_seed


@dataclass(frozen=True)
class CollectResult:
    """What ``collect`` wrote: the dataset's directory, episodes, steps and mean return."""

    path: Path
    episodes: int
    steps: int
    return_mean: float


def collect(run_dir: str | Path, episodes: int, output: str | Path, *,
            deterministic: bool = True, epsilon: float = 0.0, seed: int = 0,
            num_envs: int = 8, backend: str | None = None, device: str | None = None,
            allow_import: bool = False) -> CollectResult:
    """Record ``episodes`` episodes of ``run_dir``'s best policy into ``output``."""
    if episodes <= 0 or not 0.0 <= epsilon <= 1.0:
        raise ConfigError(f"--episodes must be > 0 and --epsilon in [0, 1], got {episodes} "
                          f"and {epsilon}")
    path = check_dataset_output(str(output))
    algorithm = load_run_policy(run_dir, backend, device, allow_import=allow_import)
    settings = algorithm.settings
    env = make_env(settings.env_id, min(num_envs, episodes), settings.backend, seed=seed,
                   env_kwargs=settings.env_kwargs, device=algorithm.device,
                   step_timeout=settings.step_timeout)
    try:
        recorded = _record(algorithm, env, episodes, deterministic, epsilon, seed)
    finally:
        env.close()
        algorithm.close()
    kind = "greedy" if deterministic else "sampled"
    write_minari(path, recorded, settings.env_id, algorithm_name=algorithm.name,
                 description=f"{len(recorded)} episodes of {algorithm.name} ({kind}, "
                             f"epsilon={epsilon}) from {Path(run_dir).name}")
    returns = [float(e.rewards.sum()) for e in recorded]
    return CollectResult(path, len(recorded), sum(len(e.rewards) for e in recorded),
                         float(np.mean(returns)))


def _record(algorithm: AlgorithmBase, venv: VecEnv, episodes: int, deterministic: bool,
            epsilon: float, seed: int) -> list[Episode]:
    """Step ``venv`` with the policy until ``episodes`` episodes ended; the first ones to
    end, in order."""
    space = venv.spec.action_space
    generator = torch.Generator(algorithm.device).manual_seed(derive_seed(seed, "collect"))
    stats = algorithm.obs_stats
    obs = venv.reset(seed=seed)
    n = venv.num_envs
    steps: list[list[tuple[np.ndarray, np.ndarray, float, bool, bool]]] = [[] for _ in range(n)]
    done_episodes: list[Episode] = []
    algorithm.begin_episodes(torch.ones(n, dtype=torch.bool, device=algorithm.device))
    while len(done_episodes) < episodes:
        with torch.no_grad():
            action = algorithm.act(obs if stats is None else stats.normalize(obs),
                                   deterministic)
        if epsilon > 0:
            noise = torch.rand(n, generator=generator, device=generator.device) < epsilon
            random = sample_random_actions(space, n, generator).to(action.device, action.dtype)
            action = torch.where(noise.view(-1, *([1] * (action.dim() - 1))), random, action)
        if isinstance(space, Box):  # what the env takes is what the dataset holds
            action = action.clamp(torch.tensor(space.low, device=action.device),
                                  torch.tensor(space.high, device=action.device))
        res = venv.step(action)
        ended = res.terminated | res.truncated
        host = [t.cpu().numpy() for t in (obs, action, res.reward, res.terminated,
                                          res.truncated, res.final_obs)]
        for i in range(n):
            steps[i].append((host[0][i], host[1][i], float(host[2][i]), bool(host[3][i]),
                             bool(host[4][i])))
            if host[3][i] or host[4][i]:
                done_episodes.append(_episode(steps[i], host[5][i]))
                steps[i] = []
        if bool(ended.any()):
            algorithm.begin_episodes(ended)
        obs = res.obs
    return done_episodes[:episodes]


def _episode(steps: list[tuple[np.ndarray, np.ndarray, float, bool, bool]],
             final_obs: np.ndarray) -> Episode:
    observations = np.stack([s[0] for s in steps] + [final_obs])
    return Episode(observations, np.stack([s[1] for s in steps]),
                   np.array([s[2] for s in steps], dtype=np.float64),
                   np.array([s[3] for s in steps]), np.array([s[4] for s in steps]))
