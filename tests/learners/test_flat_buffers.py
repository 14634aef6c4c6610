"""Flat buffers for an optimiser's parameters, gradients and Adam state: the same update
as one tensor per parameter (to the bit without clipping, to float rounding with it), a
skipped update that moves nothing, state that loads back into the layout, and the
per-tensor path wherever the layout has been broken."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rlloop.learners.adam import Adam
from rlloop.learners.flat_buffers import FlatParameters
from rlloop.learners.optim_step import GuardedOptim, GuardedStep


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 2))


def _step(net: nn.Module, max_norm: float | None, flat: bool) -> GuardedStep:
    params = list(net.parameters())
    optimizer = Adam(params, lr=1e-2, fused=True)
    if flat:
        optimizer.use_flat(FlatParameters(params))
    return GuardedStep([GuardedOptim(optimizer, params, max_norm)])


def _write_grads(net: nn.Module, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Write seeded gradients in place (as the hand-derived pass does); their sum."""
    g = torch.Generator().manual_seed(seed)
    total = torch.zeros(())
    for p in net.parameters():
        grad = torch.randn(p.shape, generator=g) * scale
        if p.grad is None:
            p.grad = grad
        else:
            p.grad.copy_(grad)
        total += grad.sum()
    return total


def _moments(step: GuardedStep, net: nn.Module) -> list[torch.Tensor]:
    state = step.optims[0].optimizer.state
    return [t for p in net.parameters() for t in state[p].values()]


@pytest.mark.parametrize("max_norm", [None, 1e6, 0.5])
def test_flat_updates_equal_per_tensor_updates(max_norm):
    plain, flat = _net(), _net()
    ours, theirs = _step(flat, max_norm, True), _step(plain, max_norm, False)
    for i in range(6):
        ours.apply(_write_grads(flat, i))
        theirs.apply(_write_grads(plain, i))
    assert ours.optims[0].flat is not None and ours.optims[0].flat.intact()
    pairs = [*zip(flat.parameters(), plain.parameters(), strict=True),
             *zip(_moments(ours, flat), _moments(theirs, plain), strict=True)]
    if max_norm == 0.5:  # the flat norm sums in another order: float rounding apart
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in pairs)
        assert not all(torch.equal(a, b) for a, b in pairs[:6])  # the clip did act
    else:
        assert all(torch.equal(a, b) for a, b in pairs)


def test_a_non_finite_update_moves_nothing():
    net = _net()
    step = _step(net, 1.0, True)
    step.apply(_write_grads(net, 0))
    before = [t.clone() for t in [*net.parameters(), *_moments(step, net)]]
    _write_grads(net, 1)
    step.apply(torch.tensor(float("inf")))  # the loss (a TD error) was not finite
    assert all(torch.equal(a, b) for a, b in
               zip(before, [*net.parameters(), *_moments(step, net)], strict=True))
    assert step.skipped is not None and float(step.skipped) == 1.0
    next(net.parameters()).grad[0, 0] = float("nan")  # a gradient that is not finite
    step.apply(torch.tensor(0.0))
    assert float(step.skipped) == 2.0


def test_a_loaded_state_lands_in_the_layout_and_steps_on():
    net = _net()
    step = _step(net, 1.0, True)
    for i in range(3):
        step.apply(_write_grads(net, i))
    saved_net, saved_opt = copy.deepcopy(net.state_dict()), copy.deepcopy(
        step.optims[0].optimizer.state_dict())
    for i in range(3, 5):
        step.apply(_write_grads(net, i))
    expected = [t.clone() for t in net.parameters()]
    resumed = _net()
    again = _step(resumed, 1.0, True)
    resumed.load_state_dict(saved_net)
    again.optims[0].optimizer.load_state_dict(saved_opt)
    optimizer = again.optims[0].optimizer
    assert isinstance(optimizer, Adam)
    for p in resumed.parameters():  # the entries are views of the flat moments again
        state = optimizer.state[p]
        assert state["exp_avg"].untyped_storage().data_ptr() == \
            optimizer._exp_avg.untyped_storage().data_ptr()
    for i in range(3, 5):
        again.apply(_write_grads(resumed, i))
    assert all(torch.equal(a, b) for a, b in zip(expected, resumed.parameters(), strict=True))


def test_a_broken_layout_takes_the_per_tensor_path():
    plain, flat = _net(), _net()
    ours, theirs = _step(flat, 1.0, True), _step(plain, 1.0, False)
    ours.apply(_write_grads(flat, 0))
    theirs.apply(_write_grads(plain, 0))
    for p in flat.parameters():  # e.g. zero_grad(set_to_none=True) between updates
        p.grad = None
    layout = ours.optims[0].flat
    assert layout is not None and not layout.intact()
    ours.apply(_write_grads(flat, 1))
    theirs.apply(_write_grads(plain, 1))
    for a, b in zip(flat.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    layout.restore()
    assert layout.intact()
    ours.apply(_write_grads(flat, 2))
    theirs.apply(_write_grads(plain, 2))
    for a, b in zip(flat.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_step_counts_that_part_keep_the_per_tensor_path():
    plain, flat = _net(), _net()
    ours, theirs = _step(flat, None, True), _step(plain, None, False)
    for net, step in ((flat, ours), (plain, theirs)):
        step.apply(_write_grads(net, 0))
        for p in net.parameters():  # one update where the last bias gets no gradient
            p.grad = None
        _write_grads(net, 1)
        list(net.parameters())[-1].grad = None
        step.apply(torch.tensor(0.0))
    layout = ours.optims[0].flat
    assert layout is not None
    layout.restore()
    for i in range(2, 4):
        ours.apply(_write_grads(flat, i))
        theirs.apply(_write_grads(plain, i))
    optimizer = ours.optims[0].optimizer
    assert isinstance(optimizer, Adam) and not optimizer._steps_agree
    for a, b in zip(flat.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
