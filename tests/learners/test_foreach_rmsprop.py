"""ForeachRMSprop: torch's RMSprop to the bit, with its step run on flat state where it may.

The reference is rlloop's ``RMSprop``: torch's, without the import of ``torch._dynamo``
that ``torch.optim.RMSprop``'s first step makes (a second or more)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from rlloop.learners.adam import RMSprop
from rlloop.learners.foreach_rmsprop import ForeachRMSprop


def _params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 4), (64,), (64, 64), (64,), (2, 64), (2,), (3,)]
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


def _steps(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], n: int,
           seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params[:-1]:  # the last one never has a gradient: skipped by both
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()


@pytest.mark.parametrize("options", [{}, {"momentum": 0.9}, {"centered": True},
                                     {"weight_decay": 0.1}])
def test_steps_equal_torch_rmsprop_to_the_bit(options: dict[str, Any]) -> None:
    ours, theirs = _params(), _params()
    kwargs = {"lr": 7e-4, "alpha": 0.99, "eps": 1e-5, "foreach": True, **options}
    ours_opt = ForeachRMSprop(ours, **kwargs)
    theirs_opt = RMSprop(theirs, **kwargs)
    _steps(ours_opt, ours, 5)
    _steps(theirs_opt, theirs, 5)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(ours[:-1], theirs[:-1], strict=True):
        for key in ("square_avg", "step"):
            assert torch.equal(ours_opt.state[a][key], theirs_opt.state[b][key])
    assert ours[-1] not in ours_opt.state


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flat_steps_equal_torch_as_the_parameters_with_gradients_change(
        dtype: torch.dtype) -> None:
    """Parameters that lose or gain a gradient between steps make the flat state anew;
    every step and state stays torch's (foreach or not), whatever the tensors' sizes."""
    ours = [p.detach().to(dtype).requires_grad_() for p in _params()]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    ours_opt = ForeachRMSprop(ours, lr=7e-4, alpha=0.99, eps=1e-5, foreach=True)
    theirs_opt = RMSprop(theirs, lr=7e-4, alpha=0.99, eps=1e-5, foreach=False)
    g = torch.Generator().manual_seed(4)
    for step in range(12):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            has_grad = i != step % 3 or step < 2  # from the third step on, one has none
            a.grad = b.grad = None
            if has_grad:  # gradients of very different scales
                grad = torch.randn(a.shape, generator=g, dtype=dtype) * 10.0 ** (step % 7 - 4)
                a.grad, b.grad = grad.clone(), grad.clone()
        ours_opt.step()
        theirs_opt.step()
        if step >= 1:
            assert ours_opt._flat is not None  # the flat step ran
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)
            if b in theirs_opt.state:
                for key in ("square_avg", "step"):
                    assert torch.equal(ours_opt.state[a][key], theirs_opt.state[b][key])


def test_the_plain_step_runs_flat_and_resumes_from_a_state_dict() -> None:
    params = _params()
    optimizer = ForeachRMSprop(params, lr=1e-3, foreach=True)
    assert optimizer._plain_step_state() is None  # no state yet: torch's first step
    _steps(optimizer, params, 1)
    flat = optimizer._plain_step_state()
    assert flat is not None  # the state is now views of flat tensors, with the same values
    assert optimizer.state[params[0]]["square_avg"]._base is flat.square_avg
    copy, twin = [p.detach().clone().requires_grad_() for p in params], _params()
    restored = ForeachRMSprop(copy, lr=1e-3, foreach=True)
    restored.load_state_dict(optimizer.state_dict())
    reference = RMSprop(twin, lr=1e-3, foreach=True)
    _steps(reference, twin, 1)
    _steps(restored, copy, 3, seed=2)
    _steps(reference, twin, 3, seed=2)
    for a, b in zip(copy, twin, strict=True):
        assert torch.equal(a, b)
    # a state loaded into an optimiser that has stepped flat replaces its flat state
    restored.load_state_dict(reference.state_dict())
    _steps(restored, copy, 2, seed=3)
    _steps(reference, twin, 2, seed=3)
    for a, b in zip(copy, twin, strict=True):
        assert torch.equal(a, b)


def test_a_copy_steps_on_flat_state_of_its_own() -> None:
    params = _params()
    optimizer = ForeachRMSprop(params, lr=1e-3, foreach=True)
    _steps(optimizer, params, 2)
    twin = copy.deepcopy(optimizer)  # torch copies defaults, state and groups only
    twin_params = twin.param_groups[0]["params"]  # copies of the parameters
    _steps(optimizer, params, 2, seed=5)
    _steps(twin, twin_params, 2, seed=5)
    assert twin._flat is not None and optimizer._flat is not None
    assert twin._flat.square_avg is not optimizer._flat.square_avg
    for a, b in zip(params, twin_params, strict=True):
        assert torch.equal(a, b)


def test_step_hooks_run_around_the_direct_step_and_a_closure_takes_torchs() -> None:
    params = _params()
    optimizer = ForeachRMSprop(params, lr=1e-3, foreach=True)
    _steps(optimizer, params, 1)
    heard: list[int] = []
    handle = optimizer.register_step_post_hook(lambda *_: heard.append(1))
    assert optimizer._plain_step_state() is not None
    _steps(optimizer, params, 2)
    handle.remove()
    assert heard == [1, 1]
    assert optimizer.step(lambda: 3.0) == 3.0
