"""The learner in full: losses with fwd_out, update_from_*, hyperparameter schedules,
gradient post-processing end to end, module add/remove, state components, checkpoints."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from rlloop.checkpoint import load_checkpoint, save_checkpoint
from rlloop.config.gradient_clip import GradientClip, LearnerError
from rlloop.data.batch import TensorBatch
from rlloop.errors import ConfigError
from rlloop.learners.learner import Learner, UnknownModuleError
from rlloop.learners.learner_state import STATE_COMPONENTS


@dataclass(frozen=True)
class XY(TensorBatch):
    x: Tensor
    y: Tensor


@dataclass
class Cfg:
    lr: float | dict = 0.1
    clip: float | None = None
    clip_by: str = "global_norm"
    optim: str = "sgd"
    temperature: float | dict = 1.0


class Regression(Learner[XY]):
    """MSE regression; ``forward_train`` computes predictions the loss then reuses."""

    forward_calls = 0

    def configure_optimizers_for_module(self, module_id, config):
        params = list(self.modules[module_id].parameters())
        opt = (torch.optim.Adam(params, lr=0.1) if config.optim == "adam"
               else torch.optim.SGD(params, lr=0.1))
        self.register_optimizer(module_id, "default", opt, params, config.lr,
                                GradientClip(config.clip, config.clip_by))
        self.register_hyperparameter(module_id, "temperature", config.temperature)

    def forward_train(self, module_id, batch):
        Regression.forward_calls += 1
        return self.modules[module_id](batch.x).squeeze(-1)

    def compute_loss_for_module(self, module_id, config, batch, fwd_out=None):
        loss = (fwd_out - batch.y).pow(2).mean()
        return loss, {"losses/mse": loss.detach()}

    def build_batch(self, episodes):
        out: dict[str, list[XY]] = {}
        for module_id, xy in episodes:
            out.setdefault(module_id, []).append(xy)
        return {m: XY(torch.cat([e.x for e in es]), torch.cat([e.y for e in es]))
                for m, es in out.items()}


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return XY(x, x @ torch.tensor([1.0, -2.0, 0.5]))


def _learner(ids=("a",), cfg=None, **kwargs):
    torch.manual_seed(0)
    return Regression({i: nn.Linear(3, 1) for i in ids}, cfg or Cfg(), **kwargs)


# ---- losses and update entry points --------------------------------------------------------
def test_forward_output_reaches_the_loss_and_losses_are_summed():
    learner = _learner(("a", "b"))
    data = _data()
    mb = {"a": data, "b": data}
    fwd = {m: learner.forward_train(m, mb[m]) for m in mb}
    losses, stats = learner.compute_losses(mb, fwd)
    assert set(losses) == {"a", "b"}
    assert set(stats) == {"a/losses/mse", "b/losses/mse"}
    # one step on the sum moves each module exactly as a step on its own loss would
    alone = _learner(("a", "b"))
    alone.set_policies_to_train(["a"])
    calls = Regression.forward_calls
    learner.update_minibatch(mb)
    assert Regression.forward_calls == calls + 2  # one forward per module and step
    alone.update_minibatch({"a": data})
    assert torch.equal(learner.modules["a"].weight, alone.modules["a"].weight)


def test_update_from_iterator_takes_num_iters_steps():
    learner = _learner()
    batches = ({"a": _data(16, seed=s)} for s in itertools.count())
    out = learner.update_from_iterator(batches, num_iters=5)
    assert out["learner/minibatch_updates"] == 5
    assert learner.weights_seq_no == 1
    out = learner.update_from_iterator([{"a": _data(16)}] * 3)
    assert out["learner/minibatch_updates"] == 3
    assert learner.weights_seq_no == 2


def test_update_from_episodes_builds_the_batch_with_the_hook():
    learner = _learner(("a", "b"))
    episodes = [("a", _data(8, 1)), ("b", _data(8, 2)), ("a", _data(8, 3))]
    out = learner.update_from_episodes(episodes, num_epochs=2, minibatch_size=8)
    assert out["learner/minibatch_updates"] == 4  # 16 samples of "a" in 2 minibatches x 2
    assert out["a/num_samples_trained_lifetime"] == 32
    assert out["b/num_samples_trained_lifetime"] == 16
    assert learner.weights_seq_no == 1


def test_learner_without_build_batch_says_so():
    class Plain(Learner[XY]):
        def configure_optimizers_for_module(self, module_id, config):
            pass

    with pytest.raises(LearnerError, match="override build_batch"):
        Plain({}, None).update_from_episodes([1, 2])


def test_batch_naming_an_unknown_module_is_a_typed_error():
    learner = _learner()
    for call in (lambda: learner.update_from_batch({"zz": _data()}),
                 lambda: learner.update_from_iterator([{"zz": _data()}])):
        with pytest.raises(UnknownModuleError, match=r"unknown module 'zz'.*\['a'\]"):
            call()
    assert learner.weights_seq_no == 0


# ---- schedules -----------------------------------------------------------------------------
SCHEDULES = {
    "constant": (0.3, {0: 0.3, 10**6: 0.3}),
    "linear": ({"type": "linear", "start": 1.0, "end": 0.0, "steps": 100},
               {0: 1.0, 25: 0.75, 100: 0.0, 500: 0.0}),
    "piecewise": ({"type": "piecewise", "points": [[0, 1.0], [100, 0.5], [300, 0.1]]},
                  {0: 1.0, 50: 0.75, 200: 0.3, 1000: 0.1}),
    "cosine": ({"type": "cosine", "start": 1.0, "end": 0.0, "steps": 100},
               {0: 1.0, 50: 0.5, 100: 0.0}),
    "exponential": ({"type": "exponential", "start": 1.0, "decay": 0.5, "steps": 100},
                    {0: 1.0, 100: 0.5, 200: 0.25}),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_lr_and_hyperparameters_follow_schedules_on_env_steps(kind):
    spec, expected = SCHEDULES[kind]
    learner = _learner(cfg=Cfg(lr=spec, temperature=spec))
    opt = learner.get_optimizer("a")
    for steps, value in expected.items():
        out = learner.update_from_batch({"a": _data(8)}, env_steps=steps)
        assert opt.param_groups[0]["lr"] == pytest.approx(value)
        assert learner.hyperparameter("a", "temperature") == pytest.approx(value)
        assert out["learner/lr_default"] == pytest.approx(value)  # logged with each update
        assert out["learner/temperature"] == pytest.approx(value)


def test_unknown_hyperparameter_and_bad_schedule():
    learner = _learner()
    with pytest.raises(LearnerError, match="no hyperparameter a/epsilon"):
        learner.hyperparameter("a", "epsilon")
    with pytest.raises(ValueError, match="unknown schedule type"):
        learner.register_hyperparameter("a", "epsilon", {"type": "zigzag"})


def test_ppo_entropy_and_clip_coefficients_are_scheduled():
    from rlloop.algorithms.ppo import PPOLearner
    from rlloop.config.ppo import PPOConfig
    from rlloop.data.rollout import RolloutBatch
    from rlloop.envs.core import Discrete
    from rlloop.modules.actor_critic import ActorCritic

    cfg = PPOConfig(ent_coef={"type": "linear", "start": 0.5, "end": 0.0, "steps": 100},
                    clip_coef={"type": "piecewise", "points": [[0, 0.3], [100, 0.1]]})
    torch.manual_seed(0)
    learner = PPOLearner({"default_policy": ActorCritic((4,), Discrete(2))}, cfg)
    g = torch.Generator().manual_seed(0)
    batch = RolloutBatch(torch.randn(32, 4, generator=g), torch.randint(2, (32,), generator=g),
                         torch.full((32,), -0.7), torch.randn(32, generator=g),
                         torch.randn(32, generator=g), torch.zeros(32))
    losses = {}
    for steps in (0, 50):
        learner.before_gradient_based_update(steps)
        loss, stats = learner.compute_loss_for_module("default_policy", cfg, batch)
        losses[steps] = (loss, stats["losses/entropy"])
    assert learner.hyperparameter("default_policy", "ent_coef") == pytest.approx(0.25)
    assert learner.hyperparameter("default_policy", "clip_coef") == pytest.approx(0.2)
    # the only term that depends on ent_coef: - ent_coef * entropy
    diff = losses[50][0] - losses[0][0]
    assert float(diff.detach()) == pytest.approx(0.25 * float(losses[0][1]), rel=1e-4)


def test_ppo_loss_clips_with_the_scheduled_clip_coefficient():
    from rlloop.algorithms.ppo import PPOLearner
    from rlloop.config.ppo import PPOConfig
    from rlloop.data.rollout import RolloutBatch
    from rlloop.envs.core import Discrete
    from rlloop.modules.actor_critic import ActorCritic

    g = torch.Generator().manual_seed(0)
    # An untrained policy gives each action about 0.5: these old log-probabilities make
    # every ratio about 1.25, clipped by 0.2 and not by 0.3.
    batch = RolloutBatch(torch.randn(32, 4, generator=g), torch.randint(2, (32,), generator=g),
                         torch.full((32,), math.log(0.5) - math.log(1.25)),
                         torch.randn(32, generator=g), torch.randn(32, generator=g),
                         torch.zeros(32))

    def loss_at(steps: int, clip_coef: object) -> float:
        cfg = PPOConfig(ent_coef=0.0, clip_coef=clip_coef)  # type: ignore[arg-type]
        torch.manual_seed(0)
        learner = PPOLearner({"default_policy": ActorCritic((4,), Discrete(2))}, cfg)
        learner.before_gradient_based_update(steps)
        return float(learner.compute_loss_for_module("default_policy", cfg, batch)[0].detach())

    scheduled = {"type": "piecewise", "points": [[0, 0.3], [100, 0.1]]}
    assert loss_at(0, scheduled) == loss_at(0, 0.3)
    assert loss_at(50, scheduled) == loss_at(50, 0.2)
    assert loss_at(50, 0.2) != loss_at(50, 0.3)


def test_ppo_config_takes_numbers_or_schedules_from_the_command_line():
    from rlloop.config.loading import build_config

    cfg = build_config("ppo", "CartPole-v1", sets=[
        "ppo.ent_coef={type: linear, start: 0.01, end: 0.0, steps: 1000}",
        "ppo.clip_coef=0.1"]).hparams
    assert cfg.ent_coef == {"type": "linear", "start": 0.01, "end": 0.0, "steps": 1000}
    assert cfg.clip_coef == 0.1
    with pytest.raises(ConfigError, match="unknown schedule type"):
        build_config("ppo", "CartPole-v1", sets=["ppo.ent_coef={type: zigzag}"])
    with pytest.raises(ConfigError, match="clip_coef must be > 0"):
        build_config("ppo", "CartPole-v1", sets=["ppo.clip_coef=0"])


# ---- gradient post-processing, end to end --------------------------------------------------
class TwoTensors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.u = nn.Parameter(torch.zeros(2))
        self.v = nn.Parameter(torch.zeros(1))


class Linear(Learner[XY]):
    """loss = u . [3, 4] + v * 12: gradients [3, 4] (norm 5) and [12] (norm 12), global 13."""

    def configure_optimizers_for_module(self, module_id, config):
        params = list(self.modules[module_id].parameters())
        self.register_optimizer(module_id, "default", torch.optim.SGD(params, lr=1.0), params,
                                1.0, config)

    def compute_loss_for_module(self, module_id, config, batch, fwd_out=None):
        m = self.modules[module_id]
        return m.u @ torch.tensor([3.0, 4.0]) + 12.0 * m.v.sum(), {}


@pytest.mark.parametrize(("clip", "u", "v"), [
    (GradientClip(None), [3.0, 4.0], [12.0]),
    (GradientClip(6.5, "global_norm"), [1.5, 2.0], [6.0]),  # scaled by 6.5 / 13
    (GradientClip(6.0, "norm"), [3.0, 4.0], [6.0]),  # per tensor: only v's norm 12 > 6
    (GradientClip(3.5, "value"), [3.0, 3.5], [3.5]),
])
def test_clipping_through_an_update_gives_the_expected_step(clip, u, v):
    learner = Linear({"m": TwoTensors()}, clip)
    out = learner.update_from_batch({"m": XY(torch.zeros(1, 1), torch.zeros(1))})
    # SGD with lr 1 from zero: the parameters are minus the post-processed gradients
    torch.testing.assert_close(learner.modules["m"].u.detach(), -torch.tensor(u))
    torch.testing.assert_close(learner.modules["m"].v.detach(), -torch.tensor(v))
    assert out["m/gradients_default_global_norm"] == pytest.approx(13.0)  # before clipping


def test_global_norm_logging_is_optional():
    learner = Linear({"m": TwoTensors()}, GradientClip(1.0, log_global_norm=False))
    out = learner.update_from_batch({"m": XY(torch.zeros(1, 1), torch.zeros(1))})
    assert not any("global_norm" in k for k in out)


# ---- modules -------------------------------------------------------------------------------
def test_policies_to_train_from_the_constructor_leaves_others_bit_identical():
    learner = _learner(("a", "b", "c"), policies_to_train=lambda m: m != "b")
    before = {k: v.clone() for k, v in learner.modules["b"].state_dict().items()}
    data = _data()
    out = learner.update_from_batch({"a": data, "b": data, "c": data}, num_epochs=3,
                                    minibatch_size=16)
    for k, v in learner.modules["b"].state_dict().items():
        assert torch.equal(v, before[k])
    assert learner.get_optimizer("b").state == {}  # no moment was ever created
    assert "b/losses/mse" not in out and "a/losses/mse" in out
    assert learner.get_state(components="should_module_be_updated") == {
        "should_module_be_updated": ["a", "c"]}
    with pytest.raises(LearnerError, match="list of module ids"):
        learner.set_policies_to_train("a")


def _names(node, prefix=""):
    """Every key path in a nested state."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{prefix}/{k}"
            yield from _names(v, f"{prefix}/{k}")


