"""Cutting a learner's batch into minibatches and micro-batches, as row ranges.

A minibatch epoch gathers each module's batch once in shuffled order and hands out views
of consecutive rows, one gather per field per epoch instead of one per minibatch; a
micro-batch is a further cut of a minibatch, so the gradient of a large minibatch can be
summed over passes that fit in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar

import torch

from rlloop.data.batch import TensorBatch

BatchT = TypeVar("BatchT", bound=TensorBatch)


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``torch.arange(n).chunk(chunks)``: same split, no tensors."""
    size = -(-n // chunks)
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def micro_batch_count(mb: Mapping[str, TensorBatch], micro_batch: int | None) -> int:
    """How many passes keep every module's minibatch in ``mb`` at no more than
    ``micro_batch`` rows each (1 when that is ``None``)."""
    if micro_batch is None:
        return 1
    return max(1, -(-max(len(b) for b in mb.values()) // micro_batch))


def epoch_minibatches(batch: Mapping[str, BatchT], num_epochs: int,
                      minibatch_size: int | None, shuffle: bool,
                      generator: torch.Generator | None) -> Iterator[dict[str, BatchT]]:
    """``num_epochs`` passes over ``batch``, each cut into as many minibatches as the
    largest module's batch needs at ``minibatch_size`` rows (one when ``None``); a module
    with fewer rows is cut as often, and sits out the minibatches past its last row."""
    sizes = {m: len(b) for m, b in batch.items()}
    if not sizes:
        return
    n_max = max(sizes.values())
    num_mb = 1 if not minibatch_size else max(1, -(-n_max // minibatch_size))
    if num_mb == 1 and not shuffle:  # each epoch is the batch as it is (A2C's update)
        for _ in range(num_epochs):
            yield dict(batch)
        return
    device = generator.device if generator is not None else torch.device("cpu")
    for _ in range(num_epochs):
        shuffled = {m: batch[m].select(torch.randperm(n, generator=generator, device=device))
                    if shuffle else batch[m] for m, n in sizes.items()}
        bounds = {m: chunk_bounds(n, num_mb) for m, n in sizes.items()}
        for i in range(num_mb):
            yield {m: shuffled[m].rows(*b[i]) for m, b in bounds.items() if i < len(b)}
