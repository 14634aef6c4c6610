"""A2C against Stable-Baselines3's on identical inputs, in float64.

One rollout collected by rlloop, its batch (observations, actions, advantages, returns)
handed to both libraries; both networks carry the same weights. SB3's own ``A2C.train``
(the real one: its loss, clipping and RMSprop) reads the batch from its rollout buffer;
rlloop's ``A2C.update`` makes its one gradient step. The losses, the clipped gradients and
the parameters after the step must agree to float64 rounding (Discrete and Box actions,
and gSDE), and a planted error in the loss must show.
"""

from __future__ import annotations

import pytest
import torch

from rlloop.algorithms import a2c as a2c_module
from rlloop.config.loading import build_config
from rlloop.data.rollout import RolloutBatch
from rlloop.losses.a2c import a2c_loss
from rlloop.runs.build import build_algorithm

sb3 = pytest.importorskip("stable_baselines3")
from stable_baselines3.common.logger import configure  # noqa: E402
from stable_baselines3.common.type_aliases import RolloutBufferSamples  # noqa: E402

#: rlloop's parameter -> SB3's (separate actor and critic MLPs, linear heads).
SB3_NAMES = {
    "actor.0": "mlp_extractor.policy_net.0",
    "actor.2": "mlp_extractor.policy_net.2",
    "actor.4": "action_net",
    "critic.0": "mlp_extractor.value_net.0",
    "critic.2": "mlp_extractor.value_net.2",
    "critic.4": "value_net",
}
ENT_COEF = 0.01


class _Buffer:
    """What ``A2C.train`` reads of SB3's rollout buffer: the whole batch, in float64."""

    def __init__(self, batch: RolloutBatch) -> None:
        self.batch = batch
        self.values = batch.values.numpy()
        self.returns = batch.returns.numpy()

    def get(self, batch_size=None):
        b = self.batch  # SB3 stores actions as floats (and casts Discrete ones back)
        yield RolloutBufferSamples(
            b.obs, b.actions.double(), b.values, b.log_probs, b.advantages, b.returns
        )


def _sb3_name(name: str) -> str:
    if name == "sde.log_std":  # gSDE's noise scales
        return "log_std"
    layer, _, kind = name.rpartition(".")
    return f"{SB3_NAMES[layer]}.{kind}" if layer in SB3_NAMES else name


@pytest.fixture(autouse=True)
def _sb3_in_float64(monkeypatch):
    """SB3 casts Box observations to float32 before its networks (all it does to them):
    kept float64 here, as its networks are."""
    from stable_baselines3.common import policies

    monkeypatch.setattr(policies, "preprocess_obs", lambda obs, space, **_: obs)


def _compare(
    env_id: str,
    normalize: bool,
    sde: bool = False,
    optimizer: str = "rmsprop",
    ent_coef: float = ENT_COEF,
) -> dict[str, float]:
    """The largest differences between SB3 and rlloop after one A2C step on one rollout:
    ``loss/<name>``, ``grad`` (clipped gradients) and ``param``."""
    config = build_config(
        "a2c",
        env_id,
        flags={"num_envs": 4, "seed": 3, "backend": "gymnasium"},
        sets=[
            "mlflow=false",
            "progress=false",
            f"a2c.ent_coef={ent_coef}",
            f"a2c.normalize_advantages={str(normalize).lower()}",
            # SB3's defaults, not the Pendulum preset's tuned ones
            f"a2c.use_sde={str(sde).lower()}",
            "a2c.normalize_obs=false",
            "a2c.normalize_rewards=false",
            "a2c.vf_coef=1.0",
            "a2c.lr=0.0007",
            "a2c.lr_schedule=constant",
            "a2c.max_grad_norm=0.5",
            f"a2c.optimizer={optimizer}",
        ],
    )
    algo = build_algorithm(config)
    try:
        algo.collect()
        batch = algo._batch()
        batch64 = RolloutBatch(
            *(
                t.double() if t.is_floating_point() else t
                for t in (
                    batch.obs,
                    batch.actions,
                    batch.log_probs,
                    batch.advantages,
                    batch.returns,
                    batch.values,
                )
            )
        )
        algo.policy.double()  # the optimiser holds the same tensors; it has no state yet
        model = sb3.A2C(
            "MlpPolicy",
            env_id,
            n_steps=5,
            ent_coef=ent_coef,
            vf_coef=0.5,
            normalize_advantage=normalize,
            use_sde=sde,
            use_rms_prop=optimizer == "rmsprop",  # else Adam, eps 1e-5 (SB3's policy default)
            device="cpu",
            seed=0,
        )
        model.policy.double()
        model.policy.load_state_dict(
            {_sb3_name(k): v.clone() for k, v in algo.policy.state_dict().items()}
        )
        model.rollout_buffer = _Buffer(batch64)
        model.set_logger(configure(None, []))
        model.train()
        logged = model.logger.name_to_value

        algo._batch = lambda: batch64  # type: ignore[method-assign]
        stats = algo.update(env_steps=20)
        ours = dict(algo.policy.named_parameters())
        theirs = dict(model.policy.named_parameters())
        diffs = {
            "loss/policy": abs(stats["losses/policy"] - logged["train/policy_loss"]),
            # SB3's value loss is mean (V - R)^2, rlloop's half of it
            "loss/value": abs(2 * stats["losses/value"] - logged["train/value_loss"]),
            "loss/entropy": abs(stats["losses/entropy"] + logged["train/entropy_loss"]),
            "grad": max(
                float((p.grad - theirs[_sb3_name(k)].grad).abs().max()) for k, p in ours.items()
            ),
            "param": max(float((p - theirs[_sb3_name(k)]).abs().max()) for k, p in ours.items()),
        }
        assert all(p.dtype == torch.float64 for p in ours.values())
        return diffs
    finally:
        algo.close()


