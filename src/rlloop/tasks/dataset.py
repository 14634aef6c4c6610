"""Trajectories -> a dataset of clips -> minibatches (``ml``'s replay dataset, on-policy)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler
from torch.utils.data import default_collate as torch_collate


def collate(items: Sequence[Any]) -> Any:
    """Stack items along a new first dim, recursing into containers.

    Dataclass items (such as :class:`~rlloop.tasks.sampling.Sample` or a task's own
    sample type) become one instance of the same class whose fields are the stacked
    fields, so batches stay typed (``batch.obs``, not ``batch["obs"]``); tuples, named
    tuples, lists and dicts keep their shape. Leaves (arrays, tensors, numbers) go
    through torch's ``default_collate``.
    """
    first = items[0]
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return type(first)(**{
            f.name: collate([getattr(item, f.name) for item in items])
            for f in dataclasses.fields(first) if f.init
        })
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a NamedTuple
        return type(first)(*(collate(column) for column in zip(*items, strict=True)))
    if isinstance(first, tuple | list):
        return type(first)(collate(column) for column in zip(*items, strict=True))
    if isinstance(first, Mapping):
        return {key: collate([item[key] for item in items]) for key in first}
    with torch.device("cpu"):  # batches are built on the host, whatever the default device
        return torch_collate(list(items))


class TrajectoryDataset(Dataset[Any]):
    """Clips of ``num_samples`` consecutive items, starting every ``stride`` steps of each
    trajectory (clips never span two trajectories; shorter trajectories add none).

    With ``num_samples=1`` an item is one trajectory item, so a minibatch has fields of
    shape ``[B, ...]``; otherwise an item is its clip collated over time and a minibatch
    has fields of shape ``[B, num_samples, ...]``.
    """

    def __init__(self, trajectories: Sequence[Sequence[Any]], num_samples: int = 1,
                 stride: int = 1) -> None:
        if num_samples < 1 or stride < 1:
            raise ValueError(f"num_samples and stride must be >= 1, got {num_samples} and "
                             f"{stride}")
        self.trajectories = trajectories
        self.num_samples = num_samples
        self.index = [(i, start) for i, t in enumerate(trajectories)
                      for start in range(0, len(t) - num_samples + 1, stride)]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Any:
        t, start = self.index[i]
        trajectory = self.trajectories[t]
        if self.num_samples == 1:
            return trajectory[start]
        return collate(trajectory[start:start + self.num_samples])


class HostRandomSampler(RandomSampler):
    """``RandomSampler``'s order (the same draws from the same generator), with the
    permutations made on the host explicitly rather than on torch's default device."""

    def __iter__(self) -> Iterator[int]:
        if self.generator is None or self.replacement:
            yield from super().__iter__()
            return
        n, g = len(self.data_source), self.generator
        for _ in range(self.num_samples // n):
            yield from torch.randperm(n, generator=g, device="cpu").tolist()
        yield from torch.randperm(n, generator=g, device="cpu").tolist()[: self.num_samples % n]


def make_dataloader(dataset: Dataset[Any], batch_size: int, *, shuffle: bool = True,
                    generator: torch.Generator | None = None) -> DataLoader[Any]:
    """Minibatches of ``dataset`` in the main process (clips are already in memory),
    built on the host; ``generator`` (a CPU one) orders them."""
    sampler = HostRandomSampler(dataset, generator=generator) if shuffle else None  # type: ignore[arg-type]
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate,
                      generator=generator)


def host_iter(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)`` with the seed it draws on start made on the host, whatever torch's
    default device (the sampler and :func:`collate` are explicit already)."""
    with torch.device("cpu"):
        return iter(loader)
