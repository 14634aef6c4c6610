"""The learner: optimiser registry, schedules, gradient clipping, minibatches, state."""

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from rlloop.config.gradient_clip import GradientClip, LearnerError
from rlloop.config.schedules import Cosine, Exponential, Linear, PiecewiseLinear, make_schedule
from rlloop.data.batch import TensorBatch
from rlloop.learners.gradients import clip_gradients
from rlloop.learners.learner import Learner


@dataclass(frozen=True)
class XY(TensorBatch):
    x: Tensor
    y: Tensor


class MSELearner(Learner[XY]):
    def configure_optimizers_for_module(self, module_id, config):
        params = list(self.modules[module_id].parameters())
        self.register_optimizer(module_id, "default", torch.optim.SGD(params, lr=0.1), params,
                                config.get("lr", 0.1), GradientClip(config.get("clip")))

    def compute_loss_for_module(self, module_id, config, batch):
        pred = self.modules[module_id](batch.x).squeeze(-1)
        loss = (pred - batch.y).pow(2).mean()
        return loss, {"losses/mse": loss.detach()}


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return XY(x, x @ torch.tensor([1.0, -2.0, 0.5]))


def _learner(ids=("a",), **cfg):
    torch.manual_seed(0)
    return MSELearner({i: nn.Linear(3, 1) for i in ids}, cfg)


def test_learns_a_linear_map_with_minibatch_epochs():
    learner = _learner()
    data = {"a": _data()}
    first = learner.update_from_batch(data, num_epochs=1, minibatch_size=16)["losses/mse"]
    for _ in range(20):
        last = learner.update_from_batch(data, num_epochs=2, minibatch_size=16)["losses/mse"]
    assert last < 0.01 * first
    assert learner.weights_seq_no == 21


def test_minibatch_count_and_early_stop():
    learner = _learner()
    out = learner.update_from_batch({"a": _data(64)}, num_epochs=3, minibatch_size=16)
    assert out["learner/minibatch_updates"] == 12
    out = learner.update_from_batch({"a": _data(64)}, num_epochs=3, minibatch_size=16,
                                    stop=lambda stats: True)
    assert out["learner/minibatch_updates"] == 1


def _grads():
    p1 = torch.zeros(2, requires_grad=True)
    p2 = torch.zeros(1, requires_grad=True)
    p1.grad = torch.tensor([3.0, 4.0])  # norm 5
    p2.grad = torch.tensor([12.0])  # norm 12; global norm 13
    return [p1, p2]


