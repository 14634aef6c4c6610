"""The global-norm clip's CPU path: torch's ``get_total_norm`` / ``clip_grads_with_norm_``
to the bit, in an op per tensor."""

from __future__ import annotations

import pytest
import torch

from rlloop.learners.gradients import clip_to_norm_, total_norm


def _params(scale: float) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = [(256, 4), (256,), (256, 256), (256,), (2, 256), (2,)]
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    params[2].grad = params[2].grad.t().contiguous().t()  # a non-contiguous gradient
    return params


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_total_norm_and_clip_equal_torch_to_the_bit(scale: float) -> None:
    ours, theirs = _params(scale), _params(scale)
    norm = total_norm([p.grad for p in ours])
    expected = torch.nn.utils.get_total_norm([p.grad for p in theirs])
    assert torch.equal(norm, expected)
    clip_to_norm_(ours, 10.0, norm)
    torch.nn.utils.clip_grads_with_norm_(theirs, 10.0, expected)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.grad, b.grad)
    clipped = bool(expected > 10.0)
    assert clipped == (scale >= 1.0)  # both sides of the threshold are covered


def test_clip_skips_parameters_without_gradient() -> None:
    params = _params(1e3)
    params[0].grad = None
    clip_to_norm_(params, 1.0, total_norm([p.grad for p in params if p.grad is not None]))
    assert params[0].grad is None
    assert float(total_norm([p.grad for p in params if p.grad is not None])) == \
        pytest.approx(1.0, rel=1e-5)
