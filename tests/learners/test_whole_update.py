"""The whole-graph compiled update equals the eager one: autograd, per-optimiser global-norm
clipping, fused Adam, the non-finite skip, scheduled learning rates, optimiser state that a
checkpoint load replaces. One compiled instance serves every check (compiling takes
seconds on a small CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn
from torch.testing import assert_close

from rlloop.learners.optim_step import GuardedOptim, GuardedStep, adam
from rlloop.learners.whole_update import WholeUpdate


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


def _loss(net: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    out = net(x)  # one loss, two optimisers (body clipped, head not)
    loss = ((out - y) ** 2).mean()
    return loss, out.detach().mean()


def _learner(net: TwoHeads) -> GuardedStep:
    body, head = list(net.body.parameters()), list(net.head.parameters())
    return GuardedStep([GuardedOptim(adam(body, 0.05), body, max_grad_norm=0.5),
                        GuardedOptim(adam(head, 0.02), head, max_grad_norm=None)])


def _eager_update(net: TwoHeads, step: GuardedStep, x: Tensor, y: Tensor) -> Tensor:
    loss, aux = _loss(net, x, y)
    step(loss)
    return aux


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_the_whole_update_equals_the_eager_update_skips_and_follows_state(device):
    torch.manual_seed(0)
    net = TwoHeads().to(device)
    twin = copy.deepcopy(net)
    eager_step, whole_step = _learner(net), _learner(twin)
    whole = WholeUpdate(twin, _loss, whole_step)
    assert WholeUpdate.unsupported(twin, whole_step) is None
    batches = [(torch.randn(32, 3, device=device), torch.randn(32, 2, device=device) * 4)
               for _ in range(6)]
    nan_batch = (batches[0][0], torch.full((32, 2), float("nan"), device=device))

    def both(x: Tensor, y: Tensor) -> None:
        assert_close(whole(x, y), _eager_update(net, eager_step, x, y))
        for p, q in zip(net.parameters(), twin.parameters(), strict=True):
            assert_close(q, p, rtol=1e-4, atol=1e-4)  # Adam: a tiny gradient's sign
        for a, b in zip(eager_step.optims, whole_step.optims, strict=True):
            for p, q in zip(a.params, b.params, strict=True):
                sa, sb = a.optimizer.state[p], b.optimizer.state[q]
                assert sb["step"].dtype == sa["step"].dtype and sb["step"].shape == ()
                for key in ("step", "exp_avg", "exp_avg_sq"):
                    assert_close(sb[key], sa[key], rtol=1e-4, atol=1e-6)
        assert_close(whole_step.flag, eager_step.flag)
        assert_close(whole_step.skipped, eager_step.skipped)

    with torch._dynamo.config.patch(error_on_recompile=True):
        both(*batches[0])
        both(*batches[1])  # gradients large enough that the body's clip acts
        before = [p.clone() for p in twin.parameters()]
        both(*nan_batch)  # skipped: nothing moves, the flag rises, the count goes up
        assert whole_step.flag.item() == 1.0 and whole_step.skipped.item() == 1.0
        assert all(torch.equal(p, q) for p, q in zip(before, twin.parameters(), strict=True))
        for opt in (eager_step.optims[1].optimizer, whole_step.optims[1].optimizer):
            opt.param_groups[0]["lr"] = 0.003  # a schedule's move: no recompilation
        both(*batches[2])
        # A checkpoint load puts new state tensors in the optimisers: the next update
        # must read and write those, not the ones it saw first.
        for o_eager, o_whole in zip(eager_step.optims, whole_step.optims, strict=True):
            saved = copy.deepcopy(o_eager.optimizer.state_dict())
            o_eager.optimizer.load_state_dict(saved)
            o_whole.optimizer.load_state_dict(copy.deepcopy(saved))
        for p, q in zip(net.parameters(), twin.parameters(), strict=True):
            with torch.no_grad():
                q.copy_(p)
        for x, y in batches[3:]:
            both(x, y)
    assert whole_step.flag.item() == 0.0


def test_an_idle_part_s_optimiser_is_left_as_it_is_and_gets_no_state():
    """TD3's actor between delayed updates: no step, no moments, no step count."""
    torch.manual_seed(1)
    net = TwoHeads()
    step = _learner(net)
    head = [p.clone() for p in net.head.parameters()]
    body = [p.clone() for p in net.body.parameters()]
    WholeUpdate(net, _loss, step, backend="eager")(torch.randn(8, 3), torch.randn(8, 2),
                                                   idle=net.head)
    assert not step.optims[1].optimizer.state
    assert all(torch.equal(p, q) for p, q in zip(head, net.head.parameters(), strict=True))
    assert not any(torch.equal(p, q) for p, q in zip(body, net.body.parameters(), strict=True))


def test_each_instance_has_its_own_compile_budget():
    """Learners of other shapes in one process (a sweep, a notebook) each compile their
    own graph: sharing one function, the second would exceed a budget of one version
    (torch's default is 8), a hard error under fullgraph."""
    with torch._dynamo.config.patch(recompile_limit=1):
        for rows in (4, 5):
            net = TwoHeads()
            WholeUpdate(net, _loss, _learner(net), backend="eager")(torch.randn(rows, 3),
                                                                    torch.randn(rows, 2))


def test_freezing_a_parameter_makes_the_update_stale():
    net = TwoHeads()
    whole = WholeUpdate(net, _loss, _learner(net))
    assert not whole.stale()
    net.head.bias.requires_grad_(False)
    assert whole.stale()


def test_only_fused_plain_adam_over_exactly_the_module_is_supported():
    net = TwoHeads()
    assert WholeUpdate.unsupported(net, _learner(net)) is None
    params = list(net.parameters())
    not_adam = "not a fused Adam"
    for optimizer in (torch.optim.SGD(params, lr=0.1),
                      torch.optim.Adam(params, weight_decay=0.1, fused=True),
                      torch.optim.Adam(params, foreach=True)):
        step = GuardedStep([GuardedOptim(optimizer, params)])
        assert not_adam in str(WholeUpdate.unsupported(net, step))
    body = list(net.body.parameters())
    assert "exactly the module's" in str(WholeUpdate.unsupported(
        net, GuardedStep([GuardedOptim(adam(body, 0.1), body)])))
    net.head.register_full_backward_pre_hook(lambda *_: None)
    assert "hook" in str(WholeUpdate.unsupported(net, _learner(net)))
    net = TwoHeads()
    handle = nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert "hook" in str(WholeUpdate.unsupported(net, _learner(net)))
    finally:
        handle.remove()
    assert WholeUpdate.unsupported(net, _learner(net)) is None