def test_clip_by_global_norm():
    params = _grads()
    norm = clip_gradients(params, GradientClip(6.5, "global_norm"))
    assert float(norm) == pytest.approx(13.0)
    torch.testing.assert_close(params[0].grad, torch.tensor([1.5, 2.0]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(params[1].grad, torch.tensor([6.0]), rtol=1e-5, atol=1e-5)


def test_clip_by_norm_per_tensor():
    params = _grads()
    clip_gradients(params, GradientClip(6.0, "norm"))
    torch.testing.assert_close(params[0].grad, torch.tensor([3.0, 4.0]))  # 5 < 6: untouched
    torch.testing.assert_close(params[1].grad, torch.tensor([6.0]), rtol=1e-5, atol=1e-5)


def test_clip_by_value():
    params = _grads()
    clip_gradients(params, GradientClip(3.5, "value"))
    torch.testing.assert_close(params[0].grad, torch.tensor([3.0, 3.5]))
    torch.testing.assert_close(params[1].grad, torch.tensor([3.5]))


def test_bad_clip_settings_raise():
    with pytest.raises(LearnerError, match="global_norm, norm or value"):
        GradientClip(1.0, "bogus")  # type: ignore[arg-type]
    with pytest.raises(LearnerError, match="> 0"):
        GradientClip(0.0)


def test_lr_follows_schedule_on_env_steps():
    learner = _learner(lr={"type": "linear", "start": 1.0, "end": 0.0, "steps": 100})
    opt = learner.get_optimizer("a")
    for steps, expected in [(0, 1.0), (25, 0.75), (100, 0.0), (200, 0.0)]:
        rates = learner.before_gradient_based_update(steps)
        assert opt.param_groups[0]["lr"] == pytest.approx(expected)
        assert rates["a/lr_default"] == pytest.approx(expected)


def test_schedule_kinds():
    assert Linear(1.0, 0.0, 10)(5) == pytest.approx(0.5)
    assert PiecewiseLinear(((0, 1.0), (10, 0.0), (20, 0.5)))(15) == pytest.approx(0.25)
    assert Cosine(1.0, 0.0, 10)(5) == pytest.approx(0.5)
    assert Exponential(1.0, 0.5, 10)(20) == pytest.approx(0.25)
    assert make_schedule(0.3)(10**9) == 0.3


def test_policies_to_train_leaves_others_bit_identical():
    learner = _learner(("a", "b"))
    learner.set_policies_to_train(["a"])
    before = {k: v.clone() for k, v in learner.modules["b"].state_dict().items()}
    data = _data()
    learner.update_from_batch({"a": data, "b": data}, num_epochs=2, minibatch_size=8)
    for k, v in learner.modules["b"].state_dict().items():
        assert torch.equal(v, before[k])
    learner.set_policies_to_train(lambda mid: mid == "b")
    learner.update_from_batch({"a": data, "b": data})
    assert not torch.equal(learner.modules["b"].weight, before["weight"])


def test_add_and_remove_module_leave_nothing_behind():
    learner = _learner(("a",))
    learner.add_module("b", nn.Linear(3, 1))
    assert set(learner.get_optimizers_for_module("b")) == {"default"}
    learner.update_from_batch({"a": _data(), "b": _data()})
    learner.remove_module("b")
    assert "b" not in learner.modules
    assert all(m != "b" for m, _ in learner._optims)
    with pytest.raises(LearnerError, match="unknown module 'b'"):
        learner.update_from_batch({"b": _data()})
    with pytest.raises(LearnerError, match="no optimizer a/adam"):
        learner.get_optimizer("a", "adam")


def test_register_optimizer_rejects_non_tensor_params():
    learner = _learner()
    with pytest.raises(LearnerError, match="list of tensors"):
        learner.register_optimizer("a", "x", torch.optim.SGD([torch.zeros(1)], lr=1), ["w"], 1.0)


def test_get_state_components_and_roundtrip():
    learner = _learner()
    learner.update_from_batch({"a": _data()})
    assert set(learner.get_state(components="module")) == {"module"}
    assert "module" not in learner.get_state(not_components=["module"])
    with pytest.raises(LearnerError, match="unknown state components"):
        learner.get_state(components="nope")
    state = learner.get_state()
    other = _learner()
    other.set_state(state)
    for a, b in zip(learner.modules.parameters(), other.modules.parameters(), strict=True):
        assert torch.equal(a, b)
    assert other.weights_seq_no == learner.weights_seq_no
    # a newer weights_seq_no wins: stale state does not roll the counter back
    other.weights_seq_no = 99
    other.set_state({"weights_seq_no": 1})
    assert other.weights_seq_no == 99


def test_nonfinite_loss_gradient_or_batch_is_skipped_and_counted():
    learner = _learner()
    before = [p.clone() for p in learner.modules.parameters()]
    bad = _data()
    bad.x[3, 1] = float("nan")
    out = learner.update_from_batch({"a": bad})
    assert out["guard/skipped_updates"] == 1
    huge = XY(torch.full((8, 3), 1e30), torch.full((8,), -1e30))  # loss overflows to inf
    learner.update_from_batch({"a": huge})
    assert learner.skipped_updates == 2
    for p, q in zip(before, learner.modules.parameters(), strict=True):
        assert torch.equal(p, q)  # weights never moved, never NaN
    learner.update_from_batch({"a": _data()})
    assert all(torch.isfinite(p).all() for p in learner.modules.parameters())


def test_nonfinite_raise_names_the_step():
    from rlloop.learners.nonfinite import NonFiniteError

    torch.manual_seed(0)
    learner = MSELearner({"a": nn.Linear(3, 1)}, {}, on_nonfinite="raise")
    learner.env_steps = 1234
    bad = _data()
    bad.y[0] = float("inf")
    with pytest.raises(NonFiniteError, match="env step 1234"):
        learner.update_from_batch({"a": bad})


class FusedAdamLearner(MSELearner):
    def configure_optimizers_for_module(self, module_id, config):
        params = list(self.modules[module_id].parameters())
        self.register_optimizer(module_id, "default",
                                torch.optim.Adam(params, lr=0.01, fused=True), params, 0.01)


def _host_reads(fn) -> int:
    """How many scalar reads (``bool(t)``, ``t.item()``: host syncs on a GPU) ``fn`` makes
    outside the metrics logger (which converts its values when a record is written, all
    in one read on a GPU; one ``item()`` each on the CPU, where there is no sync to save)."""
    import traceback

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and not any(
                    f.filename.endswith("logging/metrics.py") for f in traceback.extract_stack()):
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def test_fused_adam_skips_a_nonfinite_step_on_the_device():
    """``Adam(fused=True)`` skips a non-finite step itself (``found_inf``): the learner
    reads no flag per minibatch, yet the skipped step moves nothing, is counted, and its
    non-finite stats stay out of the means; the other minibatches train as they would."""
    good = _data(48)
    huge = XY(torch.full((16, 3), 1e30), torch.full((16,), -1e30))  # its loss is inf
    mixed = XY(torch.cat([good.x[:16], huge.x, good.x[16:]]),
               torch.cat([good.y[:16], huge.y, good.y[16:]]))
    torch.manual_seed(0)
    learner = FusedAdamLearner({"a": nn.Linear(3, 1)}, {})
    out = learner.update_from_batch({"a": mixed}, minibatch_size=16,
                                    shuffle_batch_per_epoch=False)
    torch.manual_seed(0)
    clean = FusedAdamLearner({"a": nn.Linear(3, 1)}, {})
    expected = clean.update_from_batch({"a": good}, minibatch_size=16,
                                       shuffle_batch_per_epoch=False)
    assert learner.skipped_updates == 1 and out["guard/skipped_updates"] == 1
    assert out["losses/mse"] == pytest.approx(expected["losses/mse"])
    for p, q in zip(learner.modules.parameters(), clean.modules.parameters(), strict=True):
        assert torch.equal(p, q)
    assert clean.get_optimizer("a", "default").state_dict()["state"][0]["step"] == 3
    assert learner.get_optimizer("a", "default").state_dict()["state"][0]["step"] == 3

    def update(minibatch_size):
        return lambda: clean.update_from_batch({"a": good}, minibatch_size=minibatch_size)

    assert _host_reads(update(48)) == _host_reads(update(6))  # 1 minibatch or 8: no more reads


def test_raise_mode_and_plain_optimisers_read_the_flag_per_minibatch():
    """The host read stays where it must decide: ``on_nonfinite="raise"`` stops at the bad
    minibatch, and optimisers without ``found_inf`` (SGD) skip by the read."""
    torch.manual_seed(0)
    learner = FusedAdamLearner({"a": nn.Linear(3, 1)}, {}, on_nonfinite="raise")
    assert learner._skip_on_device(list(learner._optims.items()), torch.tensor(True)) is None
    sgd = _learner()
    assert sgd._skip_on_device(list(sgd._optims.items()), torch.tensor(True)) is None
