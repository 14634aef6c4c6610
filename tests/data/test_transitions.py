"""The one off-policy batch type: what replay buffers sample is what learners train on."""

from __future__ import annotations

import dataclasses

import torch

from rlloop.data.batch import TensorBatch
from rlloop.data.prioritized_replay import PrioritizedReplayBuffer
from rlloop.data.replay import ReplayBuffer
from rlloop.data.transitions import Transitions


def _transitions(n: int) -> Transitions:
    ids = torch.arange(n, dtype=torch.float32)
    return Transitions(ids[:, None], torch.arange(n), ids, ids[:, None] + 1,
                       torch.zeros(n, dtype=torch.bool), torch.full((n,), 0.99))


def test_a_sample_is_a_tensor_batch_whose_update_view_drops_only_the_rows() -> None:
    for buffer in (ReplayBuffer(8, (1,), (), torch.int64),
                   PrioritizedReplayBuffer(8, (1,), (), torch.int64)):
        buffer.add(_transitions(5))
        drawn = buffer.sample(6, torch.Generator().manual_seed(0))
        assert isinstance(drawn, TensorBatch) and len(drawn) == 6
        assert drawn.indices is not None
        learner_sees = drawn.for_update()
        assert learner_sees.indices is None
        assert dataclasses.replace(learner_sees, indices=drawn.indices) == drawn
        # The rows a sample reports are those its transitions were read from.
        assert torch.equal(drawn.reward.long(), drawn.indices)


def test_update_view_of_an_unsampled_batch_is_the_batch_itself() -> None:
    batch = _transitions(3)
    assert batch.for_update() is batch


def test_rows_select_every_field_and_keep_absent_ones_absent() -> None:
    batch = _transitions(4)
    half = batch.rows(1, 3)
    assert torch.equal(half.obs, batch.obs[1:3]) and torch.equal(half.discount,
                                                                  batch.discount[1:3])
    assert half.weights is None and half.indices is None
