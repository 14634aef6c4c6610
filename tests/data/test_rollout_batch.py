"""One on-policy batch type: flat PPO samples, or recurrent sequences with a mask."""

from __future__ import annotations

import torch

from rlloop.data.rollout import RolloutBatch
from rlloop.data.sequences import chunk_states, sequence_mask, to_sequences


def _flat(n: int) -> RolloutBatch:
    x = torch.arange(n, dtype=torch.float32)
    return RolloutBatch(x[:, None], torch.arange(n), -x, x, 2 * x, 3 * x)


def _sequences(steps: int, envs: int, length: int) -> RolloutBatch:
    x = torch.arange(steps * envs, dtype=torch.float32).view(steps, envs)

    def seq(v: torch.Tensor) -> torch.Tensor:
        return to_sequences(v, length)

    return RolloutBatch(seq(x[..., None]), seq(x.long()), seq(-x), seq(x), seq(2 * x),
                        seq(3 * x), starts=seq(torch.zeros_like(x, dtype=torch.bool)),
                        mask=sequence_mask(steps, envs, length, torch.device("cpu")),
                        state=chunk_states(torch.zeros(steps, envs, 5), length))


def test_a_flat_batch_has_no_sequence_fields_and_counts_its_rows() -> None:
    batch = _flat(6)
    assert batch.starts is None and batch.mask is None and batch.state is None
    assert batch.num_samples() == len(batch) == 6
    part = batch.select(torch.tensor([4, 1]))
    assert torch.equal(part.returns, torch.tensor([8.0, 2.0])) and part.mask is None
    assert part.num_samples() == 2


def test_sequences_count_their_real_steps_not_rows_or_padding() -> None:
    batch = _sequences(steps=5, envs=3, length=2)  # 3 chunks per env, the last half padding
    assert len(batch) == 9 and batch.obs.shape == (9, 2, 1)
    assert int(batch.num_samples()) == 15
    first_chunks = batch.rows(0, 3)  # env 0's three chunks: 5 real steps
    assert first_chunks.state is not None and first_chunks.state.shape == (3, 5)
    assert int(first_chunks.num_samples()) == 5