def test_add_then_remove_module_leaves_nothing_behind():
    learner = _learner(("a",), stats_prefix="always")
    learner.update_from_batch({"a": _data()})
    counts = learner.parameter_counts()
    state_keys = set(_names(learner.get_state(not_components="metrics_logger")))
    added = learner.add_module("b", lambda: nn.Linear(3, 1), config_overrides={"lr": 0.5})
    assert isinstance(added, nn.Linear)
    assert learner.get_optimizer("b").param_groups[0]["lr"] == 0.5
    assert learner.get_optimizer("a").param_groups[0]["lr"] == 0.1
    assert learner.config_for_module("b").lr == 0.5
    out = learner.update_from_batch({"a": _data(), "b": _data()}, env_steps=10)
    assert {"b/losses/mse", "b/lr_default", "b/temperature",
            "b/gradients_default_global_norm"} <= set(out)
    assert learner.metrics.peek("learner/params_trainable") == 2 * counts[
        "learner/params_trainable"]

    learner.remove_module("b")
    assert "b" not in learner.modules
    assert not any(m == "b" for m, _ in learner._optims)
    assert not any(m == "b" for m, _ in learner._hparams)
    assert "b" not in learner._module_configs
    logged = learner.metrics.keys()
    assert not any(k.startswith("b/") for k in logged)
    assert set(_names(learner.get_state(not_components="metrics_logger"))) == state_keys
    assert learner.parameter_counts() == counts
    assert learner.metrics.peek("learner/params_trainable") == counts["learner/params_trainable"]
    out = learner.update_from_batch({"a": _data()})
    assert not any(k.startswith("b/") for k in out)
    with pytest.raises(LearnerError, match="unknown module 'b'"):
        learner.get_optimizers_for_module("b")


