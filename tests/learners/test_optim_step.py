"""The off-policy optimiser step: public torch API, the same arithmetic as
``clip_grad_norm_`` + ``Adam.step``, a non-finite update skipped on the device, and
optimisation steps that never wait on the device."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from rlloop.algorithms.offpolicy_parts import MeanRecorder
from rlloop.config.loading import build_config
from rlloop.learners.optim_step import GuardedOptim, GuardedStep, adam
from rlloop.runs.build import build_algorithm


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))


def _state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t.clone() for s in opt.state.values() for t in s.values()]


@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_step_is_bit_identical_to_clip_grad_norm_and_adam(max_norm):
    net = _net()
    twin = copy.deepcopy(net)
    reference = torch.optim.Adam(net.parameters(), lr=1e-2, fused=True)
    params = list(twin.parameters())
    step = GuardedStep([GuardedOptim(adam(params, 1e-2), params, max_norm)])
    x = torch.randn(32, 3)
    for _ in range(4):
        reference.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)
        reference.step()
        step(twin(x).square().mean())
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    theirs, ours = _state(reference), _state(step.optims[0].optimizer)
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))


@pytest.mark.parametrize("fault", ["loss", "gradient"])
def test_a_non_finite_update_moves_nothing_and_is_counted(fault):
    net = _net()
    params = list(net.parameters())
    step = GuardedStep([GuardedOptim(adam(params, 1e-2), params, 1.0)])
    x = torch.randn(8, 3)
    step(net(x).square().mean())  # Adam has state now: a skipped step must not touch it
    before, moments = [p.detach().clone() for p in params], _state(step.optims[0].optimizer)
    if fault == "loss":
        bad = net(x).square().mean() * float("nan")
    else:  # a finite loss (sqrt(0) = 0) with an infinite gradient: the clip's norm sees it
        bad = net(x).square().mean() + (params[1] - params[1].detach()).abs().sqrt().sum()
        assert torch.isfinite(bad)
    step(bad)
    assert step.skipped is not None and step.skipped.item() == 1
    assert all(torch.equal(p, q) for p, q in zip(params, before, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(moments, _state(step.optims[0].optimizer),
                                                 strict=True))
    step(net(x).square().mean())  # the next finite update steps again
    assert not all(torch.equal(p, q) for p, q in zip(params, before, strict=True))
    assert step.skipped.item() == 1 and math.isfinite(float(step.flag))


def test_optimisers_without_a_device_skip_read_the_flag():
    net = _net()
    params = list(net.parameters())
    step = GuardedStep([GuardedOptim(torch.optim.SGD(params, lr=0.1), params)])
    before = [p.detach().clone() for p in params]
    step(net(torch.randn(4, 3)).sum() * float("inf"))
    assert step.skipped is not None and step.skipped.item() == 1
    assert all(torch.equal(p, q) for p, q in zip(params, before, strict=True))


def test_an_optimiser_whose_parameters_got_no_gradient_does_not_step():
    actor, critic = nn.Linear(3, 1), nn.Linear(3, 1)
    a, c = list(actor.parameters()), list(critic.parameters())
    step = GuardedStep([GuardedOptim(adam(a, 1e-2), a), GuardedOptim(adam(c, 1e-2), c)])
    before = [p.detach().clone() for p in a]
    step(critic(torch.randn(4, 3)).sum())  # TD3 between delayed actor updates
    assert all(torch.equal(p, q) for p, q in zip(a, before, strict=True))
    assert not step.optims[0].optimizer.state  # Adam never stepped the actor


def test_the_skip_survives_load_state_dict():
    net = _net()
    params = list(net.parameters())
    step = GuardedStep([GuardedOptim(adam(params, 1e-2), params)])
    x = torch.randn(4, 3)
    step(net(x).sum())
    opt = step.optims[0].optimizer
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # as a checkpoint restore does
    before = [p.detach().clone() for p in params]
    step(net(x).sum() * float("nan"))
    assert all(torch.equal(p, q) for p, q in zip(params, before, strict=True))


# ---- no host sync: an optimisation step never reads a tensor's value on the host


class HostReads(TorchFunctionMode):
    """Records every conversion of a tensor to a Python value (a device sync on GPUs)."""

    READS = frozenset({"item", "tolist", "numpy", "__bool__", "__float__", "__int__",
                       "__index__"})

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("name", "env", "extra"), [
    ("dqn", "CartPole-v1", []), ("dqn", "CartPole-v1", ["dqn.manual_backward=true"]),
    ("dqn", "CartPole-v1", ["dqn.double_q=true"]),  # not prioritized: its tree is on the host
    ("sac", "Pendulum-v1", []), ("td3", "Pendulum-v1", [])])
def test_optimisation_steps_read_nothing_from_the_device(name, env, extra):
    algo = build_algorithm(build_config(name, env, sets=[
        "mlflow=false", "progress=false", "num_envs=1", f"{name}.learning_starts=20",
        f"{name}.batch_size=16", f"{name}.hidden=[16]", f"{name}.gradient_steps=4", *extra]))
    for _ in range(40):
        algo.env_step()
    recorder = MeanRecorder()
    with HostReads() as mode:
        for _ in range(3):
            stats = algo.optimize(40)
            assert stats is not None
            recorder.add(stats)
    assert mode.reads == []
    assert algo.learner.updates == 12
    record = recorder.pop()  # the record is where values reach the host
    assert record["guard/skipped_updates"] == 0 and math.isfinite(record[
        "losses/q" if name == "dqn" else "losses/critic"])


def test_mean_recorder_averages_finite_values_per_stat():
    recorder = MeanRecorder()
    recorder.add({"a": torch.tensor(1.0), "b": torch.tensor(float("nan")), "n": 2})
    recorder.add({"a": torch.tensor(3.0), "b": torch.tensor(4.0), "n": 4})
    recorder.add({"a": torch.tensor(float("inf")), "b": torch.tensor(8.0), "n": 6})
    recorder.add({"a": torch.tensor(5.0), "c": torch.tensor(1.0, dtype=torch.float64)})
    assert recorder.pop() == {"a": 3.0, "b": 6.0, "n": 4.0, "c": 1.0}  # 5 joins a's sum
    assert recorder.pop() == {}
    recorder.add({"b": torch.tensor(float("nan"))})
    assert recorder.pop() == {}  # no finite value: no stat
