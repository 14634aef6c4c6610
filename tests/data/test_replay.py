"""Uniform and prioritized replay: storage order, sampling distributions, weights, state."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rlloop.data.prioritized_replay import PrioritizedReplayBuffer
from rlloop.data.replay import ReplayBuffer, ReplayMemoryError
from rlloop.data.transitions import Transitions


def _batch(ids: range | list[int]) -> Transitions:
    """Transitions whose every field encodes the item id."""
    i = torch.tensor(list(ids))
    return Transitions(
        obs=i.float().unsqueeze(1).repeat(1, 2),
        action=i,
        reward=i.float(),
        next_obs=(i + 1).float().unsqueeze(1).repeat(1, 2),
        terminated=i % 2 == 0,
        discount=torch.full((len(i),), 0.99),
    )


def _uniform(capacity: int) -> ReplayBuffer:
    return ReplayBuffer(capacity, (2,), (), torch.int64)


def _prioritized(capacity: int, alpha: float = 1.0, eps: float = 1e-6) -> PrioritizedReplayBuffer:
    return PrioritizedReplayBuffer(capacity, (2,), (), torch.int64, alpha=alpha, eps=eps)


def _stored_actions(buf: ReplayBuffer) -> list[int]:
    actions = buf.get_state()["action"]
    assert isinstance(actions, torch.Tensor)
    return [int(a) for a in actions]


def _sampled_rows(buf: PrioritizedReplayBuffer, batch_size: int, batches: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    rows = [buf.sample(batch_size, gen).indices for _ in range(batches)]
    return torch.cat([r for r in rows if r is not None])


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat: torch.Tensor = torch.square(counts - expected).div(expected).sum()
    return float(stat)


def _chi2_bound(df: int) -> float:
    # mean df, std sqrt(2 df): 6 standard deviations is never reached by chance.
    return df + 6 * math.sqrt(2 * df)


def test_circular_overwrite_order() -> None:
    buf = _uniform(5)
    assert buf.add(_batch(range(3))).tolist() == [0, 1, 2]
    assert buf.add(_batch(range(3, 7))).tolist() == [3, 4, 0, 1]
    assert len(buf) == 5
    assert _stored_actions(buf) == [5, 6, 2, 3, 4]
    # More than capacity at once: only the newest survive, in add-one-by-one slots.
    buf.add(_batch(range(7, 15)))
    assert _stored_actions(buf) == [10, 11, 12, 13, 14]
    assert buf.get_state()["pos"] == 0


def test_sampled_fields_stay_aligned() -> None:
    buf = _uniform(8)
    buf.add(_batch(range(20)))
    out = buf.sample(64, torch.Generator().manual_seed(0))
    ids = out.action
    assert out.indices is not None and out.weights is None
    assert_close(out.obs[:, 0], ids.float())
    assert_close(out.next_obs[:, 1], ids.float() + 1)
    assert_close(out.reward, ids.float())
    assert torch.equal(out.terminated, ids % 2 == 0)


def test_uniform_sampling_covers_all_rows_evenly() -> None:
    buf = _uniform(50)
    buf.add(_batch(range(50)))
    gen = torch.Generator().manual_seed(1)
    rows = torch.cat([buf.sample(1000, gen).action for _ in range(20)])
    counts = torch.bincount(rows, minlength=50).double()
    assert (counts > 0).all()
    assert _chi2(counts, torch.full((50,), 1 / 50, dtype=torch.float64)) < _chi2_bound(49)


def test_add_rejects_bad_shapes() -> None:
    bad = dataclasses.replace(_batch(range(3)), obs=torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"obs has shape \(3, 5\)"):
        _uniform(4).add(bad)


def test_empty_buffer_cannot_sample() -> None:
    with pytest.raises(ValueError, match="empty"):
        _uniform(4).sample(2)


def test_nbytes_matches_allocation() -> None:
    buf = ReplayBuffer(7, (3, 4), (2,), torch.float32, obs_dtype=torch.uint8)
    buf.add(
        Transitions(
            torch.zeros(7, 3, 4),
            torch.zeros(7, 2),
            torch.zeros(7),
            torch.zeros(7, 3, 4),
            torch.zeros(7, dtype=torch.bool),
            torch.zeros(7),
        )
    )
    state = buf.get_state()
    stored = sum(v.nbytes for v in state.values() if isinstance(v, torch.Tensor))
    assert buf.nbytes == stored == 7 * (2 * 12 + 2 * 4 + 4 + 1 + 4)


def test_memory_check_raises_typed_error_before_allocating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Far beyond any machine: an allocation attempt would fail differently (or hang).
    with pytest.raises(ReplayMemoryError, match="lower capacity") as info:
        ReplayBuffer(10**13, (84, 84, 4), (), torch.int64, obs_dtype=torch.uint8)
    assert isinstance(info.value, MemoryError)
    assert "bytes" in str(info.value) and "\n" not in str(info.value)

    monkeypatch.setattr("psutil.virtual_memory", lambda: SimpleNamespace(available=1_000))
    with pytest.raises(ReplayMemoryError, match="only 1,000 bytes"):
        _prioritized(100)
    _uniform(10)  # 10 * 33 bytes fits in 1,000


def test_state_round_trip_gives_identical_samples() -> None:
    for make in (_uniform, _prioritized):
        buf = make(16)
        buf.add(_batch(range(23)))
        if isinstance(buf, PrioritizedReplayBuffer):
            buf.update_priorities(torch.arange(16), torch.linspace(0.1, 3.0, 16))
        restored = make(16)
        restored.set_state(buf.get_state())
        a, b = (
            buf.sample(32, torch.Generator().manual_seed(3)),
            restored.sample(32, torch.Generator().manual_seed(3)),
        )
        for field in dataclasses.fields(a):
            x, y = getattr(a, field.name), getattr(b, field.name)
            assert x is y is None or (x is not None and y is not None and torch.equal(x, y))
        # Both keep writing into the same rows afterwards.
        assert torch.equal(buf.add(_batch([99])), restored.add(_batch([99])))


def test_state_from_other_capacity_is_rejected() -> None:
    with pytest.raises(ValueError, match="capacity"):
        _uniform(8).set_state(_uniform(4).get_state())


# ---------------------------------------------------------------- prioritized


def test_sum_tree_descent_matches_prefix_sums() -> None:
    # Dyadic priorities and eps keep every sum exact, so boundaries can be tested too.
    buf = _prioritized(11, eps=2.0**-20)  # not a power of two: 5 empty leaves
    buf.add(_batch(range(11)))
    p = torch.tensor([0.5, 2, 1, 0.25, 3, 1.5, 0.75, 2.5, 1, 0.125, 4], dtype=torch.float64)
    buf.update_priorities(torch.arange(11), p - buf.eps)
    cumsum = p.cumsum(0)
    mass = torch.rand(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mass = torch.cat([mass * cumsum[-1], cumsum[:-1], torch.zeros(1)])
    expected = torch.searchsorted(cumsum, mass, right=True)
    assert torch.equal(torch.from_numpy(buf._retrieve(mass.numpy())), expected)


def test_sampling_frequencies_proportional_to_priorities() -> None:
    buf = _prioritized(10, alpha=0.5)
    buf.add(_batch(range(10)))
    td = torch.arange(1.0, 11.0) ** 2
    buf.update_priorities(torch.arange(10), td)
    rows = _sampled_rows(buf, 256, 100)
    counts = torch.bincount(rows, minlength=10).double()
    probs = (td.double() + buf.eps) ** 0.5
    probs /= probs.sum()  # alpha=0.5 undoes the square
    assert _chi2(counts, probs) < _chi2_bound(9)
    assert_close(counts / counts.sum(), probs, atol=0.01, rtol=0)


def test_importance_weights_match_formula() -> None:
    buf = _prioritized(4, alpha=1.0, eps=1e-12)
    buf.add(_batch(range(4)))
    buf.update_priorities(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    out = buf.sample(200, torch.Generator().manual_seed(0), beta=0.5)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    w = (4 * probs) ** -0.5
    w = w / w.max()  # == [1, 1/sqrt(2), 1/sqrt(3), 1/2]
    assert out.weights is not None and out.indices is not None
    assert_close(out.weights, w[out.indices])
    assert set(out.indices.tolist()) == {0, 1, 2, 3}


def test_importance_weights_normalise_by_the_buffer_not_the_batch() -> None:
    # Row 0 holds the lowest priority and is (almost) never drawn: the weights still divide
    # by its weight, the largest in the buffer, so none reaches 1 in a batch without it.
    buf = _prioritized(4, alpha=1.0, eps=1e-12)
    buf.add(_batch(range(4)))
    buf.update_priorities(torch.arange(4), torch.tensor([1e-6, 1.0, 1.0, 2.0]))
    out = buf.sample(8, torch.Generator().manual_seed(0), beta=1.0)
    assert out.weights is not None and out.indices is not None
    assert 0 not in out.indices.tolist()
    priorities = torch.tensor([1e-6, 1.0, 1.0, 2.0])
    expected = (priorities / priorities.min()) ** -1.0  # (N P(i))^-b / max_j (N P(j))^-b
    assert_close(out.weights, expected[out.indices].to(out.weights.dtype))
    assert float(out.weights.max()) < 1e-5


def test_update_priorities_shifts_frequencies_and_new_items_get_max() -> None:
    buf = _prioritized(8)
    buf.add(_batch(range(8)))

    def freq_of_row_3() -> float:
        return float((_sampled_rows(buf, 128, 20) == 3).double().mean())

    assert abs(freq_of_row_3() - 1 / 8) < 0.03  # all new items share the max priority (1)
    buf.update_priorities(torch.tensor([3, 3, 5]), torch.tensor([0.5, 93.0, 0.5]))
    assert freq_of_row_3() > 0.9  # duplicate row keeps its largest priority, 93
    buf.add(_batch([8]))  # overwrites row 0 with the max priority seen so far
    assert_close(buf._sum_tree[buf._leaves].item(), 93.0 + buf.eps)


def test_alpha_zero_is_uniform_with_unit_weights() -> None:
    buf = _prioritized(6, alpha=0.0)
    buf.add(_batch(range(6)))
    buf.update_priorities(torch.arange(6), torch.arange(6.0) * 10)
    out = buf.sample(600, torch.Generator().manual_seed(0), beta=1.0)
    assert out.weights is not None and out.indices is not None
    assert_close(out.weights, torch.ones(600))
    assert torch.equal(torch.bincount(out.indices, minlength=6), torch.full((6,), 100))
