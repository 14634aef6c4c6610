"""rlloop's ``Adam`` steps exactly as ``torch.optim.Adam(fused=True)``: its own call of the
fused kernel on a CPU gives the same parameters, moments and step counts to the bit, with
skipped steps (``found_inf``), a learning rate a schedule changes, a parameter without a
gradient (torch's path), float64 and a state loaded from a checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rlloop.learners.adam import Adam


def _net(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3)).to(dtype)


def _same(a: torch.optim.Optimizer, b: torch.optim.Optimizer, na: nn.Module,
          nb: nn.Module) -> None:
    for pa, pb in zip(na.parameters(), nb.parameters(), strict=True):
        assert torch.equal(pa, pb)
        sa, sb = a.state[pa], b.state[pb]
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key], sb[key]), key


def _grads(net: nn.Module, step: int, skip_bias: bool = False) -> None:
    g = torch.Generator().manual_seed(step)
    for name, p in net.named_parameters():
        if skip_bias and name == "2.bias":
            p.grad = None
            continue
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_cpu_step_equals_torchs_to_the_bit(dtype: torch.dtype) -> None:
    ours_net, torch_net = _net(dtype), _net(dtype)
    ours = Adam(ours_net.parameters(), lr=1e-3, eps=1e-5, betas=(0.5, 0.999), fused=True)
    theirs = torch.optim.Adam(torch_net.parameters(), lr=1e-3, eps=1e-5, betas=(0.5, 0.999),
                              fused=True)
    flag_ours, flag_theirs = torch.zeros(()), torch.zeros(())
    for opt, flag in ((ours, flag_ours), (theirs, flag_theirs)):
        opt.found_inf, opt.grad_scale = flag, None  # type: ignore[attr-defined]
    direct = 0
    original = ours._fused_cpu_step

    def counted() -> bool:
        nonlocal direct
        took = original()
        direct += took
        return took

    ours._fused_cpu_step = counted  # type: ignore[method-assign]
    for step in range(12):
        skip = float(step in (3, 7))
        flag_ours.fill_(skip)
        flag_theirs.fill_(skip)
        for group in (*ours.param_groups, *theirs.param_groups):
            group["lr"] = 1e-3 * (1 + step % 4)  # as a schedule sets it
        for net in (ours_net, torch_net):
            _grads(net, step, skip_bias=step == 5)
        ours.step()
        theirs.step()
        _same(ours, theirs, ours_net, torch_net)
    assert direct == 10  # all but the first step (no state yet) and the one with a None grad


def test_a_loaded_state_steps_as_torchs() -> None:
    nets = [_net(torch.float32) for _ in range(3)]
    first = Adam(nets[0].parameters(), lr=3e-3, fused=True)
    for step in range(3):
        _grads(nets[0], step)
        first.step()
    ours = Adam(nets[1].parameters(), lr=3e-3, fused=True)
    theirs = torch.optim.Adam(nets[2].parameters(), lr=3e-3, fused=True)
    for net, opt in ((nets[1], ours), (nets[2], theirs)):
        net.load_state_dict(nets[0].state_dict())
        opt.load_state_dict(copy.deepcopy(first.state_dict()))  # (loading shares tensors)
    for step in range(3, 6):
        for net in nets[1:]:
            _grads(net, step)
        ours.step()
        theirs.step()
    _same(ours, theirs, nets[1], nets[2])