def test_add_module_rejects_duplicates_and_non_modules():
    learner = _learner()
    with pytest.raises(LearnerError, match="exists already"):
        learner.add_module("a", nn.Linear(3, 1))
    with pytest.raises(LearnerError, match=r"not a torch nn\.Module"):
        learner.add_module("x", lambda: "not a module")
    with pytest.raises(LearnerError, match="bad config_overrides"):
        learner.add_module("y", nn.Linear(3, 1), config_overrides={"no_such_field": 1})
    assert set(learner.modules) == {"a"} and set(learner._optims) == {("a", "default")}


def test_register_optimizer_errors():
    learner = _learner()
    w = nn.Parameter(torch.zeros(1))
    with pytest.raises(LearnerError, match="unknown module 'zz'"):
        learner.register_optimizer("zz", "x", torch.optim.SGD([w], lr=1), [w], 1.0)
    with pytest.raises(LearnerError, match="list of tensors"):
        learner.register_optimizer("a", "x", torch.optim.SGD([w], lr=1), iter([w]), 1.0)
    with pytest.raises(LearnerError, match="exactly the tensors"):
        learner.register_optimizer("a", "x", torch.optim.SGD([w], lr=1),
                                   [nn.Parameter(torch.zeros(1))], 1.0)
    with pytest.raises(LearnerError, match="registered already"):
        learner.register_optimizer("a", "default", torch.optim.SGD([w], lr=1), [w], 1.0)
    with pytest.raises(LearnerError, match=r"no optimizer a/critic; registered: \['a/default'\]"):
        learner.get_optimizer("a", "critic")


