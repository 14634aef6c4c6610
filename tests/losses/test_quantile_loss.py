"""The quantile Huber loss: a hand-computed case, sb3-contrib's values for both shapes
(QR-DQN's and TQC's) in float64, and the importance weights' effect."""

from __future__ import annotations

import pytest
import torch
from sb3_contrib.common.utils import quantile_huber_loss as peer_loss
from torch.testing import assert_close

from rlloop.losses.quantile import quantile_huber_loss, quantile_midpoints


def test_a_hand_computed_case() -> None:
    # Two quantiles at tau = 1/4, 3/4 of 0; one target sample 2 (both deltas +2: linear
    # Huber 1.5, weight tau) and one -0.5 (quadratic 0.125, weight 1 - tau).
    current = torch.zeros(1, 2, requires_grad=True)
    target = torch.tensor([[2.0, -0.5]])
    loss = quantile_huber_loss(current, target)
    per_target = [(0.25 + 0.75) * 1.5, (0.75 + 0.25) * 0.125]  # summed over quantiles
    assert_close(loss, torch.tensor(sum(per_target) / 2))
    loss.backward()
    # d/dcurrent_i: -(tau_i * 1 + (1 - tau_i) * (-0.5)) / 2 targets
    assert_close(current.grad, torch.tensor([[-(0.25 - 0.375) / 2, -(0.75 - 0.125) / 2]]))


@pytest.mark.parametrize("shape", [((8, 16), (8, 12)), ((8, 3, 16), (8, 1, 40))],
                         ids=["qrdqn", "tqc"])
def test_equals_sb3_contrib_in_float64(shape: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    # 16 quantiles: sb3-contrib's float32 midpoints are exact, so float64 agrees to rounding.
    g = torch.Generator().manual_seed(0)
    current = (2 * torch.randn(shape[0], generator=g, dtype=torch.float64)).requires_grad_()
    target = 2 * torch.randn(shape[1], generator=g, dtype=torch.float64)
    ours = quantile_huber_loss(current, target)
    (grad,) = torch.autograd.grad(ours, current)
    theirs = peer_loss(current, target, sum_over_quantiles=True)
    (peer_grad,) = torch.autograd.grad(theirs, current)
    assert_close(ours, theirs, rtol=0, atol=1e-12)
    assert_close(grad, peer_grad, rtol=0, atol=1e-12)


def test_weights_scale_each_sample_and_shapes_must_match() -> None:
    g = torch.Generator().manual_seed(1)
    current, target = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    per_sample = torch.stack([quantile_huber_loss(current[i:i + 1], target[i:i + 1])
                              for i in range(4)])
    weights = torch.tensor([0.0, 0.5, 1.0, 2.0])
    assert_close(quantile_huber_loss(current, target, weights), (weights * per_sample).mean())
    assert_close(quantile_huber_loss(current, target), per_sample.mean())
    assert_close(quantile_midpoints(4, current), torch.tensor([0.125, 0.375, 0.625, 0.875]))
    with pytest.raises(ValueError, match="must both be"):
        quantile_huber_loss(current, target[:, None])
