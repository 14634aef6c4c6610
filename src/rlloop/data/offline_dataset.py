"""Recorded datasets in the Minari format: written by ``rlloop collect``, read whole onto the
run's device for offline training.

A Minari dataset is a directory ``<dir>/data/`` holding ``metadata.json`` (the spaces, the
env spec, the counts) and its episodes; each episode stores ``T + 1`` observations (the
last one is the episode's final observation) and ``T`` actions, rewards, terminations and
truncations. Transitions are read from them as ``(obs[t], action[t], reward[t],
obs[t + 1], terminated[t])``: a truncated episode bootstraps from its final observation,
a terminated one does not.

Minari (``pip install 'rlloop[offline]'``) reads and writes the files, so any Minari
dataset on disk is read here and what ``rlloop collect`` writes is read by
``minari.load_dataset``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlloop.config.offline import dataset_dir, dataset_metadata, space_mismatch
from rlloop.data.transitions import Transitions
from rlloop.envs.core import Box, Discrete, EnvSpec
from rlloop.errors import ConfigError
from rlloop.system.extras import require


@dataclass(frozen=True)
class Episode:
    """One recorded episode of ``T`` steps, as numpy arrays in the env's units.

    Attributes:
        observations: ``[T + 1, *obs]``, the last is the episode's final observation.
        actions: ``[T, *act]`` (int64 ``[T]`` for Discrete actions).
        rewards, terminations, truncations: ``[T]``.
    """

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray


@dataclass(frozen=True)
class OfflineDataset:
    """A whole dataset's ``M`` transitions on one device, sampled uniformly.

    Attributes:
        obs, next_obs: ``[M, *obs]`` float32.
        action: ``[M, *act]`` float32 in ``[-1, 1]`` (continuous actions rescaled from the
            env's box) or int64 ``[M]``.
        reward: ``[M]`` float32; terminated: ``[M]`` bool.
        episodes: Episodes the transitions came from.
        returns: ``[episodes]`` float64 episode returns (the dataset's quality).
    """

    obs: Tensor
    action: Tensor
    reward: Tensor
    next_obs: Tensor
    terminated: Tensor
    episodes: int
    returns: np.ndarray

    def __len__(self) -> int:
        return len(self.reward)

    def sample(self, batch_size: int, generator: torch.Generator, gamma: float) -> Transitions:
        """``batch_size`` transitions drawn uniformly with replacement (from ``generator``,
        on the data's device)."""
        rows = torch.randint(len(self), (batch_size,), generator=generator,
                             device=generator.device).to(self.reward.device)
        reward = self.reward[rows]
        return Transitions(self.obs[rows], self.action[rows], reward, self.next_obs[rows],
                           self.terminated[rows], torch.full_like(reward, gamma))

    def fingerprint(self) -> dict[str, float]:
        """What a checkpoint records of the dataset, to refuse a resume on another one."""
        return {"transitions": float(len(self)), "episodes": float(self.episodes),
                "reward_sum": float(self.reward.double().sum())}


def open_minari(name: str) -> Any:
    """Dataset ``name`` (a directory, or ``minari:ID``) as a ``minari.MinariDataset``."""
    require("minari", f"the dataset {name}")
    import minari

    return minari.MinariDataset(dataset_dir(name).resolve() / "data")


def check_dataset(name: str, spec: EnvSpec) -> None:
    """Dataset ``name``'s metadata checked against the env ``spec`` it trains a policy for
    (nothing else is read).

    Raises:
        ConfigError: a missing dataset, one that is not Minari's, spaces unlike the env's,
            Dict or image observations.
    """
    meta = dataset_metadata(name)
    space = spec.action_space
    if spec.obs_parts or spec.image_obs or not isinstance(space, Box | Discrete):
        raise ConfigError(f"offline training takes vector observations and Discrete or Box "
                          f"actions; {spec.env_id} has other ones")
    kind, shape = ("Discrete", (space.n,)) if isinstance(space, Discrete) else ("Box",
                                                                                space.shape)
    problem = space_mismatch(name, meta, spec.env_id, spec.obs_shape, kind, shape)
    if problem is not None:
        raise ConfigError(problem)


def load_dataset(name: str, spec: EnvSpec, device: torch.device) -> OfflineDataset:
    """Dataset ``name``, checked against the env ``spec`` (:func:`check_dataset`), as
    transitions on ``device``.

    Raises:
        ConfigError: what :func:`check_dataset` raises, or a dataset without transitions.
    """
    check_dataset(name, spec)
    space = spec.action_space
    assert isinstance(space, Box | Discrete)
    episodes = [Episode(np.asarray(e.observations), np.asarray(e.actions),
                        np.asarray(e.rewards), np.asarray(e.terminations),
                        np.asarray(e.truncations))
                for e in open_minari(name).iterate_episodes()]
    if not episodes or not sum(len(e.rewards) for e in episodes):
        raise ConfigError(f"dataset {name} holds no transitions; record it again with "
                          "`rlloop collect RUN_DIR --episodes N`")
    return _to_transitions(episodes, space, device)


def _to_transitions(episodes: Sequence[Episode], space: Box | Discrete,
                    device: torch.device) -> OfflineDataset:
    obs = np.concatenate([e.observations[:-1] for e in episodes]).astype(np.float32)
    next_obs = np.concatenate([e.observations[1:] for e in episodes]).astype(np.float32)
    actions = np.concatenate([e.actions for e in episodes])
    if isinstance(space, Discrete):
        action = torch.as_tensor(actions.astype(np.int64).reshape(-1))
    else:
        low, high = np.asarray(space.low), np.asarray(space.high)
        unit = (actions.reshape(len(actions), -1) - (high + low) / 2) / ((high - low) / 2)
        action = torch.as_tensor(np.clip(unit, -1.0, 1.0).astype(np.float32)).reshape(
            len(actions), *space.shape)
    returns = np.array([float(np.sum(e.rewards, dtype=np.float64)) for e in episodes])
    rewards = np.concatenate([e.rewards for e in episodes]).astype(np.float32)
    terminated = np.concatenate([e.terminations for e in episodes]).astype(bool)
    return OfflineDataset(torch.as_tensor(obs).to(device), action.to(device),
                          torch.as_tensor(rewards).to(device),
                          torch.as_tensor(next_obs).to(device),
                          torch.as_tensor(terminated).to(device), len(episodes), returns)


def write_minari(path: Path, episodes: Sequence[Episode], env_id: str,
                 algorithm_name: str | None = None, description: str | None = None) -> Path:
    """Write ``episodes`` of Gymnasium env ``env_id`` as a Minari dataset in ``path``
    (``path/data/``), readable by ``minari.load_dataset`` when ``path`` lies in Minari's
    store under the dataset's id (``path``'s name, ``-v0`` added when it has no version).
    Returns ``path``."""
    require("minari", "rlloop collect")
    import gymnasium
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    path = path.resolve()  # Minari 0.5 mislays relative paths when sizing its files
    path.mkdir(parents=True, exist_ok=True)
    env = gymnasium.make(env_id)
    try:
        storage = MinariStorage.new(path / "data", observation_space=env.observation_space,
                                    action_space=env.action_space, env_spec=env.spec,
                                    data_format="arrow")
    finally:
        env.close()
    dataset_id = path.name if "-v" in path.name else f"{path.name}-v0"
    meta: dict[str, Any] = {"dataset_id": dataset_id, "minari_version": minari.__version__}
    if algorithm_name:
        meta["algorithm_name"] = algorithm_name
    if description:
        meta["description"] = description
    storage.update_metadata(meta)
    storage.update_episodes([
        EpisodeBuffer(id=i, observations=e.observations, actions=e.actions,
                      rewards=e.rewards, terminations=e.terminations,
                      truncations=e.truncations, infos={})
        for i, e in enumerate(episodes)])
    return path