# ---- metrics -------------------------------------------------------------------------------
def test_metrics_keys_flat_for_one_module_prefixed_for_several():
    single = _learner(("a",))
    out = single.update_from_batch({"a": _data()}, num_epochs=2, minibatch_size=16,
                                   env_steps=0)
    assert {"losses/mse", "losses/total", "learner/lr_default", "learner/temperature",
            "a/gradients_default_global_norm", "learner/minibatch_updates",
            "learner/weights_seq_no", "guard/skipped_updates", "learner/params_trainable",
            "learner/params_frozen", "learner/num_samples_trained",
            "learner/num_samples_trained_lifetime", "a/num_samples_trained_lifetime"} <= set(out)
    assert out["learner/num_samples_trained"] == 128
    out = single.update_from_batch({"a": _data()})
    assert out["learner/num_samples_trained"] == 64  # per update ...
    assert out["learner/num_samples_trained_lifetime"] == 192  # ... and over the lifetime
    assert "learner/num_samples_trained_lifetime_throughput" in out
    multi = _learner(("a", "b"))
    out = multi.update_from_batch({"a": _data(), "b": _data()}, env_steps=0)
    assert {"a/losses/mse", "b/losses/mse", "a/lr_default", "b/temperature"} <= set(out)


def test_parameter_counts_are_logged_and_track_frozen_modules():
    learner = _learner(("a",))
    frozen = nn.Linear(3, 1).requires_grad_(False)
    learner.add_module("snapshot", frozen)
    out = learner.update_from_batch({"a": _data()})
    assert out["learner/params_trainable"] == 4 and out["learner/params_frozen"] == 4