@pytest.mark.parametrize(
    ("env_id", "normalize", "sde", "optimizer", "ent_coef"),
    [
        ("CartPole-v1", False, False, "rmsprop", ENT_COEF),
        ("Pendulum-v1", True, False, "rmsprop", ENT_COEF),
        ("Pendulum-v1", False, True, "rmsprop", ENT_COEF),
        ("CartPole-v1", False, False, "adam", ENT_COEF),
        ("CartPole-v1", False, False, "rmsprop", 0.0),  # rl-zoo's: no entropy term at all
    ],
)
def test_one_update_equals_stable_baselines3(env_id, normalize, sde, optimizer, ent_coef):
    diffs = _compare(env_id, normalize, sde, optimizer, ent_coef)
    assert max(diffs.values()) < 1e-10, diffs


@pytest.mark.parametrize(
    "planted",
    ["entropy bonus with its sign flipped", "value weight in SB3's units (half of rlloop's)"],
)
def test_a_wrong_coefficient_in_the_loss_is_caught(monkeypatch, planted):
    """The check can fail: either error moves the gradients past its 1e-10."""

    def wrong(*args):
        *head, vf_coef, ent_coef, normalize = args
        if planted.startswith("entropy"):
            return a2c_loss(*head, vf_coef, -ent_coef, normalize)
        return a2c_loss(*head, vf_coef / 2, ent_coef, normalize)

    monkeypatch.setattr(a2c_module, "a2c_loss", wrong)
    diffs = _compare("CartPole-v1", False)
    assert diffs["grad"] > 1e-8, diffs


def test_the_loss_is_the_policy_gradient_plus_weighted_value_and_entropy_terms():
    """By hand, on four samples: standardised advantages when asked, 1/2 on the value term."""
    log_prob = torch.tensor([-0.5, -1.0, -0.2, -2.0], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    values = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    returns = torch.tensor([1.0, 1.0, 0.0, 5.0], dtype=torch.float64)
    entropy = torch.tensor([0.6, 0.7, 0.5, 0.2], dtype=torch.float64)
    loss, stats = a2c_loss(log_prob, adv, values, returns, entropy, 0.5, 0.01)
    policy = -float((adv * log_prob).mean())
    value = 0.5 * float(((values - returns) ** 2).mean())
    assert float(stats["losses/policy"]) == pytest.approx(policy, abs=1e-15)
    assert float(stats["losses/value"]) == pytest.approx(value, abs=1e-15)
    assert float(loss) == pytest.approx(policy + 0.5 * value - 0.01 * 0.5, abs=1e-15)
    std = (adv - adv.mean()) / (adv.std() + 1e-8)
    _, normalized = a2c_loss(log_prob, adv, values, returns, entropy, 0.5, 0.01, True)
    assert float(normalized["losses/policy"]) == pytest.approx(
        -float((std * log_prob).mean()), abs=1e-15
    )


def test_without_an_entropy_bonus_the_entropy_is_not_differentiated():
    """ent_coef=0 leaves the entropy out of the loss: the same loss and gradients to the
    bit as with its zero term in, and no gradient reaches the entropy."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3, generator=g, requires_grad=True)
    values = torch.randn(6, generator=g, requires_grad=True)
    adv, returns = torch.randn(6, generator=g), torch.randn(6, generator=g)
    actions = torch.tensor([0, 1, 2, 0, 1, 2])

    def step(with_zero_term: bool):
        log_probs = torch.log_softmax(logits, -1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        reached = []
        entropy.register_hook(reached.append)
        log_prob = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        loss, stats = a2c_loss(log_prob, adv, values, returns, entropy, 0.5, 0.0)
        if with_zero_term:
            loss = loss - 0.0 * entropy.mean()
        grads = torch.autograd.grad(loss, (logits, values))
        return loss.detach(), grads, stats["losses/entropy"], len(reached)

    loss, grads, entropy, reached = step(False)
    loss_with, grads_with, entropy_with, reached_with = step(True)
    assert (reached, reached_with) == (0, 1)
    assert torch.equal(loss, loss_with) and torch.equal(entropy, entropy_with)
    for a, b in zip(grads, grads_with, strict=True):
        assert torch.equal(a, b)