# ---- state ---------------------------------------------------------------------------------
def test_get_state_returns_exactly_the_components_asked_for():
    learner = _learner(("a", "b"))
    learner.update_from_batch({"a": _data(), "b": _data()}, env_steps=5)
    everything = set(STATE_COMPONENTS)
    assert set(learner.get_state()) == everything
    for r in range(1, len(STATE_COMPONENTS) + 1):
        for chosen in itertools.combinations(STATE_COMPONENTS, r):
            assert set(learner.get_state(components=list(chosen))) == set(chosen)
            assert set(learner.get_state(not_components=list(chosen))) == everything - set(
                chosen)
    assert set(learner.get_state(components=["module", "optimizer"],
                                 not_components="optimizer")) == {"module"}
    assert set(learner.get_state(components="module")["module"]) == {"a", "b"}
    with pytest.raises(LearnerError, match="unknown state components"):
        learner.get_state(not_components="modules")


def test_newer_weights_seq_no_wins():
    learner = _learner()
    for _ in range(3):
        learner.update_from_batch({"a": _data()})
    other = _learner()
    other.set_state(learner.get_state())
    assert other.weights_seq_no == 3
    other.update_from_batch({"a": _data()})
    other.set_state({"weights_seq_no": 2})  # stale: ignored
    assert other.weights_seq_no == 4


def test_state_round_trip_through_a_checkpoint_restores_optimizer_moments(tmp_path):
    learner = _learner(("a", "b"), Cfg(optim="adam", lr={"type": "linear", "start": 0.1,
                                                         "end": 0.0, "steps": 1000}))
    for steps in (0, 100, 200):
        learner.update_from_batch({"a": _data(seed=steps), "b": _data(seed=steps + 1)},
                                  num_epochs=2, minibatch_size=16, env_steps=steps)
    save_checkpoint(tmp_path / "ckpt", {"learner": learner.get_state()})
    loaded = load_checkpoint(tmp_path / "ckpt").components["learner"]

    other = _learner(("a", "b"), Cfg(optim="adam", lr={"type": "linear", "start": 0.1,
                                                       "end": 0.0, "steps": 1000}))
    other.set_state(loaded)
    for m in ("a", "b"):
        mine, theirs = learner.get_optimizer(m).state, other.get_optimizer(m).state
        assert len(mine) == 2
        for p, q in zip(learner.modules[m].parameters(), other.modules[m].parameters(),
                        strict=True):
            assert torch.equal(p, q)
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(mine[p][key], theirs[q][key]), key
    assert other.metrics.get_state() == learner.metrics.get_state()
    assert (other.env_steps, other.weights_seq_no) == (200, 3)
    # and both continue identically, schedules included
    for lrn in (learner, other):
        lrn.update_from_batch({"a": _data(seed=9), "b": _data(seed=10)}, env_steps=300)
    for p, q in zip(learner.modules.parameters(), other.modules.parameters(), strict=True):
        assert torch.equal(p, q)
